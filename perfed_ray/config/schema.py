"""Run configuration: one flat, typed record of every choice a run makes.

The defaults are the paper's (Fallah et al. 2020, Section 5) and `PROTOCOL.md`'s.
Every field is stored with every result row, so the schema here is also the column
contract of the Parquet tables. Each core key is declared once, as a field with its
type, default and bounds; its meaning is in :mod:`perfed_ray.config.meanings`, and
both become the key's :class:`~perfed_ray.config.settings.Setting` in `CORE`, which
validation, `perfed-ray keys`, the docs and the writer's column types all read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from perfed_ray.config.meanings import MEANINGS
from perfed_ray.config.sections import declared, registered_sections, section_name
from perfed_ray.config.settings import KINDS, Setting

DATA_TRANSPORTS = ("object_store", "data_root")
ADAPT_ON = ("train", "test")
INPUT_SCALES = ("unit", "standardize", "standardize-pixel", "imagenet", "raw")
AUGMENTATIONS = ("none", "crop-flip")
HF_DELTAS = ("fixed", "normalized")
AGGREGATIONS = ("mean", "samples")
TRAINED_USERS = ("sampled", "all")
SAMPLINGS = ("uniform", "samples", "poisson")
MAX_USERS = 10**8  # the driver holds arrays of every user's id: 10^8 is about a GB
MAX_BATCH = 10**6  # samples of one batch, a memory bound on the actors, not a data bound


def _key(default: Any, **facts: Any) -> Any:
    """A core key: its default and what it allows (a :class:`Setting`'s facts; the
    type is the field's annotation, the meaning is `MEANINGS`')."""
    return field(default=default, metadata={"facts": facts})


@dataclass(frozen=True)
class RunConfig:
    """Every configuration value of one run (flat, so it maps to YAML and to columns)."""

    dataset: str = _key("mnist", registry=True)
    data_root: str | None = _key(None, auto=True)
    data_folder: str = _key("")
    download: bool = _key(True)
    data_transport: str = _key("object_store", choices=DATA_TRANSPORTS)
    partition: str = _key("paper", registry=True)
    paper_a: int | None = _key(None, low=1, auto=True)
    input_scale: str = _key("unit", choices=INPUT_SCALES)
    augment: str = _key("none", choices=AUGMENTATIONS)
    synthetic_alpha: float = _key(1.0, low=0)
    synthetic_beta: float = _key(1.0, low=0)
    dirichlet_alpha: float = _key(0.5, low=0, low_open=True)
    labels_per_user: int = _key(2, low=1)
    n_users: int = _key(50, low=1, high=MAX_USERS)
    fraction: float = _key(0.2, low=0, high=1, low_open=True)
    tau: int = _key(10, low=1)
    local_epochs: int | None = _key(None, low=1, auto=True, word="off")
    rounds: int = _key(1000, low=1)
    alpha: float = _key(0.01, low=0)
    beta: float = _key(0.001, low=0, low_open=True)
    batch_size: int = _key(40, low=1, high=MAX_BATCH)
    delta: float = _key(0.001, low=0, low_open=True)
    hf_delta: str = _key("fixed", choices=HF_DELTAS)
    algorithm: str = _key("perfedavg-hf", registry=True)
    model: str = _key("mlp", registry=True)
    seed: int = _key(0, low=0)
    eval_every: int = _key(20, low=1)
    eval_from: int = _key(0, low=0)
    eval_users: float | None = _key(None, low=0, low_open=True, auto=True, word="all")
    shard_cache_mb: float | None = _key(512.0, low=0, low_open=True, auto=True, word="all")
    sample_final_eval: bool = _key(False)
    final_eval_draws: int = _key(10, low=1)
    personalise_steps: int = _key(1, low=1)
    unseen_users: float = _key(0.0, low=0, high=0.9)
    validation: float = _key(0.0, low=0, high=0.5)
    adapt_on: str = _key("train", choices=ADAPT_ON)
    users_per_actor: int | None = _key(None, low=1, auto=True)
    engine: str | None = _key(None, registry=True, auto=True)
    balance_rounds: bool | None = _key(None, auto=True)
    compile: bool | None = _key(None, auto=True)
    trained_users: str = _key("sampled", choices=TRAINED_USERS)
    sampling: str = _key("uniform", choices=SAMPLINGS)
    client_optimizer: str = _key("sgd", registry=True)
    server_optimizer: str = _key("mean", registry=True)
    strategy: str = _key("uniform", registry=True)
    aggregation: str = _key("mean", choices=AGGREGATIONS)
    privacy: str = _key("none", registry=True)
    devices: str = _key("equal", registry=True)
    availability: str = _key("always", registry=True)
    num_cpus_per_actor: float | None = _key(None, low=0, low_open=True, auto=True)
    num_gpus_per_actor: float | None = _key(None, low=0, auto=True)
    checkpoint_every: int = _key(20, low=1)
    actor_retries: int = _key(3, low=0)
    dropout: float = _key(0.0, low=0, high=1)
    stragglers: float = _key(0.0, low=0, high=1)
    overcommit: float = _key(1.0, low=1)
    deadline: float | None = _key(None, low=0, low_open=True, auto=True, word="off")
    tag: str = _key("")
    report_to: str = _key("", registry=True, many=True)
    report_every: int = _key(1, low=1)
    tensorboard_dir: str | None = _key(None, auto=True)
    settings: tuple[tuple[str, Any], ...] = ()  # components' settings: (dotted key, value)

    @property
    def trackers(self) -> list[str]:
        """The trackers `report_to` names, in its order (none: [])."""
        return [name for name in self.report_to.split(",") if name]

    @property
    def unseen_count(self) -> int:
        """How many users are never trained (`unseen_users`)."""
        return round(self.unseen_users * self.n_users)

    @property
    def users_per_evaluation(self) -> int:
        """How many users an intermediate evaluation scores (`eval_users`)."""
        if self.eval_users is None:
            return self.n_users
        if self.eval_users >= 1:
            return int(self.eval_users)
        return max(1, round(self.eval_users * self.n_users))

    @property
    def steps_vary(self) -> bool:
        """Whether a round's users take their own numbers of local steps: with
        `local_epochs` each passes over its own shard, with `tau` all take tau. Where
        they vary, engines are handed each user's count and mask the steps past it."""
        return self.local_epochs is not None

    @property
    def users_per_round(self) -> int:
        """m = round(r n), the number of users sampled each round (r n >= 1 is checked)."""
        return round(self.fraction * self.n_users)

    def section(self, name: str) -> dict[str, Any]:
        """The settings of the component whose section is `name` (its defaults where
        the configuration left them), e.g. ``cfg.section("fedrep")["head_epochs"]``."""
        prefix = name + "."
        return {k[len(prefix) :]: v for k, v in self.settings if k.startswith(prefix)}

    def settings_of(self, key: str) -> dict[str, Any]:
        """The settings of the component that core key `key` names (``algorithm``)."""
        return self.section(section_name(getattr(self, key), key))

    def to_dict(self) -> dict[str, Any]:
        """Every value as a flat mapping: core keys, then components' settings under
        dotted keys (``fedrep.head_epochs``), as YAML and the Parquet columns have them."""
        core = {name: getattr(self, name) for name in FIELDS}
        return core | dict(self.settings)


def _core(f: dataclasses.Field) -> Setting:
    """A core field's Setting, typed by the field's annotation (`int | None` -> int)."""
    kind = KINDS[str(f.type).split("|")[0].strip()]
    return Setting(f.default, MEANINGS[f.name], kind=kind, **f.metadata["facts"])


FIELDS: dict[str, dataclasses.Field] = {
    f.name: f for f in dataclasses.fields(RunConfig) if "facts" in f.metadata
}
CORE: dict[str, Setting] = {name: _core(f) for name, f in FIELDS.items()}


def spec(key: str, sections: dict[str, tuple[str, str]] | None = None) -> Setting:
    """The Setting of a core key or of a dotted component key; KeyError if none."""
    if key in CORE:
        return CORE[key]
    section, _, name = key.partition(".")
    registry_key, component = (sections or registered_sections())[section]
    return declared(registry_key, component)[name]


def base_type(key: str) -> type:
    """The type of a key's values (core or a component's)."""
    return spec(key).type
