"""`report_to`: TensorBoard, MLflow and W&B fed as a run goes, each read back with its
own library's reader (TensorBoard's EventAccumulator, MLflow's client on a local file
store, the offline W&B run's records) and compared with the Parquet rows; a run
killed with SIGKILL and resumed logs no step twice; a tracker that fails leaves one
event and a complete run; a tracker whose library is missing exits 2 before Ray
starts. Each library's tests skip, saying which extra to install, without it."""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from conftest import TINY, killed_mid_round

from perfed_ray.analysis import final_accuracy
from perfed_ray.api import simulate
from perfed_ray.config import from_mapping
from perfed_ray.errors import ConfigError
from perfed_ray.results.reader import read_table
from perfed_ray.runtime.checkpoint import RunStore

PLUGINS = Path(__file__).resolve().parent / "plugins"
ALL = ["tensorboard", "mlflow", "wandb"]
# The rounds' columns every tracker gets, equal to the Parquet rows'.
ROUND_COLUMNS = ["train_loss", "n_sampled", "n_reported", "wall_seconds", "bytes_sent"]


def _needs(*libraries: str) -> None:
    for library in libraries:
        pytest.importorskip(
            library, reason=f"the {library} extra is not installed: pip install -e '.[{library}]'"
        )


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    """MLflow on a local file store and W&B offline, both under tmp_path, for this
    process and the commands it starts."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's opt-in to file stores
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_PROJECT", "perfed-ray-tests")
    # W&B names the service its first run in a process started in the environment, so
    # that the processes this one starts share it: a killed run's sitting would then
    # live on in this process's service and hold its W&B run for good.
    monkeypatch.delenv("WANDB_SERVICE", raising=False)
    return tmp_path


# Reading back, with each library's own reader.


def tensorboard_scalars(folder: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import (
        SCALARS,
        EventAccumulator,
    )

    events = EventAccumulator(str(folder), size_guidance={SCALARS: 0})
    events.Reload()
    return {t: [(e.step, e.value) for e in events.Scalars(t)] for t in events.Tags()["scalars"]}


def mlflow_runs(tmp_path: Path) -> tuple:
    from mlflow import MlflowClient

    client = MlflowClient((tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("perfed-ray")
    return client, client.search_runs([experiment.experiment_id])


def mlflow_metrics(client, run_id: str) -> dict[str, list[tuple[int, float]]]:
    keys = client.get_run(run_id).data.metrics
    return {k: [(m.step, m.value) for m in client.get_metric_history(run_id, k)] for k in keys}


def wandb_records(tmp_path: Path, run_id: str) -> list:
    """The records of every offline sitting of W&B run `run_id`, oldest first: its
    ``run-<id>.wandb`` files are LevelDB-style logs (a 7-byte header, then records of
    a 7-byte header each, in 32 KiB blocks) of the protobuf Records W&B syncs."""
    from wandb.proto import wandb_internal_pb2

    records = []
    for path in sorted((tmp_path / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        data, position, pending = path.read_bytes(), 7, b""
        assert data[:4] == b":W&B"
        while position + 7 <= len(data):
            if 32768 - position % 32768 < 7:  # a block's tail too short for a header
                position += 32768 - position % 32768
                continue
            _, length, kind = struct.unpack("<IHB", data[position : position + 7])
            if length == 0 and kind == 0:
                break
            pending += data[position + 7 : position + 7 + length]
            position += 7 + length
            if kind in (1, 4):  # a whole record, or a record's last piece
                record = wandb_internal_pb2.Record()
                record.ParseFromString(pending)
                records.append(record)
                pending = b""
    return records


def _items(update) -> dict:
    return {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in update}


def wandb_history(records: list) -> list[tuple[int, dict]]:
    return [
        (r.history.step.num, _items(r.history.item))
        for r in records
        if r.WhichOneof("record_type") == "history"
    ]


# What the Parquet rows say.


def expected(out: Path) -> dict[str, dict[int, float]]:
    """metric -> step -> value, from the Parquet tables: the rounds' own columns, and
    each evaluation's mean accuracy over users (and draws) after and before adaptation."""
    rounds = read_table(out, "rounds").set_index("round")
    evals = read_table(out, "evals")
    values = {c: rounds[c].to_dict() for c in ROUND_COLUMNS}
    for column in ("acc_after", "acc_before"):
        values[column] = evals.groupby("round")[column].mean().to_dict()
    return values


def assert_equal(got: dict[str, list[tuple[int, float]]], want: dict[str, dict[int, float]]):
    for name, by_step in want.items():
        steps = [s for s, _ in got[name]]
        assert len(steps) == len(set(steps)), f"{name}: a step logged twice: {steps}"
        assert dict(got[name]) == pytest.approx(by_step, rel=1e-6), name


def test_report_to_is_a_list_of_registered_trackers_stored_as_one_column():
    cfg = from_mapping({**TINY, "report_to": ["tensorboard", "wandb"]})
    assert cfg.report_to == "tensorboard,wandb"
    assert from_mapping({**TINY, "report_to": "tensorboard,wandb"}) == cfg  # --set a,b
    assert from_mapping(TINY).report_to == ""
    with pytest.raises(
        ConfigError, match=r"report_to = 'tensorbord' is not allowed \(did you mean 'tensorboard'"
    ):
        from_mapping({**TINY, "report_to": ["tensorbord"]})
    with pytest.raises(ConfigError, match="report_to names 'mlflow' twice"):
        from_mapping({**TINY, "report_to": ["mlflow", "mlflow"]})
    with pytest.raises(ConfigError, match=r"which is not a subclass of perfed_ray\.tracking"):
        from_mapping({**TINY, "report_to": ["perfed_ray.models:MLP"]})


@pytest.mark.slow
def test_a_tracker_whose_library_is_missing_exits_2_naming_the_extra(tmp_path):
    """Through the command line, before Ray starts: a user's tracker whose library is
    not installed."""
    args = ["run", "--quiet", "--set", "dataset=gaussian", "--set", "report_to=sinks:Uninstalled"]
    result = subprocess.run(
        [sys.executable, "-m", "perfed_ray.cli", *args, "--out", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=PLUGINS,
        env={**os.environ, "RAY_TMPDIR": str(tmp_path / "ray")},
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "error: report_to names sinks:Uninstalled, whose library "
        "perfed_ray_tests_no_such_library is not installed: pip install 'perfed-ray[nowhere]'"
    )
    assert not (tmp_path / "out").exists() and not (tmp_path / "ray").exists()


@pytest.mark.parametrize("library", ALL)
def test_a_built_in_tracker_without_its_extra_names_the_extra(monkeypatch, library):
    """Each built-in tracker with its library hidden from the import system, as if its
    extra had not been installed: the configuration is refused, naming the extra."""
    monkeypatch.setitem(sys.modules, library, None)
    with pytest.raises(ConfigError) as refused:
        from_mapping({**TINY, "report_to": ["tensorboard", "mlflow", "wandb"]})
    assert str(refused.value) == (
        f"report_to names {library}, whose library {library} is not installed: "
        f"pip install 'perfed-ray[{library}]'"
    )


@pytest.mark.slow
def test_a_run_reported_to_all_three_reads_back_equal_to_its_parquet_rows(
    ray_session, offline, tmp_path
):
    """One run of a sweep's (as its trials are grouped), every tracker fed; each read
    back equals the rounds' rows and the evaluations' means, has every configuration
    key and the summary, and is grouped under the sweep."""
    _needs(*ALL)
    out = tmp_path / "results"
    values = {**TINY, "rounds": 6, "unseen_users": 0.25, "report_to": ALL}
    result = simulate(values, out, progress=False, sweep="grid")
    run_id, want = result.run_id, expected(out)
    config = RunStore(out, run_id).load_record().config  # as the run resolved it
    final = final_accuracy(read_table(out, "evals")).iloc[0]
    assert read_table(out, "events").empty  # no tracker failed

    board = tensorboard_scalars(out / "tensorboard" / "grid" / run_id)
    assert_equal(board, want)
    assert board["summary/accuracy"] == [(6, pytest.approx(final["accuracy"]))]
    assert board["acc_after_ci95"][-1] == (6, pytest.approx(final["ci95"]))
    assert {"acc_after_seen", "acc_after_unseen", "acc_before_unseen"} <= set(board)

    client, [run] = mlflow_runs(tmp_path)
    assert run.info.run_name == run_id and run.info.status == "FINISHED"
    assert run.data.tags["perfed_ray.sweep"] == "grid"
    assert run.data.params == {k: str(v) for k, v in config.items()}
    metrics = mlflow_metrics(client, run.info.run_id)
    assert_equal(metrics, want)
    assert metrics["summary/ci95"] == [(6, pytest.approx(final["ci95"]))]

    records = wandb_records(tmp_path, json.loads(_kept(out, run_id))["wandb"]["id"])
    [started] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert started.display_name == run_id and started.run_group == "grid"
    logged = {k: v for k, v in _items(started.config.update).items() if k != "_wandb"}
    assert logged == {k: v for k, v in config.items()}
    history = wandb_history(records)
    steps = [s for s, _ in history]
    assert steps == sorted(set(steps)) == list(range(7))
    by_name = {name: [(s, row[name]) for s, row in history if name in row] for name in want}
    assert_equal(by_name, want)
    summaries = [
        _items(r.summary.update) for r in records if r.WhichOneof("record_type") == "summary"
    ]
    assert any(s.get("accuracy") == pytest.approx(final["accuracy"]) for s in summaries)


def _kept(out: Path, run_id: str) -> str:
    return (out / "checkpoints" / f"run_id={run_id}" / "trackers.json").read_text()


@pytest.mark.slow
def test_a_run_killed_mid_round_and_resumed_logs_no_step_twice(ray_session, offline, tmp_path):
    """SIGKILL in round 5 after the rows up to round 4 were written (checkpoint at
    round 3), the trackers' process somewhere in them: the resumed run continues the
    same MLflow and W&B runs and TensorBoard folder, sends what they miss up to round 3
    from the Parquet rows and the replayed rounds they do not hold, and every tracker
    then holds each step once, with the Parquet rows' losses and accuracies."""
    _needs(*ALL)
    values = {
        **TINY,
        "rounds": 8,
        "checkpoint_every": 3,
        "fraction": 1.0,
        "report_to": ALL,
    }
    out, run_dir, saved = killed_mid_round(ray_session, values, tmp_path)
    assert saved.round == 3
    run_id = run_dir.name.removeprefix("run_id=")
    # Rows up to round 4 were written, 3 checkpointed; the trackers' process, at its low
    # priority, had started them all (the first rows wait for that), and logged some or none.
    first = json.loads(_kept(out, run_id))
    assert set(first) == set(ALL) and all(-1 <= kept["step"] <= 4 for kept in first.values())
    assert first["mlflow"]["run_id"] and first["wandb"]["id"]
    # Resumed as a user resumes a killed run, by a new command: W&B keeps settings and
    # a service per process, which this test process's earlier runs have set up.
    resumed = subprocess.run(
        [sys.executable, "-m", "perfed_ray.cli", "run", "--quiet", "--resume", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr
    events = read_table(out, "events")
    assert events.empty or "tracker-failed" not in set(events["kind"]), events["detail"]
    kept = json.loads(_kept(out, run_id))
    assert kept["mlflow"]["run_id"] == first["mlflow"]["run_id"]
    assert kept["wandb"]["id"] == first["wandb"]["id"]

    want = {k: v for k, v in expected(out).items() if k in ("train_loss", "acc_after")}
    assert_equal(tensorboard_scalars(out / "tensorboard" / run_id), want)
    client, [run] = mlflow_runs(tmp_path)
    assert run.info.status == "FINISHED"
    assert_equal(mlflow_metrics(client, run.info.run_id), want)
    # W&B writes its file from its own process every few seconds (its transaction
    # log), which the SIGKILL ends too: the first sitting's last steps may be lost
    # there (never in Parquet), but none is logged twice and the second's are whole.
    records = wandb_records(tmp_path, kept["wandb"]["id"])
    history = wandb_history(records)
    steps = [s for s, _ in history]
    assert steps == sorted(set(steps)) and set(range(5, 9)) <= set(steps)
    want = {k: {s: v for s, v in by_step.items() if s in steps} for k, by_step in want.items()}
    by_name = {name: [(s, row[name]) for s, row in history if name in row] for name in want}
    assert_equal(by_name, want)


def _rounds(steps: range, **more: list) -> dict:
    import pyarrow as pa

    columns = {"round": list(steps), "train_loss": [1.0 + s for s in steps], **more}
    return {"rounds": pa.table(columns)}


def test_steps_in_doubt_when_killed_are_held_once_or_not_sent_again(offline, tmp_path, monkeypatch):
    """A kill between a tracker's being sent steps and their being counted leaves them
    in doubt (trackers.json: sent beyond step). The resumed run sends them again to a
    tracker that drops what it holds (MLflow asks its history: each step once, with
    the killed sitting's values where it holds them), and not to one that cannot tell
    (as W&B offline: it may miss them, never holds them twice)."""
    from perfed_ray.results.writer import RunWriter
    from perfed_ray.tracking import TrackedRun, TrackerFeed
    from perfed_ray.tracking.serve import KEPT

    _needs("mlflow")
    monkeypatch.syspath_prepend(str(PLUGINS))
    import sinks

    names = ["mlflow", "sinks:Recording", "sinks:RecordingNoResend"]
    out, folder = tmp_path / "out", tmp_path / "checkpoint"
    writer = RunWriter(out, "r1", from_mapping(TINY))
    run = TrackedRun("r1", {"seed": 1}, out, False, None, {})
    first = TrackerFeed(names).follow(run, folder, writer)
    first(_rounds(range(0, 3)))
    first(_rounds(range(3, 5)))
    first.close()
    kept = json.loads((folder / KEPT).read_text())
    assert [kept[n]["step"] for n in names] == [4, 4, 4] == [kept[n]["sent"] for n in names]
    # As a kill after the second write's sending and before its count leaves the file.
    for name in names:
        kept[name]["step"] = 2
    (folder / KEPT).write_text(json.dumps(kept))
    client, [tracked] = mlflow_runs(tmp_path)
    for sink in (sinks.Recording, sinks.RecordingNoResend):
        (out / f"{sink.__name__}.steps").unlink()

    second = TrackerFeed(names).follow(replace(run, resumed=True), folder, writer)
    second(_rounds(range(3, 7), n_sampled=[4, 4, 4, 4]))  # a metric the store lacks
    second.close()
    assert sinks.Recording.sent(out) == [3, 4, 5, 6]
    assert sinks.RecordingNoResend.sent(out) == [5, 6]
    got = mlflow_metrics(client, tracked.info.run_id)
    assert sorted(got["train_loss"]) == [(s, 1.0 + s) for s in range(7)]
    assert sorted(got["n_sampled"]) == [(s, 4.0) for s in range(3, 7)]


TENSORBOARD_ALONE = """
import json, sys
from pathlib import Path
from perfed_ray.registry import TRACKERS
from perfed_ray.tracking import TrackedRun
config = {"alpha": 0.001, "algorithm": "fedavg", "download": True, "data_root": None}
tracker = TRACKERS.load("tensorboard")()
run = TrackedRun("r1", config, Path(sys.argv[1]), False, None, {})
tracker.start(run)
tracker.log(1, {"train_loss": 2.5, "wall_seconds": 0.1}, 30.0)
tracker.log(2, {"train_loss": 2.0, "wall_seconds": 0.1}, 61.0)
tracker.flush()
tracker.summary({"accuracy": 0.75, "rounds_done": 2, "status": "finished"})
tracker.close("finished")
print(json.dumps(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))))
"""


def test_tensorboard_writes_scalars_hparams_and_summary_without_torch(tmp_path):
    """The TensorBoard tracker alone, in a process of its own as the trackers' is: the
    scalars at their rounds with the simulated time as wall time, the HParams tab's
    experiment, session start and end, the summary's scalars and text, read back with
    TensorBoard's own reader; and torch never imported."""
    _needs("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import api_pb2, metadata

    done = subprocess.run(
        [sys.executable, "-c", TENSORBOARD_ALONE, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []  # no torch in the trackers' process for it
    events = EventAccumulator(str(tmp_path / "tensorboard" / "r1"))
    events.Reload()
    loss = events.Scalars("train_loss")
    assert [(e.step, e.value, e.wall_time) for e in loss] == [(1, 2.5, 30.0), (2, 2.0, 61.0)]
    assert [(e.step, e.value) for e in events.Scalars("summary/accuracy")] == [(2, 0.75)]
    assert (
        "| status | finished |" in events.Tensors("summary")[0].tensor_proto.string_val[0].decode()
    )
    hparams = events.PluginTagToContent(metadata.PLUGIN_NAME)
    experiment = metadata.parse_experiment_plugin_data(hparams[metadata.EXPERIMENT_TAG])
    kinds = {i.name: i.type for i in experiment.hparam_infos}
    assert kinds == {
        "alpha": api_pb2.DATA_TYPE_FLOAT64,
        "algorithm": api_pb2.DATA_TYPE_STRING,
        "download": api_pb2.DATA_TYPE_BOOL,
        "data_root": api_pb2.DATA_TYPE_STRING,
    }
    assert [m.name.tag for m in experiment.metric_infos] == [
        "acc_after",
        "acc_before",
        "train_loss",
    ]
    start = metadata.parse_session_start_info_plugin_data(hparams[metadata.SESSION_START_INFO_TAG])
    assert start.hparams["alpha"].number_value == 0.001
    assert start.hparams["algorithm"].string_value == "fedavg"
    assert start.hparams["download"].bool_value is True
    assert start.hparams["data_root"].string_value == "None"
    end = metadata.parse_session_end_info_plugin_data(hparams[metadata.SESSION_END_INFO_TAG])
    assert end.status == api_pb2.STATUS_SUCCESS


SUMMARY_AT_THE_END = """
import json, sys
from pathlib import Path
from perfed_ray.results.reader import read_table
from perfed_ray.tracking import TrackedRun, Tracker
from perfed_ray.tracking.serve import Follow, Trackers

class Kept(Tracker):
    def summary(self, values):
        self.values = values

out, folder = Path(sys.argv[1]), Path(sys.argv[2])
run_id = read_table(out, "runs")["run_id"].iloc[0]
run = TrackedRun(run_id, {}, out, False, None, {})
trackers = Trackers(["__main__:Kept"], Follow(run, folder, None), print)
kept = trackers.trackers["__main__:Kept"]
trackers.end("finished")
torch = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
sent = {key: kept.values[key] for key in ("run_id", "status")}
print(json.dumps({**sent, "torch": torch}))
"""


@pytest.mark.slow  # the session's results folder, six runs, if no fast test made it
def test_the_summary_a_runs_end_sends_loads_no_torch_in_the_trackers_process(
    tiny_results, tmp_path
):
    """At a run's end the trackers' process reads the run's summary row and hands it to
    each tracker; the run's final row waits for that. The summary's columns are core
    ones, so no component is imported for it, and torch (seconds of CPU, which the
    first run of each trackers' process waited for at its end) never loads there."""
    done = subprocess.run(
        [sys.executable, "-c", SUMMARY_AT_THE_END, str(tiny_results), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    sent = json.loads(done.stdout.splitlines()[-1])
    first = read_table(tiny_results, "runs")["run_id"].iloc[0]
    assert sent["run_id"] == first and sent["status"] == "finished"
    assert sent["torch"] == []


def test_report_every_sends_every_kth_round_and_every_evaluations_round(tmp_path, monkeypatch):
    """`report_every: 3`: of rounds 1-7 written in three writes, the trackers get
    rounds 3 and 6, and the evaluations' rounds 0 and 5."""
    import pyarrow as pa

    from perfed_ray.results.writer import RunWriter
    from perfed_ray.tracking import TrackedRun, TrackerFeed

    monkeypatch.syspath_prepend(str(PLUGINS))
    import sinks

    cfg = from_mapping({**TINY, "report_every": 3})
    out = tmp_path / "out"
    run = TrackedRun("r1", cfg.to_dict(), out, False, None, {})
    feed = TrackerFeed(["sinks:Recording"]).follow(
        run, tmp_path / "kept", RunWriter(out, "r1", cfg)
    )

    def evaluation(round_: int) -> pa.Table:
        columns = {"round": [round_] * 2, "draw": [0, 0], "unseen": [False] * 2}
        return pa.table({**columns, "acc_after": [0.5, 0.7], "acc_before": [0.1, 0.3]})

    feed({"evals": evaluation(0)})
    feed(_rounds(range(1, 5)))
    feed({**_rounds(range(5, 8)), "evals": evaluation(5)})
    feed.close()
    assert sinks.Recording.sent(out) == [0, 3, 5, 6]


def test_each_evaluation_is_sent_as_protocols_figures_for_seen_and_unseen_users():
    """The aggregates a tracker gets of each evaluation in a write (numpy, in the
    trackers' process) against pandas and scipy's t interval on the same rows: the
    mean over users after adaptation, its interval over draws, and the seen and unseen
    users' means, for two evaluations in one write."""
    import numpy as np
    import pyarrow as pa
    from scipy import stats

    from perfed_ray.tracking.serve import evaluation_metrics

    rng = np.random.default_rng(3)
    rows = pd.DataFrame(
        [(r, u, d, u >= 4) for r in (20, 40) for u in range(6) for d in range(3)],
        columns=["round", "user", "draw", "unseen"],
    )
    rows["acc_after"], rows["acc_before"] = rng.random(len(rows)), rng.random(len(rows))
    got = evaluation_metrics(pa.Table.from_pandas(rows.sample(frac=1, random_state=1)))
    assert sorted(got) == [20, 40]
    for round_, frame in rows.groupby("round"):
        per_draw = frame.groupby("draw")["acc_after"].mean()
        half = stats.t.ppf(0.975, 2) * per_draw.std(ddof=1) / math.sqrt(3)
        seen, unseen = frame[~frame["unseen"]], frame[frame["unseen"]]
        assert got[round_] == pytest.approx(
            {
                "acc_after": frame["acc_after"].mean(),
                "acc_after_ci95": half,
                "acc_before": frame["acc_before"].mean(),
                "acc_after_seen": seen["acc_after"].mean(),
                "acc_before_seen": seen["acc_before"].mean(),
                "acc_after_unseen": unseen["acc_after"].mean(),
                "acc_before_unseen": unseen["acc_before"].mean(),
            },
            rel=1e-12,
        )


@pytest.mark.skipif(not hasattr(os, "setpriority"), reason="no process priorities here")
def test_trackers_run_in_their_own_process_at_the_lowest_priority(tmp_path, monkeypatch):
    """The trackers run in a process of their own (never holding the driver's
    interpreter lock) at niceness 19, and so does what they start, so that they take the
    cores only where the run's processes leave them idle; the driver keeps its own."""
    from perfed_ray.results.writer import RunWriter
    from perfed_ray.tracking import TrackedRun, TrackerFeed
    from perfed_ray.tracking.feed import LOWEST

    monkeypatch.syspath_prepend(str(PLUGINS))
    before = os.getpriority(os.PRIO_PROCESS, 0)
    assert before < LOWEST
    writer = RunWriter(tmp_path / "out", "r1", from_mapping(TINY))
    run = TrackedRun("r1", {}, tmp_path, False, None, {})
    feed = TrackerFeed(["sinks:Niceness"]).follow(run, tmp_path / "checkpoint", writer)
    feed(_rounds(range(0, 2)))
    feed.close()
    seen = json.loads((tmp_path / "niceness.json").read_text())
    assert seen.pop("pid") != os.getpid()
    assert seen == {"start": LOWEST, "child": LOWEST, "log": LOWEST}
    assert os.getpriority(os.PRIO_PROCESS, 0) == before
    assert writer.buffers["events"] == [] and feed.process.poll() is None  # kept, alive


def test_ctrl_c_to_the_process_group_leaves_the_trackers_to_the_driver(tmp_path, monkeypatch):
    """Ctrl-C (SIGINT) and a scheduler's SIGTERM reach every process of the driver's
    group: the trackers' process goes on until the driver ends it (as it ends an
    interrupted run's trackers), so they are closed, not killed mid-write."""
    import signal

    from perfed_ray.results.writer import RunWriter
    from perfed_ray.tracking import TrackedRun, TrackerFeed

    monkeypatch.syspath_prepend(str(PLUGINS))
    import sinks

    out = tmp_path / "out"
    writer = RunWriter(out, "r1", from_mapping(TINY))
    run = TrackedRun("r1", {}, out, False, None, {})
    feed = TrackerFeed(["sinks:Recording"]).follow(run, tmp_path, writer)
    feed(_rounds(range(0, 2)))  # once the trackers have started
    for stop in (signal.SIGINT, signal.SIGTERM):
        feed.process.send_signal(stop)
    feed(_rounds(range(2, 4)))
    feed.close()
    assert writer.buffers["events"] == [] and feed.process.poll() is None  # kept, alive
    assert sinks.Recording.sent(out) == [0, 1, 2, 3]


def test_the_next_run_reuses_the_trackers_process_unless_it_died_meanwhile(tmp_path, monkeypatch):
    """A run's trackers' process is kept for the driver's next run (its libraries
    loaded); one that died meanwhile is replaced, and the next run's trackers get every
    step."""
    from perfed_ray.results.writer import RunWriter
    from perfed_ray.tracking import TrackedRun, TrackerFeed

    monkeypatch.syspath_prepend(str(PLUGINS))
    import sinks

    def one_run(out: Path) -> TrackerFeed:
        writer = RunWriter(out, "r1", from_mapping(TINY))
        run = TrackedRun("r1", {}, out, False, None, {})
        feed = TrackerFeed(["sinks:Recording"]).follow(run, tmp_path / out.name, writer)
        feed(_rounds(range(0, 2)))
        feed.close()
        assert writer.buffers["events"] == [] and sinks.Recording.sent(out) == [0, 1]
        return feed

    first = one_run(tmp_path / "first")
    assert one_run(tmp_path / "second").process is first.process
    first.process.kill()
    first.process.wait()
    assert one_run(tmp_path / "third").process is not first.process


def test_the_trackers_process_dying_is_one_event_and_the_run_goes_on(tmp_path, monkeypatch):
    """A tracker whose library ends its whole process: the driver goes on writing its
    rows, and its final row brings one `tracker-failed` event naming the trackers and
    the process's exit status."""
    import pyarrow as pa

    from perfed_ray.results.writer import RunWriter
    from perfed_ray.tracking import TrackedRun, TrackerFeed

    monkeypatch.syspath_prepend(str(PLUGINS))
    out = tmp_path / "out"
    writer = RunWriter(out, "r1", from_mapping(TINY))
    run = TrackedRun("r1", {}, out, False, None, {})
    feed = TrackerFeed(["sinks:Dying"]).follow(run, tmp_path, writer)
    writer.listeners.append(feed)
    for steps in (range(0, 1), range(1, 3), range(3, 4)):
        writer.add("rounds", [{"round": s, "train_loss": 1.0} for s in steps])
        writer.flush()
    feed({"runs": pa.table({"status": ["finished"]})})
    assert read_table(out, "rounds")["round"].tolist() == [0, 1, 2, 3]
    events = read_table(out, "events")
    assert events["kind"].tolist() == ["tracker-failed"]
    assert events["detail"].iloc[0] == (
        "sinks:Dying: the trackers' process ended with status 3: every tracker is off"
    )


@pytest.mark.slow
def test_a_failing_tracker_is_reported_once_and_the_run_completes(
    ray_session, tmp_path, monkeypatch
):
    """A user's tracker that raises in round 2: one `tracker-failed` event naming it and
    the error, a finished run with every row, and the other trackers complete:
    TensorBoard, and the tracking page's own example, run as printed."""
    _needs("tensorboard")
    page = (PLUGINS.parents[1] / "docs/guide/tracking.md").read_text()
    example = re.search(r"<!-- tracker:begin -->\n```python\n(.*?)```", page, re.S).group(1)
    (tmp_path / "jsonl_sink.py").write_text(example)
    monkeypatch.syspath_prepend(str(PLUGINS))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "results"
    trackers = ["sinks:Failing", "tensorboard", "jsonl_sink:JsonLines"]
    result = simulate({**TINY, "report_to": trackers}, out, progress=False)
    events = read_table(out, "events")
    assert events[["round", "kind"]].values.tolist() == [[2, "tracker-failed"]]
    assert events["detail"].iloc[0] == (
        "sinks:Failing: ConnectionError: the tracking server at http://tracker.invalid went away"
    )
    runs = result.table("runs")
    assert runs[["status", "rounds_done"]].values.tolist() == [["finished", 4]]
    assert len(result.table("rounds")) == 4
    kept = json.loads(_kept(out, result.run_id))
    assert kept == {  # the failing one was sent rounds 1 and 2 and held round 0
        "sinks:Failing": {"step": 0, "sent": 2},
        "tensorboard": {"step": 4, "sent": 4},
        "jsonl_sink:JsonLines": {"step": 4, "sent": 4},
    }
    lines = (tmp_path / f"{result.run_id}.jsonl").read_text().splitlines()
    lines = [json.loads(line) for line in lines]
    assert [line["round"] for line in lines] == [0, 1, 2, 3, 4]
    losses = {line["round"]: line["train_loss"] for line in lines if "train_loss" in line}
    assert losses == result.table("rounds").set_index("round")["train_loss"].to_dict()
    board = tensorboard_scalars(out / "tensorboard" / result.run_id)
    assert [s for s, _ in board["train_loss"]] == [1, 2, 3, 4]
    assert not math.isnan(pd.Series(dict(board["acc_after"])).sum())
