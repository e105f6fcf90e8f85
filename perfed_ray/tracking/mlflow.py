"""MLflow: one MLflow run per perfed-ray run, in the experiment that
``MLFLOW_EXPERIMENT_NAME`` (or ``MLFLOW_EXPERIMENT_ID``) names, default `perfed-ray`,
on the tracking server or store ``MLFLOW_TRACKING_URI`` names (MLflow's own default
otherwise).

Every configuration key is a parameter, each metric's step is the round, the
summary's numbers are metrics ``summary/<column>`` and its status a tag. A sweep's
trials carry the tag ``perfed_ray.sweep`` (search ``tags."perfed_ray.sweep" =
'<name>'``). A resumed run logs into the MLflow run of its first sitting, whose id
is kept beside the run's checkpoint; of the steps it is sent again that the killed
sitting had sent, it logs only the metrics its history does not hold. The client
(``mlflow-skinny`` is enough: the ``mlflow`` extra) writes through
``MlflowClient.log_batch``, within the batch limits of MLflow's REST API.
"""

from __future__ import annotations

import os
import time
from typing import Any

from perfed_ray.tracking.base import SUCCEEDED, TrackedRun, Tracker, numbers

MAX_METRICS, MAX_PARAMS = 1000, 100  # one log_batch request's limits
ENDED = {**dict.fromkeys(SUCCEEDED, "FINISHED"), "interrupted": "KILLED"}  # else FAILED


def _chunks(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


class MLflow(Tracker):
    library = "mlflow"
    extra = "mlflow"
    imports = ("mlflow",)

    def start(self, run: TrackedRun) -> dict[str, str]:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        self.client = MlflowClient()
        self.pending: list = []
        self.held: set[tuple[str, int]] = set()
        if "run_id" in run.kept:
            self.run = run.kept["run_id"]
            self.client.update_run(self.run, status="RUNNING")
            if run.sent > run.logged:
                self.held = self._held(run.logged, run.sent)
            return dict(run.kept)
        tags = {"perfed_ray.run_id": run.run_id}
        if run.group:
            tags["perfed_ray.sweep"] = run.group
        self.run = self.client.create_run(
            self._experiment(), run_name=run.run_id, tags=tags
        ).info.run_id
        params = [Param(k, str(v)) for k, v in run.config.items()]
        for chunk in _chunks(params, MAX_PARAMS):
            self.client.log_batch(self.run, params=chunk)
        return {"run_id": self.run}

    def _experiment(self) -> str:
        """The experiment's id, made if it does not exist yet (by this run, or by a
        trial of the same sweep at the same moment)."""
        from mlflow.exceptions import MlflowException

        if os.environ.get("MLFLOW_EXPERIMENT_ID"):
            return os.environ["MLFLOW_EXPERIMENT_ID"]
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "perfed-ray"
        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # made meanwhile by another run
            return self.client.get_experiment_by_name(name).experiment_id

    def _held(self, after: int, through: int) -> set[tuple[str, int]]:
        """The (metric, step) pairs of steps `after` < step <= `through` that the run
        holds: those the killed sitting sent, which this one is sent again."""
        keys = self.client.get_run(self.run).data.metrics
        return {
            (key, metric.step)
            for key in keys
            for metric in self.client.get_metric_history(self.run, key)
            if after < metric.step <= through
        }

    def log(self, step: int, metrics: dict[str, float], sim_time: float | None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.pending += [
            Metric(k, v, now, step) for k, v in metrics.items() if (k, step) not in self.held
        ]

    def flush(self) -> None:
        for chunk in _chunks(self.pending, MAX_METRICS):
            self.client.log_batch(self.run, metrics=chunk)
        self.pending = []

    def summary(self, values: dict[str, Any]) -> None:
        step = int(values.get("rounds_done") or 0)
        for name, value in numbers(values).items():
            self.log(step, {f"summary/{name}": value}, None)
        self.flush()
        self.client.set_tag(self.run, "perfed_ray.status", str(values.get("status")))

    def close(self, status: str) -> None:
        self.client.set_terminated(self.run, ENDED.get(status, "FAILED"))
