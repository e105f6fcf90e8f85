"""The settings one component receives, in place of the run's whole configuration.

Each algorithm and client optimiser is made from a small frozen record of what it
reads of a run: the core keys it names as fields (``alpha: float``, ``tau: int``) and
`section`, its own section's values (the settings it declares, defaults filled in).
Its constructor's type so says what it depends on, and nothing else of the run
reaches it, as FedJAX passes optimisers and hyper-parameters to an algorithm as
arguments and pfl-research gives each algorithm its own hyper-parameter object. A
component that reads more core keys subclasses its base's record:

    class Mine(Algorithm):
        @dataclass(frozen=True, kw_only=True)
        class HParams(Algorithm.HParams):
            batch_size: int  # a core key: read from the run by name
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from perfed_ray.config.schema import CORE, RunConfig


@dataclass(frozen=True, kw_only=True)
class HParams:
    """What one component reads of a run. `key` is the configuration key that names
    the component (``algorithm``), whose section `section` holds."""

    key: ClassVar[str]
    section: dict[str, Any]

    @classmethod
    def of(cls, cfg: RunConfig, **made: Any) -> Self:
        """Read from a run's configuration: each field named after a core key, or after
        a count the configuration derives (`users_per_round`, `unseen_count`: its
        properties, rounded as its checks round them), takes that value; `made` gives
        the others (components made for this one, such as an algorithm's client
        optimiser)."""
        read = {
            f.name: getattr(cfg, f.name)
            for f in dataclasses.fields(cls)
            if f.name in CORE or isinstance(getattr(RunConfig, f.name, None), property)
        }
        return cls(section=cfg.settings_of(cls.key), **read, **made)

    @classmethod
    def given(cls, given: Self | RunConfig) -> Self:
        """What a component's constructor was given, as its record: a run's
        configuration is read for it (and not kept), so ``Cls(cfg)`` makes a component
        for a run as ``Cls(Cls.HParams.of(cfg))`` does."""
        return cls.of(given) if isinstance(given, RunConfig) else given
