"""A sweep on Ray Tune: its trials, their placement groups, early stopping, resuming, and
what came of it.

Under the results folder, ``sweeps/<name>/`` is the sweep's Tune experiment: the sweep
as it was given (``sweep.json``, what ``--resume`` continues) and Tune's own state
(experiment state, each trial's ``result.json`` and ``progress.csv``). The trials'
tables are the results folder's, beside any other runs.

Each trial reserves one placement group: a bundle for its driver, pinned to the node
that runs the sweep (so every trial writes its rows into this node's results folder,
and Tune's state stays here too), then one bundle per actor, placed anywhere
(`PACK`: on as few nodes as fit). Tune starts a trial only when all of its group
fits, so trials run side by side as far as the cluster allows and never wait for
each other's actors.

A sweep stopped at any point continues with `--resume`: Tune restores its
experiment (finished trials stay finished; unfinished and failed ones start again),
and each trial continues its run from the run's last checkpoint, or reports it done
if it ended meanwhile. Killed before Tune saved anything, the sweep starts its trials
again from ``sweep.json``, under the same run ids, so the same runs continue.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd
import ray
from ray import tune

from perfed_ray.config import revise
from perfed_ray.errors import ConfigError, InputError, first_line
from perfed_ray.results.layout import EVALS, SWEEPS, check_out
from perfed_ray.results.writer import write_atomically
from perfed_ray.runtime import hosts
from perfed_ray.sweep import ENDED
from perfed_ray.sweep.spec import Sweep

STATE = "sweep.json"  # the sweep as given, beside Tune's state
BEST = "best.yaml"  # the search's picks
_PIN = 0.001  # of the driver node's `node:<ip>` resource, per trial: a place, not a share


def check(sweep: Sweep, out: Path) -> tuple[Path, Sweep]:
    """Check the results folder and the data before Ray starts, so bad input is one line
    and nothing else; the sweep's folder there, and the sweep with its data roots
    resolved here, where the user set them (`$PERFED_DATA`), not on the nodes that run
    the trials. :func:`run` records it once the cluster is known to hold its trials."""
    from perfed_ray.data import load_dataset, resolve_root
    from perfed_ray.data.datasets import dataset

    check_out(out)
    folder = out / SWEEPS / sweep.name
    if folder.exists():
        raise ConfigError(
            f"sweep {sweep.name} already exists in {out}: continue it with "
            f"`perfed-ray sweep --resume {folder}`, or give this one another name"
        )
    trials = tuple(
        revise(t, data_root=str(resolve_root(t.data_root)))
        if dataset(t.dataset).load is not None
        else t
        for t in sweep.trials
    )
    needed = {(t.dataset, t.data_root, t.download, t.data_folder) for t in trials}
    for name, root, download, data_folder in sorted(needed):
        if root is not None:  # DataError, with the fix, if unusable
            load_dataset(name, root, download, 0, data_folder)
    return folder, replace(sweep, trials=trials)


def _record(folder: Path, sweep: Sweep) -> None:
    """The sweep as given, what `--resume` continues."""
    folder.mkdir(parents=True)
    text = json.dumps(sweep.to_dict(), indent=1)
    write_atomically(folder / STATE, lambda tmp: tmp.write_text(text))


def _fits(sweep: Sweep) -> None:
    """Every trial's actors fit the cluster (else Tune waits for ever for its group)."""
    from perfed_ray.runtime.placement import unfit

    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    for i, trial in enumerate(sweep.trials):
        why = unfit(sweep.resources.bundles(trial)[1:], nodes)
        if why:
            raise InputError(
                f"trial {sweep.run_id(i)}: {why}: lower resources cpus or gpus (or "
                f"num_cpus_per_actor, num_gpus_per_actor), or run on a cluster that has them"
            )


def locate(path: str | Path) -> Path:
    """The sweep folder `--resume` names: ``<out>/sweeps/<name>``, or a results folder
    holding one sweep."""
    path = Path(path)
    if (path / STATE).is_file():
        return path
    found = sorted(p.parent for p in (path / SWEEPS).glob(f"*/{STATE}"))
    if len(found) == 1:
        return found[0]
    if found:
        names = ", ".join(str(p) for p in found)
        raise ConfigError(f"--resume {str(path)!r} holds several sweeps: give one of {names}")
    raise ConfigError(
        f"--resume {str(path)!r} is not a sweep: give the results folder of a sweep, or "
        f"<results>/{SWEEPS}/<name> (printed when it started)"
    )


def load(folder: Path) -> Sweep:
    try:
        return Sweep.from_dict(json.loads((folder / STATE).read_text()))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{folder / STATE} is damaged ({err}): start the sweep again") from None


def param_space(sweep: Sweep, out: Path, command: str, stops: str) -> dict[str, Any]:
    """Every trial's run id, configuration and placement group bundles (Tune runs one
    trial per entry, in order, and saves them with its state), and what all share: the
    results folder, the sweep's name and command and the name of its :class:`Stops`
    actor."""
    trials = [
        {"run_id": sweep.run_id(i), "run": t.to_dict(), "bundles": sweep.resources.bundles(t)}
        for i, t in enumerate(sweep.trials)
    ]
    return {
        "trial": tune.grid_search(trials),
        "out": str(out.resolve()),
        "sweep": sweep.name,
        "command": command,
        "stops": stops,
    }


def pinned(node_ip: str) -> Callable[[dict[str, Any]], tune.PlacementGroupFactory]:
    """A trial's placement group, its driver's bundle on the node at `node_ip`."""

    def resources(config: dict[str, Any]) -> tune.PlacementGroupFactory:
        driver, *actors = config["trial"]["bundles"]
        return tune.PlacementGroupFactory(
            [{**driver, f"node:{node_ip}": _PIN}, *actors], strategy="PACK"
        )

    return resources


@dataclass(frozen=True)
class Outcome:
    """How each trial's run ended: its status (None: it never started), and Tune's error
    for trials that failed."""

    statuses: dict[str, str | None]
    errors: dict[str, str]

    @property
    def unfinished(self) -> list[str]:
        """Runs that did not end and did not fail: an interrupted sweep's."""
        return [r for r, s in self.statuses.items() if s not in ENDED and r not in self.errors]


class Lines(tune.Callback):
    """One line per trial as it starts and ends, on stderr (Tune's own tables are shown
    with --verbose only)."""

    def __init__(self, described: dict[str, str]) -> None:
        self.described = described  # run id -> its varied values

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info) -> None:
        run_id = trial.config["trial"]["run_id"]
        _say(f"start {self.described.get(run_id, run_id)}")

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info) -> None:
        result = trial.last_result or {}
        status = "stopped" if result.get("status") == "running" else result.get("status")
        accuracy = result.get("accuracy", float("nan"))
        _say(
            f"end   {trial.config['trial']['run_id']}: {status} after round "
            f"{result.get('round', 0)}, personalised accuracy {100 * accuracy:.2f}%"
        )

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info) -> None:
        _say(f"error {trial.config['trial']['run_id']}: failed, see {trial.error_file}")


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _node_ip(driver_cpus: float) -> str:
    """This driver's node, where the trials' drivers run; it must hold their CPUs."""
    ip = ray.util.get_node_ip_address()
    cpus = max(
        (
            n["Resources"].get("CPU", 0.0)
            for n in ray.nodes()
            if n["Alive"] and n["NodeManagerAddress"] == ip
        ),
        default=0.0,
    )
    if driver_cpus > cpus:
        raise InputError(
            f"each trial's driver runs on this node ({ip}), which has {cpus:g} CPUs for Ray, "
            f"fewer than resources: driver_cpus = {driver_cpus:g}: lower it (0 is allowed: "
            f"drivers mostly wait for their actors)"
        )
    return ip


def _sigint(signum: int, frame: object) -> None:
    """A scheduler's SIGTERM ends the sweep as Ctrl-C does: Tune saves its state, stops
    the trials (status `interrupted`), and the sweep can be resumed."""
    signal.raise_signal(signal.SIGINT)


def run(
    folder: Path,
    address: str | None = None,
    verbose: bool = False,
    command: str = "",
    new: Sweep | None = None,
) -> Outcome:
    """Run `new` (checked by :func:`check`) in `folder`, or continue the sweep recorded
    there where it stopped, on the Ray cluster at `address` (default: $RAY_ADDRESS,
    else a local Ray). Returns how its trials ended; the caller reports it."""
    from perfed_ray.runtime import chatter, connect, local_ray
    from perfed_ray.runtime.environment import plugin_modules
    from perfed_ray.sweep.trial import STOPS, Stops

    folder = folder.resolve()  # Tune takes absolute paths (else it reads them as URIs)
    sweep = new or load(folder)
    out = folder.parent.parent
    cluster = connect.cluster_address(address)
    if cluster and cluster.startswith("ray://"):
        raise InputError(
            f"--address {cluster}: a sweep's driver must run on a node of the cluster (its "
            f"trials write their rows beside it): run it there with --address auto or "
            f"HOST:PORT, or submit it as a Ray job"
        )
    if not verbose:
        chatter.hide()
        logging.getLogger("ray.tune").setLevel(logging.ERROR)
        os.environ["RAY_AIR_NEW_OUTPUT"] = "0"  # Tune's boxes and tables: --verbose only
    if cluster and not ray.is_initialized():
        connect.connect(cluster, sorted({m for t in sweep.trials for m in plugin_modules(t)}))
    local_ray.start(sweep.trials)  # no-op once connected
    hosts.release()  # the trials need what idle hosts of earlier runs here hold
    _fits(sweep)
    if new is not None:
        _record(folder, new)
    stops = STOPS + sweep.name
    decisions = Stops.options(name=stops, get_if_exists=True).remote()
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _sigint) if main else None  # after Ray's own
    try:
        grid = _tuner(folder, sweep, out, command, verbose, stops).fit()
    finally:
        if main:
            signal.signal(signal.SIGTERM, previous)
        ray.kill(decisions)
    errors = {r.config["trial"]["run_id"]: first_line(r.error) for r in grid if r.error is not None}
    return Outcome(statuses(out, sweep), errors)


def _tuner(
    folder: Path, sweep: Sweep, out: Path, command: str, verbose: bool, stops: str
) -> tune.Tuner:
    """The sweep's Tuner: restored from Tune's state in `folder` if it has one, else new;
    `stops` names the actor that tells trials stopped by Tune from interrupted ones."""
    from perfed_ray.sweep.trial import RecordStops, Trial

    trainable = tune.with_resources(Trial, pinned(_node_ip(sweep.resources.driver_cpus)))
    if tune.Tuner.can_restore(str(folder)):
        return tune.Tuner.restore(
            str(folder), trainable, resume_unfinished=True, resume_errored=True
        )
    return tune.Tuner(
        trainable,
        param_space=param_space(sweep, out, command, stops),
        tune_config=tune.TuneConfig(
            scheduler=_scheduler(sweep),
            reuse_actors=True,  # a trial's process hosts the next (sweep.trial)
            trial_name_creator=_run_id,
            trial_dirname_creator=_run_id,
        ),
        run_config=tune.RunConfig(
            name=sweep.name,
            storage_path=str(folder.parent),
            verbose=1 if verbose else 0,
            callbacks=[
                RecordStops(stops),
                Lines({sweep.run_id(i): sweep.describe(i) for i in range(len(sweep.trials))}),
            ],
            failure_config=tune.FailureConfig(max_failures=sweep.retries),
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
        ),
    )


def _run_id(trial: Any) -> str:
    return trial.config["trial"]["run_id"]


def _scheduler(sweep: Sweep) -> tune.schedulers.TrialScheduler | None:
    """ASHA on the personalised accuracy at evaluation rounds, or none (every trial runs
    to its end)."""
    stopping = sweep.early_stopping
    if stopping is None:
        return None
    return tune.schedulers.ASHAScheduler(
        time_attr="round",
        metric="accuracy",
        mode="max",
        grace_period=stopping.grace_rounds,
        max_t=max(t.rounds for t in sweep.trials) + 1,  # a trial's last round is its own
        reduction_factor=stopping.reduction_factor,
    )


def statuses(out: Path, sweep: Sweep) -> dict[str, str | None]:
    """Each trial's run status (None for a trial that never started)."""
    from perfed_ray.results.reader import read_runs

    runs = read_runs(out)
    known = dict(zip(runs["run_id"], runs["status"], strict=True)) if not runs.empty else {}
    return {sweep.run_id(i): known.get(sweep.run_id(i)) for i in range(len(sweep.trials))}


def best(out: Path, sweep: Sweep) -> pd.DataFrame:
    """The search's picks: per value of its `per` keys, the values of the other varied
    keys (the seed aside) whose finished runs have the highest final personalised
    accuracy on validation samples, averaged over seeds; with that accuracy, how many
    seeds it averages and their runs."""
    from perfed_ray.analysis import final_accuracy
    from perfed_ray.results.reader import read_runs, read_table

    per = list(sweep.search)
    picked = [k for k in sweep.varied if k not in per and k != "seed"]
    ids = [sweep.run_id(i) for i in range(len(sweep.trials))]
    runs = read_runs(out)
    runs = runs[runs["run_id"].isin(ids) & (runs["status"] == "finished")]
    if runs.empty:
        return pd.DataFrame(columns=[*per, *picked, "accuracy", "seeds", "runs"])
    accuracy = final_accuracy(read_table(out, EVALS))[["run_id", "accuracy"]]
    table = runs[["run_id", *per, *picked]].merge(accuracy, on="run_id")
    means = (
        table.groupby([*per, *picked], dropna=False)
        .agg(accuracy=("accuracy", "mean"), seeds=("run_id", "count"), runs=("run_id", list))
        .reset_index()
    )
    return means.loc[means.groupby(per, dropna=False)["accuracy"].idxmax()].reset_index(drop=True)


def write_best(folder: Path, picks: pd.DataFrame) -> Path:
    """The picks as YAML, one entry per value of `per`, for the runs that use them."""
    import yaml

    path = folder / BEST
    records = json.loads(picks.to_json(orient="records"))
    path.write_text(yaml.safe_dump(records, sort_keys=False))
    return path
