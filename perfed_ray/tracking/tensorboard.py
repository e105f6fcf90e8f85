"""TensorBoard: each run's event files under ``<out>/tensorboard/<run_id>/`` (a
sweep's trials under ``<out>/tensorboard/<sweep>/<run_id>/``, so that one
``tensorboard --logdir`` shows a sweep side by side), or under ``tensorboard_dir``.

Written with PyTorch's own ``torch.utils.tensorboard.SummaryWriter`` (torch is
installed anyway; the ``tensorboard`` extra brings the package it writes with and
the viewer). Each metric is a scalar whose step is the round; a round's scalars are
one event (one record to build, queue and write, not one per metric); where the run
has a simulated clock, the round's scalars carry its time as their wall time, so
TensorBoard's `Relative` and `Wall` axes are simulated time. The configuration
goes to the HParams tab, the summary to scalars ``summary/<column>`` and a text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from perfed_ray.markdown import table
from perfed_ray.results.layout import TENSORBOARD
from perfed_ray.tracking.base import TrackedRun, Tracker, numbers

# The metrics the HParams tab shows beside each run's hyperparameters.
HEADLINE = ("acc_after", "acc_before", "train_loss")


class TensorBoard(Tracker):
    library = "tensorboard"
    extra = "tensorboard"
    imports = ("torch.utils.tensorboard", "tensorboard.compat.proto.summary_pb2")

    def start(self, run: TrackedRun) -> dict[str, str]:
        from torch.utils.tensorboard import SummaryWriter
        from torch.utils.tensorboard.summary import hparams

        root = Path(run.config.get("tensorboard_dir") or run.out / TENSORBOARD)
        folder = root / run.group / run.run_id if run.group else root / run.run_id
        # A resumed run logs again every step after the last one kept: events of those
        # steps that the killed sitting wrote are purged (TensorBoard's restart marker,
        # which its readers honour), so that each step is read once.
        purge = run.logged + 1 if run.resumed else None
        self.writer = SummaryWriter(str(folder), purge_step=purge)
        if not run.resumed:  # the HParams tab reads the first session's
            values = {
                k: v if isinstance(v, (int, float, str)) else str(v) for k, v in run.config.items()
            }
            for summary in hparams(values, dict.fromkeys(HEADLINE, 0.0)):
                self.writer.file_writer.add_summary(summary)
        return {}

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=v) for k, v in metrics.items()]
        self.writer.file_writer.add_summary(Summary(value=values), step, sim_time)

    def flush(self) -> None:
        self.writer.flush()

    def summary(self, values: dict[str, Any]) -> None:
        step = int(values.get("rounds_done") or 0)
        for name, value in numbers(values).items():
            self.writer.add_scalar(f"summary/{name}", value, step)
        self.writer.add_text("summary", table(("column", "value"), values.items()), step)

    def close(self, status: str) -> None:
        self.writer.close()
