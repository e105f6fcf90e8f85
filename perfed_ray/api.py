"""The Python API: `perfed_ray.simulate(...)` runs one simulation exactly as
`perfed-ray run` does (same validation, same tables, same checkpoints), for notebooks,
scripts and sweeps; the command line is a thin layer over it.

    import perfed_ray
    result = perfed_ray.simulate("experiments/configs/table1/mnist-tau10-alpha0.01.yaml",
                                 out="results", rounds=50, algorithm="fedavg")
    result.table("evals").groupby("round")["acc_after"].mean()

Bad input raises :class:`~perfed_ray.errors.InputError` before Ray starts and before
anything is written; a run that stops raises (Diverged, WorkFailed, KeyboardInterrupt,
Stopped, or the error that stopped it) after its rows so far, its runs row with the status,
and, for an unexpected error, its traceback (`OUT/logs/<run_id>.txt`) are written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfed_ray import config as configuration
from perfed_ray import timeline
from perfed_ray.results.layout import check_out

if TYPE_CHECKING:
    import pandas as pd
    from ray.util.placement_group import PlacementGroup

    from perfed_ray.display import SummaryTable
    from perfed_ray.lifecycle import RunLife


@dataclass(frozen=True)
class RunResult:
    """Where a run's rows are: `out/<table>/run_id=<run_id>/`."""

    run_id: str
    out: Path

    def table(self, name: str) -> pd.DataFrame:
        """One of the run's tables: runs, rounds, evals, events or actors."""
        from perfed_ray.results.reader import read_table

        return read_table(self.out, name, self.run_id)

    def summary(self) -> SummaryTable:
        """The run's row of `perfed-ray summary`, which prints as that command's table."""
        from perfed_ray.analysis import summary
        from perfed_ray.display import SummaryTable

        return SummaryTable(summary(self.out, self.run_id))

    @property
    def checkpoint(self) -> Path:
        """The folder `--resume` (and `simulate(resume=...)`) continue the run from."""
        from perfed_ray.runtime.checkpoint import RunStore

        return RunStore(self.out, self.run_id).folder


def to_config(
    config: str | Path | Mapping[str, Any] | configuration.RunConfig | None,
    overrides: Iterable[str] = (),
    **changes: Any,
) -> configuration.RunConfig:
    """A validated configuration from a YAML file, a mapping or a RunConfig, with
    `--set`-style overrides and keyword changes applied."""
    if isinstance(config, configuration.RunConfig):
        config = config.to_dict()
    if config is None or isinstance(config, (str, Path)):
        cfg = configuration.load(config, overrides)
        return configuration.revise(cfg, **changes) if changes else cfg
    return configuration.from_mapping(
        {**config, **configuration.parse_overrides(overrides), **changes}
    )


def check(
    config: str | Path | Mapping[str, Any] | configuration.RunConfig | None = None,
    out: str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    **changes: Any,
) -> configuration.RunConfig:
    """What :func:`simulate` with the same arguments would run, checked as far as it is
    without Ray (``perfed-ray run --dry-run``): the configuration, the results folder,
    and the data, loaded and partitioned; nothing is written and Ray is not started.
    Raises what `simulate` would before Ray starts (ConfigError, DataError)."""
    from perfed_ray.runtime import simulation

    cfg = to_config(config, list(overrides), **changes)
    check_out(Path(out or "results"))
    return simulation.prepare(cfg).cfg


def simulate(
    config: str | Path | Mapping[str, Any] | configuration.RunConfig | None = None,
    out: str | Path | None = None,
    *,
    overrides: Iterable[str] = (),
    resume: str | Path | None = None,
    address: str | None = None,
    progress: Callable[[Any], None] | bool = True,
    announce: Callable[[configuration.RunConfig, RunResult, bool], None] | None = None,
    verbose: bool = False,
    run_id: str | None = None,
    placement_group: PlacementGroup | None = None,
    command: str | None = None,
    sweep: str | None = None,
    **changes: Any,
) -> RunResult:
    """Run one simulation (or, with `resume`, continue a stopped one) and return where
    its rows are.

    `config` is a YAML file, a mapping of configuration keys, a RunConfig or None (all
    defaults); `out` the results folder (default: results/; when resuming, the run's
    own, which `out` may only repeat); `overrides` are `key=value` strings and
    `changes` keyword values, both applied on top. `address` joins a running Ray
    cluster (default: $RAY_ADDRESS, else a local Ray, started if none is running).
    `progress` shows the command line's progress line on stderr (True), nothing
    (False), or is called with a :class:`~perfed_ray.runtime.rounds.Progress`
    after every round; `announce` is told the resolved configuration and run once Ray is up
    and before the run begins (so a SIGTERM handler it installs is not Ray's);
    `verbose` shows Ray's start-up chatter (:mod:`perfed_ray.runtime.chatter`).
    `run_id` names a new run (default: its start time, algorithm and a random suffix),
    `placement_group` (a Ray PlacementGroup whose bundle 0 is this driver's) reserves
    the run's actors in its other bundles and sizes them by those, and `command` is
    what started the run, for its runs row; `sweep` names the sweep the run is a
    trial of, under which its trackers (`report_to`) group it: a sweep's trials use
    all four (:mod:`perfed_ray.sweep`).
    """
    overrides = list(overrides)
    if resume is None:
        cfg = to_config(config, overrides, **changes)
        folder = Path(out or "results")
        check_out(folder)
    # A run's machinery (torch among it) loads once its configuration is found good:
    # `perfed-ray run` refuses a bad one in a fraction of a second.
    from perfed_ray.lifecycle import RunLife, new_run_id

    if resume is not None:
        given = None if config is None else to_config(config, overrides, **changes)
        pending = (
            {} if config is not None else {**configuration.parse_overrides(overrides), **changes}
        )
        life = RunLife.resume(resume, given, pending, out)
        cfg = life.config
    else:
        life = RunLife.new(folder, run_id or new_run_id(cfg.algorithm))
    with life:
        _run(life, cfg, address, progress, announce, verbose, placement_group, command, sweep)
    return RunResult(life.run_id, life.out)


def _run(
    life: RunLife,
    cfg: configuration.RunConfig,
    address: str | None,
    progress: Callable[[Any], None] | bool,
    announce: Callable[[configuration.RunConfig, RunResult, bool], None] | None,
    verbose: bool,
    placement_group: PlacementGroup | None,
    command: str | None,
    sweep: str | None,
) -> None:
    """The claimed run, from its data to its end: prepared, placed, its actors and
    rounds run, and ended (its runs row says how: `life.running`)."""
    import ray

    from perfed_ray import tracking
    from perfed_ray.results.writer import RunWriter  # pyarrow: after validation
    from perfed_ray.runtime import chatter, connect, local_ray, simulation

    if not verbose:
        chatter.hide()
    # The trackers' process loads their libraries while the data, Ray and the actors
    # get ready.
    trackers = tracking.start(cfg)
    try:
        # The data first: bad data fail in a second, before Ray's seconds of starting.
        timeline.mark("data")
        prepared = simulation.prepare(cfg)
        timeline.mark("ray")
        cluster = connect.cluster_address(address)
        if cluster and not ray.is_initialized():  # a sweep's trial runs inside the cluster
            from perfed_ray.runtime.environment import plugin_modules

            connect.connect(cluster, plugin_modules(cfg))
        local_ray.start([prepared.cfg])  # before `announce`, which may set signal handlers
        timeline.mark("set-up")
        if placement_group is None:  # a sweep's trial was sized by its reserved group
            simulation.check_resources(prepared.cfg, life.record.blocks if life.resumed else None)
        if announce:
            announce(prepared.cfg, RunResult(life.run_id, life.out), life.resumed)
        if progress is True:
            from perfed_ray.display import ProgressDisplay

            progress = ProgressDisplay()
        placed = simulation.place(prepared, life.run_id, life.record, placement_group, command)
        writer = RunWriter(life.out, life.run_id, placed.cfg)
        at = (life.checkpoint.round if life.checkpoint else -1) if life.resumed else None
        if trackers is not None:
            tracking.follow(trackers, writer, placed.cfg, life.store.folder, at, sweep)
        with life.running(writer, placed.row(life.checkpoint)) as row:
            simulation.run(placed, life.store, writer, row, life.checkpoint, progress or None)
    finally:
        if trackers is not None:
            trackers.close()
