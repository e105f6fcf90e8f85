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


MEANINGS: dict[str, dict[str, str]] = {}  # table -> column -> what it holds


def _table(name: str, *columns: tuple[str, pa.DataType, str]) -> pa.Schema:
    """A table's own columns as (name, type, meaning). The meaning is declared beside
    the type, not in a page, because the docs' column reference (docs/reference/
    results.md, from :func:`perfed_ray.results.docs.reference_text`) is generated from
    it: a new column is documented where it is added, or nowhere."""
    MEANINGS[name] = {column: meaning for column, _, meaning in columns}
    return pa.schema([(column, kind) for column, kind, _ in columns])


# The statuses a run ends with, and the exit status `perfed-ray run` gives each: 0 for
# a run that ended as it should (done, or stopped early by a sweep's scheduler).
EXIT_CODES = {"finished": 0, "stopped": 0, "diverged": 1, "failed": 1, "interrupted": 130}

RUNS_SCHEMA = _table(
    RUNS,
    ("status", pa.string(), "running, finished, failed, diverged, interrupted or stopped"),
    ("error", pa.string(), "the first line of what stopped the run (null when nothing did)"),
    ("started_at", TIMESTAMP, "when the run first started"),
    ("ended_at", TIMESTAMP, "when it ended (null while running)"),
    (
        "wall_seconds",
        pa.float64(),
        "seconds spent on the run, over all its sittings (not the gaps)",
    ),
    ("rounds_done", pa.int64(), "rounds completed"),
    (
        "epsilon",
        pa.float64(),
        "the epsilon spent over `rounds_done` rounds, at `privacy.delta` (inf: no privacy)",
    ),
    ("resumes", pa.int64(), "how many times the run was continued with `--resume`"),
    ("startup_seconds", pa.float64(), "from the run's start until every actor holds its users"),
    ("driver_peak_memory_bytes", pa.int64(), "the driver process's peak resident memory"),
    ("actors_peak_memory_bytes", pa.int64(), "the actors' peak resident memory, all together"),
    ("n_actors", pa.int64(), "actors that hosted users"),
    ("actor_cpus", pa.float64(), "CPUs reserved by each actor"),
    ("actor_gpus", pa.float64(), "GPUs (a fraction where shared) reserved by each actor"),
    ("command", pa.string(), "the command line that started the run"),
    ("hostname", pa.string(), "the driver's machine"),
    ("python_version", pa.string(), "the driver's Python"),
    ("perfed_ray_version", pa.string(), "perfed-ray's version"),
    ("ray_version", pa.string(), "Ray's version"),
    ("torch_version", pa.string(), "PyTorch's version"),
    ("numpy_version", pa.string(), "NumPy's version"),
    ("pyarrow_version", pa.string(), "pyarrow's version"),
)

ROUNDS_SCHEMA = _table(
    ROUNDS,
    ("round", pa.int64(), "1 to `rounds`"),
    ("users", pa.list_(pa.int64()), "the ids of the users sampled"),
    ("n_sampled", pa.int64(), "how many were sampled"),
    (
        "n_reported",
        pa.int64(),
        "sampled users whose update was averaged (not dropped out or cut as stragglers)",
    ),
    ("train_loss", pa.float64(), "mean over reporting users and local steps of the training loss"),
    ("wall_seconds", pa.float64(), "the round's seconds on the driver"),
    ("train_seconds", pa.float64(), "the training calls, out and back"),
    ("actor_seconds", pa.float64(), "the slowest actor's own time in its call"),
    ("server_seconds", pa.float64(), "the server's step after the sums came"),
    (
        "bytes_sent",
        pa.int64(),
        "the global weights, once per actor called (in a span of "
        "rounds, once, with its first round)",
    ),
    ("bytes_received", pa.int64(), "one float64 sum of weights per actor called"),
    (
        "epsilon",
        pa.float64(),
        "differential privacy's epsilon spent after this round, at "
        "`privacy.delta` (inf: no privacy; null in results written before privacy existed)",
    ),
    ("sim_time", pa.float64(), "simulated seconds when the step's model was made"),
    (
        "staleness_mean",
        pa.float64(),
        "an asynchronous server's: the aggregated updates' mean staleness (server steps "
        "since their model)",
    ),
    ("staleness_max", pa.int64(), "an asynchronous server's: their largest staleness"),
    ("in_flight", pa.int64(), "an asynchronous server's: tasks still in flight after the step"),
)

EVALS_SCHEMA = _table(
    EVALS,
    ("round", pa.int64(), "the round evaluated after (0: the initial model)"),
    ("final", pa.bool_(), "the final evaluation, with `final_eval_draws` draws"),
    ("user", pa.int64(), "the user's id"),
    ("group", pa.string(), "A or B in the paper's split (null in others)"),
    ("draw", pa.int64(), "which independent adaptation draw"),
    ("n_train", pa.int64(), "the user's training samples"),
    ("n_test", pa.int64(), "the user's test samples"),
    ("acc_before", pa.float64(), "test accuracy of the global model, before personalisation"),
    ("loss_before", pa.float64(), "test loss of the global model"),
    (
        "acc_after",
        pa.float64(),
        "test accuracy after the method's personalisation (`personalise_steps` steps)",
    ),
    ("loss_after", pa.float64(), "test loss after personalisation"),
    (
        "acc_steps",
        pa.list_(pa.float64()),
        "test accuracy after 0, 1, ..., `personalise_steps` steps",
    ),
    ("loss_steps", pa.list_(pa.float64()), "test loss after 0, 1, ..., `personalise_steps` steps"),
    ("unseen", pa.bool_(), "never sampled for training (`unseen_users`)"),
    ("sim_time", pa.float64(), "simulated seconds when the scored model was made"),
)

TASKS_SCHEMA = _table(
    TASKS,
    ("task", pa.int64(), "the task's number in dispatch order (ties in time are broken by it)"),
    ("user", pa.int64(), "the user that ran it"),
    ("version", pa.int64(), "server steps done when it started"),
    ("start", pa.float64(), "simulated seconds when it started"),
    ("end", pa.float64(), "its arrival, or when it was known lost (simulated seconds)"),
    ("round", pa.int64(), "the server step that aggregated it (null: none)"),
    ("staleness", pa.int64(), "round - 1 - version"),
    ("outcome", pa.string(), "aggregated, late, offline, dropped or pending"),
)

EVENTS_SCHEMA = _table(
    EVENTS,
    ("round", pa.int64(), "the round it happened in"),
    ("kind", pa.string(), "actor-died, node-died, dropout, straggler or tracker-failed"),
    ("actor", pa.int64(), "the actor (null for events of users, not actors)"),
    ("users", pa.list_(pa.int64()), "the users concerned"),
    ("detail", pa.string(), "what happened, in words"),
)

ACTORS_SCHEMA = _table(
    ACTORS,
    ("actor", pa.int64(), "the actor's index"),
    ("incarnation", pa.int64(), "0 at the start; +1 for each replacement"),
    ("from_round", pa.int64(), "the first round this incarnation served"),
    ("users", pa.list_(pa.int64()), "the users it hosts"),
    ("node_id", pa.string(), "the Ray node it ran on"),
    ("node_ip", pa.string(), "that node's address"),
    ("pid", pa.int64(), "its process id"),
    ("device", pa.string(), "where its users' work ran: cpu or cuda (which GPU: gpu_ids)"),
    ("gpu_ids", pa.list_(pa.string()), "the GPUs Ray gave it"),
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
