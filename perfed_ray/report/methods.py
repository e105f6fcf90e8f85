"""How every report names a run's method: its algorithm, followed in parentheses by
its own knobs where they differ from their defaults (HF's `delta` and `hf_delta`, the
algorithm's own section, its local work, who trains and how users are drawn, its
optimisers) and by the shared protocol's keys a report asks for. `perfed-ray
report`'s Table 1 and `perfed-ray compare` call runs by the same names, so one run
reads the same in both.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from perfed_ray.config.schema import CORE, spec
from perfed_ray.config.sections import section_name
from perfed_ray.registry import SECTIONED

# How a method is trained, besides its own section's settings: part of the method's
# label, not of the setting's, so one method run by the Per-FedAvg protocol and by its
# authors' sits in the same table as the others.
METHOD_KEYS = {
    "delta",
    "hf_delta",
    "local_epochs",
    "trained_users",
    "sampling",
    *SECTIONED,
}


def is_method_key(key: str) -> bool:
    """Whether a configuration key describes the method (a section's keys are dotted)."""
    return "." in key or key in METHOD_KEYS


def value_text(value: object) -> object:
    """A value as written in a configuration: a whole number read back as a float (the
    column of a key most runs leave unset holds NaN) without its ".0"."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def method_label(run: pd.Series, protocol: Iterable[str] = ()) -> str:
    """The method of `run` (a row of the runs table): its algorithm, its own knobs that
    differ from the defaults, and its values of the `protocol` keys named (those in
    which it differs from the rest of its table)."""
    sections = {section_name(run[k], k) for k in SECTIONED if k in run and isinstance(run[k], str)}
    own = [f"{k}={value_text(run[k])}" for k in protocol]
    own += [
        f"{k}={value_text(run[k])}"
        for k in run.index
        if is_method_key(k) and k not in SECTIONED and not pd.isna(run[k])
        if k in CORE or k.partition(".")[0] in sections
        if run[k] != spec(k).default
        if not (k in {"delta", "hf_delta"} and run["algorithm"] != "perfedavg-hf")
    ]
    optimisers = [k for k in SECTIONED if k != "algorithm" and k in run]
    own += [f"{k}={value_text(run[k])}" for k in optimisers if run[k] != CORE[k].default]
    return run["algorithm"] + (f" ({', '.join(own)})" if own else "")
