"""TensorBoard: each run's event files under ``<out>/tensorboard/<run_id>/`` (a
sweep's trials under ``<out>/tensorboard/<sweep>/<run_id>/``, so that one
``tensorboard --logdir`` shows a sweep side by side), or under ``tensorboard_dir``.

Written with the ``tensorboard`` package's own event-file writer and protocol
buffers (the ``tensorboard`` extra, which brings the viewer too), not with
``torch.utils.tensorboard``, so that the trackers' process starts without importing
torch, a fresh process's slowest import. Each metric is a scalar whose step is
the round; a round's scalars are one event (one record to build, queue and write,
not one per metric); where the run has a simulated clock, the round's scalars carry
its time as their wall time, so TensorBoard's `Relative` and `Wall` axes are
simulated time. The configuration goes to the HParams tab (the plugin's experiment
and session start, written as its documented protocol buffers; the session's end
with the run's status), the summary to scalars ``summary/<column>`` and a text.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from perfed_ray.markdown import table
from perfed_ray.results.layout import TENSORBOARD
from perfed_ray.tracking.base import SUCCEEDED, TrackedRun, Tracker, numbers

# The metrics the HParams tab shows beside each run's hyperparameters.
HEADLINE = ("acc_after", "acc_before", "train_loss")
# How a run that ended shows in the HParams tab (anything else: a failure).
ENDED = {**dict.fromkeys(SUCCEEDED, "STATUS_SUCCESS"), "interrupted": "STATUS_UNKNOWN"}


def _hparams(config: dict[str, Any]) -> list:
    """The HParams plugin's experiment (every key, and the headline metrics) and this
    run's session start (every key's value), as summary values."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    infos, values = [], {}
    for key, value in config.items():
        if isinstance(value, bool):
            kind, values[key] = api_pb2.DATA_TYPE_BOOL, struct_pb2.Value(bool_value=value)
        elif isinstance(value, (int, float)):
            kind, values[key] = api_pb2.DATA_TYPE_FLOAT64, struct_pb2.Value(number_value=value)
        else:  # a string, or None (auto) or a list, as its text
            kind, values[key] = api_pb2.DATA_TYPE_STRING, struct_pb2.Value(string_value=str(value))
        infos.append(api_pb2.HParamInfo(name=key, type=kind))
    metrics = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag)) for tag in HEADLINE]
    experiment = api_pb2.Experiment(hparam_infos=infos, metric_infos=metrics)
    start = plugin_data_pb2.SessionStartInfo(hparams=values, start_time_secs=time.time())
    return [
        _plugin_value(metadata.EXPERIMENT_TAG, experiment=experiment),
        _plugin_value(metadata.SESSION_START_INFO_TAG, session_start_info=start),
    ]


def _plugin_value(tag: str, **data: Any) -> Any:
    """A summary value of the HParams plugin carrying `data` (its metadata is the
    content; the tensor an empty one)."""
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.hparams import metadata, plugin_data_pb2

    content = plugin_data_pb2.HParamsPluginData(version=metadata.PLUGIN_DATA_VERSION, **data)
    return Summary.Value(
        tag=tag, metadata=metadata.create_summary_metadata(content), tensor=metadata.NULL_TENSOR
    )


class TensorBoard(Tracker):
    library = "tensorboard"
    extra = "tensorboard"
    imports = (
        "tensorboard.summary.writer.event_file_writer",
        "tensorboard.plugins.hparams.metadata",
        "tensorboard.plugins.text.metadata",
    )

    def start(self, run: TrackedRun) -> dict[str, str]:
        from tensorboard.compat.proto.event_pb2 import SessionLog
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        root = Path(run.config.get("tensorboard_dir") or run.out / TENSORBOARD)
        folder = root / run.group / run.run_id if run.group else root / run.run_id
        self.writer = EventFileWriter(str(folder))
        if run.resumed:
            # A resumed run logs again every step after the last one kept: a session's
            # start at the next step tells TensorBoard's readers to drop the events of
            # that step and after that the killed sitting wrote, so each step is read once.
            self._event(run.logged + 1, session_log=SessionLog(status=SessionLog.START))
        else:  # the HParams tab reads the first session's
            self._summary(0, _hparams(run.config))
        return {}

    def _event(self, step: int, wall_time: float | None = None, **content: Any) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        when = time.time() if wall_time is None else wall_time
        self.writer.add_event(Event(wall_time=when, step=step, **content))

    def _summary(self, step: int, values: list, wall_time: float | None = None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        self._event(step, wall_time, summary=Summary(value=values))

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
        self._summary(step, values, sim_time)

    def flush(self) -> None:
        self.writer.flush()

    def summary(self, values: dict[str, Any]) -> None:
        from tensorboard.compat.proto import tensor_pb2, tensor_shape_pb2, types_pb2
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.text import metadata

        step = int(values.get("rounds_done") or 0)
        scalars = [
            Summary.Value(tag=f"summary/{k}", simple_value=v) for k, v in numbers(values).items()
        ]
        text = table(("column", "value"), values.items()).encode()
        shape = tensor_shape_pb2.TensorShapeProto(
            dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]
        )
        tensor = tensor_pb2.TensorProto(
            dtype=types_pb2.DT_STRING, string_val=[text], tensor_shape=shape
        )
        shown = metadata.create_summary_metadata(display_name="summary", description="")
        self._summary(step, [*scalars, Summary.Value(tag="summary", metadata=shown, tensor=tensor)])

    def close(self, status: str) -> None:
        from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

        ended = plugin_data_pb2.SessionEndInfo(
            status=api_pb2.Status.Value(ENDED.get(status, "STATUS_FAILURE")),
            end_time_secs=time.time(),
        )
        self._summary(0, [_plugin_value(metadata.SESSION_END_INFO_TAG, session_end_info=ended)])
        self.writer.close()
