"""Weights & Biases: one W&B run per perfed-ray run, in the project ``WANDB_PROJECT``
names (default `perfed-ray`), online or offline as ``WANDB_MODE`` says, its files
under ``WANDB_DIR``; a sweep's trials are a W&B group named after the sweep.

The configuration is the run's config, each round's metrics one history row at step
= round (with `sim_time` among them where the run has a simulated clock: choose it
as the x-axis in the W&B UI), the summary the run's summary. A resumed run continues
the W&B run of its first sitting (its id is kept beside the run's checkpoint);
offline, each sitting is a folder of its own that ``wandb sync`` joins into that run.
Which steps a killed sitting's W&B process wrote cannot be asked offline, so the
steps it was sent but not known to hold are not sent again: they may be missing from
the W&B run (never from Parquet), and none is there twice.
W&B's console capture is off: the run's progress line stays the terminal's.
"""

from __future__ import annotations

import os
import time
from typing import Any

from perfed_ray.tracking.base import SUCCEEDED, TrackedRun, Tracker

# Seconds a resumed run waits for the W&B process of its killed sitting to let go of
# the W&B run (it notices its parent gone within seconds).
IN_USE_SECONDS = 30


class WandB(Tracker):
    library = "wandb"
    extra = "wandb"
    imports = ("wandb",)
    resends = False

    def start(self, run: TrackedRun) -> dict[str, str]:
        import wandb

        settings = wandb.Settings(console="off", silent=True)
        deadline = time.monotonic() + IN_USE_SECONDS
        while True:
            try:
                self.run = wandb.init(
                    project=os.environ.get("WANDB_PROJECT") or "perfed-ray",
                    id=run.kept.get("id"),
                    resume="allow",
                    name=run.run_id,
                    group=run.group,
                    config=run.config,
                    reinit="create_new",  # a process's runs (a notebook's, tests') side by side
                    # read now, not as W&B's settings cached them at the process's first run
                    dir=os.environ.get("WANDB_DIR"),
                    mode=os.environ.get("WANDB_MODE"),
                    settings=settings,
                )
                return {"id": self.run.id}
            except Exception as err:
                # The W&B process of a sitting killed a moment ago still holds the run.
                if "in use" not in str(err) or time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        self.run.log(metrics, step=step, commit=True)  # a row now, not when the next comes

    def summary(self, values: dict[str, Any]) -> None:
        self.run.summary.update(values)

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status in SUCCEEDED else 1)
