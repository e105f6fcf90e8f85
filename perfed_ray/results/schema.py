"""The Arrow schema of every results table: the contract users analyse with pandas.

Every row carries every configuration value as a column, with one fixed Arrow type
per column (from :class:`~perfed_ray.config.RunConfig`), so files of different runs
always read back as one table; a component's settings (``fedrep.head_epochs``) are
columns of its own runs alone.
"""

from __future__ import annotations

import pyarrow as pa

from perfed_ray.config import CORE, RunConfig, component_settings
from perfed_ray.results.layout import ACTORS, EVALS, EVENTS, ROUNDS, RUNS, TASKS

_ARROW = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}
TIMESTAMP = pa.timestamp("us", tz="UTC")

CONFIG_SCHEMA = pa.schema([(name, _ARROW[s.type]) for name, s in CORE.items()])


def config_schema(cfg: RunConfig) -> pa.Schema:
    """A run's configuration columns: the core keys, then its components' settings
    (``fedrep.head_epochs``), which only runs of that component have, typed by their
    declarations (an `auto` value is None: a null of the setting's type)."""
    declared = component_settings(cfg)
    return pa.schema([*CONFIG_SCHEMA, *((k, _ARROW[declared[k].type]) for k, _ in cfg.settings)])


RUNS_SCHEMA = pa.schema(
    [
        ("status", pa.string()),  # running, finished, failed, diverged, interrupted, stopped
        ("error", pa.string()),
        ("started_at", TIMESTAMP),
        ("ended_at", TIMESTAMP),
        ("wall_seconds", pa.float64()),
        ("rounds_done", pa.int64()),
        # the epsilon spent over rounds_done rounds, at privacy.delta (inf: no privacy)
        ("epsilon", pa.float64()),
        ("resumes", pa.int64()),  # how many times the run was continued with --resume
        ("startup_seconds", pa.float64()),  # from the run's start until every actor is ready
        ("driver_peak_memory_bytes", pa.int64()),
        ("actors_peak_memory_bytes", pa.int64()),
        ("n_actors", pa.int64()),
        ("actor_cpus", pa.float64()),
        ("actor_gpus", pa.float64()),
        ("command", pa.string()),
        ("hostname", pa.string()),
        ("python_version", pa.string()),
        ("perfed_ray_version", pa.string()),
        ("ray_version", pa.string()),
        ("torch_version", pa.string()),
        ("numpy_version", pa.string()),
        ("pyarrow_version", pa.string()),
    ]
)

ROUNDS_SCHEMA = pa.schema(
    [
        ("round", pa.int64()),
        ("users", pa.list_(pa.int64())),
        ("n_sampled", pa.int64()),
        ("n_reported", pa.int64()),  # sampled users whose update was averaged
        ("train_loss", pa.float64()),
        ("wall_seconds", pa.float64()),
        ("train_seconds", pa.float64()),  # the training calls, out and back
        ("actor_seconds", pa.float64()),  # the slowest actor's own time in its call
        ("server_seconds", pa.float64()),  # the server's step after the sums came
        ("bytes_sent", pa.int64()),
        ("bytes_received", pa.int64()),
        # Differential privacy's epsilon spent after this round, at privacy.delta (inf:
        # no privacy; null in results written before privacy existed).
        ("epsilon", pa.float64()),
        # Simulated seconds when the step's model was made (perfed_ray.clock).
        ("sim_time", pa.float64()),
        # An asynchronous strategy's own: the aggregated updates' staleness (server
        # steps since their model), and the tasks still in flight after the step.
        ("staleness_mean", pa.float64()),
        ("staleness_max", pa.int64()),
        ("in_flight", pa.int64()),
    ]
)

EVALS_SCHEMA = pa.schema(
    [
        ("round", pa.int64()),
        ("final", pa.bool_()),
        ("user", pa.int64()),
        ("group", pa.string()),
        ("draw", pa.int64()),
        ("n_train", pa.int64()),
        ("n_test", pa.int64()),
        ("acc_before", pa.float64()),
        ("loss_before", pa.float64()),
        ("acc_after", pa.float64()),  # after personalise_steps steps
        ("loss_after", pa.float64()),
        ("acc_steps", pa.list_(pa.float64())),  # after 0, 1, ..., personalise_steps steps
        ("loss_steps", pa.list_(pa.float64())),
        ("unseen", pa.bool_()),  # never sampled for training (unseen_users)
        ("sim_time", pa.float64()),  # simulated seconds when the scored model was made
    ]
)

TASKS_SCHEMA = pa.schema(
    [
        ("task", pa.int64()),  # in dispatch order: ties in time are broken by it
        ("user", pa.int64()),
        ("version", pa.int64()),  # server steps done when it started
        ("start", pa.float64()),  # simulated seconds
        ("end", pa.float64()),  # its arrival, or when it was known lost
        ("round", pa.int64()),  # the step that aggregated it (null: none)
        ("staleness", pa.int64()),  # round - 1 - version
        ("outcome", pa.string()),  # aggregated, late, offline, dropped, pending
    ]
)

EVENTS_SCHEMA = pa.schema(
    [
        ("round", pa.int64()),
        ("kind", pa.string()),  # actor-died, dropout, straggler
        ("actor", pa.int64()),  # null for events of users, not actors
        ("users", pa.list_(pa.int64())),
        ("detail", pa.string()),
    ]
)

ACTORS_SCHEMA = pa.schema(
    [
        ("actor", pa.int64()),
        ("incarnation", pa.int64()),  # 0 at the start; +1 for each replacement
        ("from_round", pa.int64()),  # the first round this incarnation served
        ("users", pa.list_(pa.int64())),
        ("node_id", pa.string()),
        ("node_ip", pa.string()),
        ("pid", pa.int64()),
        ("device", pa.string()),
        ("gpu_ids", pa.list_(pa.string())),
    ]
)

SCHEMAS = {
    RUNS: RUNS_SCHEMA,
    ROUNDS: ROUNDS_SCHEMA,
    EVALS: EVALS_SCHEMA,
    EVENTS: EVENTS_SCHEMA,
    ACTORS: ACTORS_SCHEMA,
    TASKS: TASKS_SCHEMA,
}


def table_schema(name: str) -> pa.Schema:
    """A table's full schema as read back: configuration, its own columns, run_id."""
    return pa.unify_schemas([CONFIG_SCHEMA, SCHEMAS[name], pa.schema([("run_id", pa.string())])])
