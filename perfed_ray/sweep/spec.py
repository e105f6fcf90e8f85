"""A sweep file: which configurations a sweep runs, and what each of its trials reserves.

    name: table1                    # default: the file's name
    base: ../configs/table1/mnist-tau10-alpha0.01.yaml   # or a list: one more axis
    config: {rounds: 1000}          # on top of base, for every trial
    grid:                           # every combination; a list of grids is their union
      - {algorithm: [fedavg, perfedavg-fo, perfedavg-hf, perfedavg]}
      - {algorithm: [fedavg], adapt_on: [test]}
    sample:                         # `samples` points, the same for every grid point
      samples: 8
      method: random                # or quasi-random (scrambled Sobol)
      seed: 0
      loguniform: {beta: [0.0001, 0.01]}
      uniform: {alpha: [0.001, 0.05]}
      choice: {batch_size: [20, 40]}
    seeds: 3                        # seeds 0, 1, 2 (or a list): one more axis
    resources: {driver_cpus: 0.5, cpus: 1, gpus: 0}
    early_stopping: {grace_rounds: 100, reduction_factor: 4}
    search: {per: [algorithm]}
    retries: 2

Everything is expanded and validated here, before Ray starts: every trial's whole
configuration (each problem a ConfigError naming the file, the section and the key),
the sampled points (drawn from `sample.seed`, so the same file always gives the same
trials), and each trial's placement group. The trials are numbered in the order
base, grid, sample, seed; trial i's run is ``<name>-<i:04d>``.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from perfed_ray import config as configuration
from perfed_ray import yamlfile
from perfed_ray.config import CORE, RunConfig, base_type, flatten, legacy_keys
from perfed_ray.errors import ConfigError, did_you_mean
from perfed_ray.results.layout import SAFE_ID
from perfed_ray.runtime.placement import bundles, plan

SECTIONS = (
    "name",
    "base",
    "config",
    "grid",
    "sample",
    "seeds",
    "resources",
    "early_stopping",
    "search",
    "retries",
)
RANGES = ("uniform", "loguniform")
METHODS = ("random", "quasi-random")
MAX_TRIALS = 10_000  # each trial is validated here (about a millisecond) and run by Tune


@dataclass(frozen=True)
class Resources:
    """What each trial reserves, as one placement group: its driver's CPUs, on the node
    that runs `perfed-ray sweep` (where the results are written), and its actors' CPUs
    and GPUs together, which `users_per_actor: auto` fills with actors as a cluster of
    that size would. Trials run side by side while the cluster has room for them."""

    driver_cpus: float = 0.5
    cpus: float = 1.0
    gpus: float = 0.0

    def bundles(self, cfg: RunConfig) -> list[dict[str, float]]:
        """The trial's placement group: the driver's bundle, then one per actor."""
        actors = plan(cfg, [{"CPU": self.cpus, "GPU": self.gpus}])
        return [{"CPU": self.driver_cpus} if self.driver_cpus else {}, *bundles(actors)]


@dataclass(frozen=True)
class EarlyStopping:
    """ASHA (Li et al. 2020) on the personalised accuracy of the evaluation at rounds
    grace_rounds, grace_rounds * reduction_factor, ...: a trial below the top
    1 / reduction_factor of those that reached the same round is stopped."""

    grace_rounds: int
    reduction_factor: int = 4


@dataclass(frozen=True)
class Sweep:
    """A sweep's trials (whole validated configurations, in order) and how they run."""

    name: str
    trials: tuple[RunConfig, ...]
    resources: Resources = Resources()
    early_stopping: EarlyStopping | None = None
    search: tuple[str, ...] | None = None  # pick the best step sizes per these keys
    retries: int = 2  # restarts of a trial whose driver failed, from its checkpoint

    @functools.cached_property
    def varied(self) -> list[str]:
        """The configuration keys whose values differ between trials."""
        values = [t.to_dict() for t in self.trials]
        keys = dict.fromkeys(k for v in values for k in v)
        return [k for k in keys if len({v.get(k) for v in values}) > 1]

    def run_id(self, index: int) -> str:
        """Trial `index`'s run id: the same whenever the sweep runs or resumes."""
        return f"{self.name}-{index:04d}"

    def privacy_note(self) -> str | None:
        """What the epsilon each private trial reports does not cover, for the sweep's
        summary: each trial spends it in full on the same users, and choosing among
        them on their validation accuracy uses them all; None without privacy."""
        private = sum(t.privacy != "none" for t in self.trials)
        if not private:
            return None
        chosen = " and the best is chosen on their validation accuracy" if self.search else ""
        return (
            f"privacy: each trial's epsilon is its own run's alone. {private} trials each "
            f"spend their full budget on the same users{chosen}: the sweep as a whole is "
            f"not accounted (the trials' epsilons add up under composition, and "
            f"releasing the chosen one is private only if the choice is too)"
        )

    def describe(self, index: int) -> str:
        """Trial `index` in one line: its run id and the values that vary."""
        trial = self.trials[index]
        return " ".join([self.run_id(index), *(f"{k}={getattr(trial, k)}" for k in self.varied)])

    def to_dict(self) -> dict[str, Any]:
        """The sweep as plain data, stored beside Tune's state for `--resume`."""
        return {
            "name": self.name,
            "trials": [t.to_dict() for t in self.trials],
            "resources": dataclasses.asdict(self.resources),
            "early_stopping": self.early_stopping and dataclasses.asdict(self.early_stopping),
            "search": self.search and list(self.search),
            "retries": self.retries,
        }

    @staticmethod
    def from_dict(values: Mapping[str, Any]) -> Sweep:
        stopping = values["early_stopping"]
        return Sweep(
            values["name"],
            tuple(configuration.from_mapping(t) for t in values["trials"]),
            Resources(**values["resources"]),
            EarlyStopping(**stopping) if stopping else None,
            tuple(values["search"]) if values["search"] else None,
            values["retries"],
        )


class _File:
    """The sweep file being read, so that every error names it and the section."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def error(self, section: str, message: str) -> ConfigError:
        return ConfigError(f"sweep {self.path}: {section}: {message}")

    def mapping(self, section: str, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(section, f"must be a mapping of key: value, not {value!r}")
        return value

    def keys(self, section: str, values: Iterable[str]) -> None:
        """Every key must be a configuration key: a core one, a component's setting
        (dotted: checked with the trial's components), or an older name of one."""
        for key in values:
            if key not in CORE and "." not in str(key) and key not in legacy_keys():
                raise self.error(
                    section,
                    f"unknown configuration key {key!r}{did_you_mean(key, CORE)}; see "
                    f"`perfed-ray keys`",
                )

    def number(self, section: str, key: str, value: Any, low: float, open_: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.error(section, f"{key} = {value!r} is not a number")
        if value < low or (open_ and value == low):
            raise self.error(section, f"{key} = {value!r} must be {'>' if open_ else '>='} {low:g}")
        return value

    def integer(self, section: str, key: str, value: Any, low: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.error(section, f"{key} = {value!r} must be an integer >= {low}")
        return value


def load(
    path: str | Path,
    overrides: Iterable[str] = (),
    resources: Iterable[str] = (),
) -> Sweep:
    """Read and expand a sweep file; `overrides` (`key=value`, as `--set`) apply to every
    trial, `resources` (`key=value`) replace keys of its `resources:` section."""
    path = Path(path)
    file = _File(path)
    doc = file.mapping("sweep file", yamlfile.read(path, "sweep file"))
    for section in doc:
        if section not in SECTIONS:
            hint = did_you_mean(section, SECTIONS)
            raise file.error(section, f"unknown section{hint}; sections: {', '.join(SECTIONS)}")
    name = str(doc.get("name", path.stem))
    if not SAFE_ID.fullmatch(name):
        raise file.error("name", f"{name!r} may hold letters, digits, '-' and '_' only")
    trials = _trials(file, doc, configuration.parse_overrides(overrides))
    sweep = Sweep(
        name,
        trials,
        _resources(file, doc.get("resources"), configuration.parse_overrides(resources)),
        _early_stopping(file, doc.get("early_stopping"), trials),
        None,
        file.integer("retries", "retries", doc.get("retries", 2), 0),
    )
    _reserved(file, sweep)
    return dataclasses.replace(sweep, search=_search(file, doc.get("search"), sweep))


def _reserved(file: _File, sweep: Sweep) -> None:
    """Each trial's actor fits in what the trial reserves for all of its actors: else
    the trial's placement group asks for more than `resources` says it reserves."""
    reserve = {"CPU": sweep.resources.cpus, "GPU": sweep.resources.gpus}
    for i, trial in enumerate(sweep.trials):
        _, *actors = sweep.resources.bundles(trial)
        for key, have in reserve.items():
            asked = max((actor.get(key, 0.0) for actor in actors), default=0.0)
            if asked > have:
                name = key.lower() + "s"
                raise file.error(
                    f"trial {sweep.run_id(i)}",
                    f"each actor asks for {asked:g} {key} (num_{name}_per_actor), more than "
                    f"the trial reserves for all its actors (resources: {name} = {have:g}): "
                    f"raise resources {name} (--resources {name}={asked:g}) or lower "
                    f"num_{name}_per_actor",
                )


def _at_most(file: _File, section: str, what: str, trials: int) -> None:
    """A sweep is expanded and checked trial by trial before Ray starts, and each trial
    is a whole run with its actors: refuse at once a sweep larger than MAX_TRIALS."""
    if trials > MAX_TRIALS:
        raise file.error(
            section,
            f"{what} give {trials} trials; a sweep runs at most {MAX_TRIALS}: vary fewer "
            f"values, or split it into several sweeps",
        )


def _bases(file: _File, base: Any) -> list[dict[str, Any]]:
    """The base configurations (files relative to the sweep file), or the defaults."""
    if base is None:
        return [{}]
    paths = base if isinstance(base, list) else [base]
    out = []
    for name in paths:
        if not isinstance(name, str):
            raise file.error("base", f"{name!r} is not a configuration file's path")
        where = file.path.parent / name
        try:
            out.append(configuration.load(where).to_dict())
        except ConfigError as err:
            raise file.error("base", str(err)) from None
    return out


def _grid(file: _File, grid: Any) -> list[dict[str, Any]]:
    """Every point of the grid (a mapping of key: [values], or a list of them, whose
    points are joined in order)."""
    if grid is None:
        return [{}]
    points = []
    for part in grid if isinstance(grid, list) else [grid]:
        part = flatten(file.mapping("grid", part))
        file.keys("grid", part)
        for key, values in part.items():
            if not isinstance(values, list) or not values:
                raise file.error("grid", f"{key} must be a non-empty list of values")
        _at_most(file, "grid", "its values", math.prod(len(v) for v in part.values()))
        points += [
            dict(zip(part, combo, strict=True)) for combo in itertools.product(*part.values())
        ]
    return points


def _samples(file: _File, sample: Any) -> list[dict[str, Any]]:
    """`samples` points drawn from the ranges and choices, from `seed`: uniformly at
    random, or quasi-randomly (a scrambled Sobol sequence, which covers the ranges more
    evenly for few samples). Integer keys are rounded."""
    sample = file.mapping("sample", sample)
    if not sample:
        return [{}]
    known = {"samples", "method", "seed", *RANGES, "choice"}
    for key in sample:
        if key not in known:
            raise file.error(
                "sample", f"unknown entry {key!r}; entries: {', '.join(sorted(known))}"
            )
    n = file.integer("sample", "samples", sample.get("samples"), 1)
    _at_most(file, "sample", f"samples = {n}", n)
    method = sample.get("method", "random")
    if method not in METHODS:
        raise file.error("sample", f"method = {method!r} is not one of {', '.join(METHODS)}")
    seed = file.integer("sample", "seed", sample.get("seed", 0), 0)
    axes: list[tuple[str, str, list[Any]]] = []
    for kind in (*RANGES, "choice"):
        section = file.mapping(f"sample: {kind}", sample.get(kind))
        file.keys(f"sample: {kind}", section)
        for key, spec in section.items():
            axes.append((key, kind, _axis(file, kind, key, spec)))
    if not axes:
        raise file.error("sample", "names no key to sample (uniform, loguniform or choice)")
    names = [key for key, _, _ in axes]
    if len(set(names)) < len(names):
        raise file.error("sample", "a key is sampled twice")
    if method == "random":
        u = np.random.default_rng(seed).random((n, len(axes)))
    else:
        from torch.quasirandom import SobolEngine

        u = SobolEngine(len(axes), scramble=True, seed=seed).draw(n).double().numpy()
    points = []
    for row in u:
        point = {}
        for (key, kind, spec), x in zip(axes, row, strict=True):
            if kind == "choice":
                value = spec[min(int(x * len(spec)), len(spec) - 1)]
            else:
                lo, hi = (math.log(v) for v in spec) if kind == "loguniform" else spec
                value = lo + float(x) * (hi - lo)
                value = math.exp(value) if kind == "loguniform" else value
                value = round(value) if base_type(key) is int else value
            point[key] = value
        points.append(point)
    return points


def _axis(file: _File, kind: str, key: str, spec: Any) -> list[Any]:
    section = f"sample: {kind}"
    if kind == "choice":
        if not isinstance(spec, list) or not spec:
            raise file.error(section, f"{key} must be a non-empty list of values")
        return spec
    if base_type(key) not in (int, float):
        raise file.error(section, f"{key} is not a number: sample it with choice")
    if not isinstance(spec, list) or len(spec) != 2:
        raise file.error(section, f"{key} must be [low, high]")
    lo, hi = (file.number(section, key, v, 0.0, open_=kind == "loguniform") for v in spec)
    if not lo < hi:
        raise file.error(section, f"{key} = [{lo}, {hi}] is empty: low must be below high")
    return [lo, hi]


def _seeds(file: _File, seeds: Any) -> list[dict[str, Any]]:
    if seeds is None:
        return [{}]
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        values = list(range(file.integer("seeds", "seeds", seeds, 1)))
    elif isinstance(seeds, list) and seeds:
        values = [file.integer("seeds", "seed", s, 0) for s in seeds]
    else:
        raise file.error("seeds", f"{seeds!r} is neither a count nor a list of seeds")
    return [{"seed": s} for s in values]


def _trials(file: _File, doc: dict[str, Any], overrides: dict[str, Any]) -> tuple[RunConfig, ...]:
    """Every trial's validated configuration: base < config < grid, sample, seeds <
    overrides. A key may be varied by one axis only, and fixed keys may not be varied."""
    common = flatten(file.mapping("config", doc.get("config")))
    file.keys("config", common)
    file.keys("--set", overrides)
    axes = [
        _grid(file, doc.get("grid")),
        _samples(file, doc.get("sample")),
        _seeds(file, doc.get("seeds")),
    ]
    by_axis = [{k for point in axis for k in point} for axis in axes]
    for (i, a), (j, b) in itertools.combinations(enumerate(by_axis), 2):
        if a & b:
            names = ("grid", "sample", "seeds")
            raise file.error(names[j], f"{sorted(a & b)[0]} is also varied by {names[i]}")
    varied = set().union(*by_axis)
    for section, fixed in (("config", common), ("--set", overrides)):
        if varied & set(fixed):
            key = sorted(varied & set(fixed))[0]
            raise file.error(section, f"{key} is varied by the sweep: it cannot be fixed too")
    bases = _bases(file, doc.get("base"))
    _at_most(file, "trials", "base, grid, sample and seeds", math.prod(map(len, [bases, *axes])))
    trials = []
    for base, *points in itertools.product(bases, *axes):
        values = {**base, **common, **{k: v for p in points for k, v in p.items()}, **overrides}
        try:
            trials.append(configuration.from_mapping(values))
        except ConfigError as err:
            shown = ", ".join(f"{k}={v}" for p in points for k, v in p.items()) or "every trial"
            raise file.error("trial " + shown, str(err)) from None
    seen: dict[RunConfig, int] = {}
    for i, trial in enumerate(trials):
        if trial in seen:
            raise file.error("grid", f"trials {seen[trial]} and {i} are the same configuration")
        seen[trial] = i
    return tuple(trials)


def _resources(file: _File, section: Any, overrides: dict[str, Any]) -> Resources:
    values = {**file.mapping("resources", section), **overrides}
    known = [f.name for f in dataclasses.fields(Resources)]
    for key, value in values.items():
        if key not in known:
            raise file.error("resources", f"unknown entry {key!r}; entries: {', '.join(known)}")
        file.number("resources", key, value, 0.0, open_=key == "cpus")
    return Resources(**values)


def _early_stopping(
    file: _File, section: Any, trials: tuple[RunConfig, ...]
) -> EarlyStopping | None:
    """ASHA judges a trial at rounds grace, grace * factor, ...; they must be evaluation
    rounds of every trial, so it compares accuracies of that very round."""
    if section is None:
        return None
    values = file.mapping("early_stopping", section)
    known = [f.name for f in dataclasses.fields(EarlyStopping)]
    for key in values:
        if key not in known:
            raise file.error(
                "early_stopping", f"unknown entry {key!r}; entries: {', '.join(known)}"
            )
    grace = file.integer("early_stopping", "grace_rounds", values.get("grace_rounds"), 1)
    factor = file.integer(
        "early_stopping", "reduction_factor", values.get("reduction_factor", 4), 2
    )
    for trial in trials:
        if grace % trial.eval_every:
            raise file.error(
                "early_stopping",
                f"grace_rounds = {grace} is not a multiple of eval_every = {trial.eval_every}: "
                f"trials are judged on the evaluations at rounds grace_rounds * "
                f"reduction_factor^k",
            )
    return EarlyStopping(grace, factor)


def _search(file: _File, section: Any, sweep: Sweep) -> tuple[str, ...] | None:
    """Pick the best values of the varied keys per value of `per` (e.g. per algorithm),
    by the mean over seeds of the final validation accuracy; never on test shards."""
    if section is None:
        return None
    values = file.mapping("search", section)
    if set(values) != {"per"}:
        raise file.error("search", "takes one entry, per: the keys to pick values per")
    per = values["per"] if isinstance(values["per"], list) else [values["per"]]
    file.keys("search: per", per)
    if not all(t.validation for t in sweep.trials):
        raise file.error(
            "search",
            "picks values by validation accuracy, never by test accuracy: set validation "
            "(e.g. 0.2, a share of each user's training samples) in config",
        )
    if not set(sweep.varied) - {*per, "seed"}:
        raise file.error(
            "search", "nothing to pick: the sweep varies only the keys of per and seed"
        )
    return tuple(per)
