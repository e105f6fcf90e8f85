"""Parquet results: the contract users analyse with pandas.

Layout under the output folder (hive-partitioned by run, so
``pandas.read_parquet("results/evals")`` reads every run in one call), one
file per table and run::

    runs/run_id=<id>/part-0.parquet     one row per run (rewritten as its status changes)
    rounds/run_id=<id>/part-0.parquet   one row per round
    evals/run_id=<id>/part-0.parquet    one row per user, evaluation and draw
    events/run_id=<id>/part-0.parquet   failures, replacements, drop-outs, stragglers
    actors/run_id=<id>/part-0.parquet   which node, process and GPU hosted which users

Every row carries every configuration value as a column, with one fixed
Arrow type per column (from :class:`~perfed_ray.config.RunConfig`), so files
of different runs always read back as one table. A flush rewrites the run's
file with the new rows appended: written under a dot-name that readers skip,
then renamed into place, so at any instant, crashes included, a reader sees
one complete file per table and run, and a finished run is a few files of
kilobytes (a part file per flush cost 100 files and 1.2 MB per 1000-round run,
nearly all of it repeated Parquet footers). The rows a checkpoint has not yet
counted are cut off when a run is resumed (:meth:`RunWriter.resume`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from perfed_ray import faults
from perfed_ray.config import CORE, RunConfig, component_settings
from perfed_ray.errors import ConfigError, first_line

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

TABLES = {
    "runs": RUNS_SCHEMA,
    "rounds": ROUNDS_SCHEMA,
    "evals": EVALS_SCHEMA,
    "events": EVENTS_SCHEMA,
    "actors": ACTORS_SCHEMA,
}
APPENDED = [name for name in TABLES if name != "runs"]  # tables that grow as the run goes


def table_schema(name: str) -> pa.Schema:
    """A table's full schema as read back: configuration, its own columns, run_id."""
    return pa.unify_schemas([CONFIG_SCHEMA, TABLES[name], pa.schema([("run_id", pa.string())])])


def write_atomically(
    path: Path, write: Callable[[Path], None], before_rename: Callable[[], None] | None = None
) -> None:
    """Write a file so that readers see all of it or none of it, even after a crash:
    `write` fills a temporary dot-file (which readers skip), which is synced and then
    renamed into place. A write that fails (a full disk) removes its temporary file, so
    that the space it took is there for the run's status."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        write(tmp)
        with open(tmp, "rb") as written:
            os.fsync(written.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if before_rename:
        before_rename()
    os.replace(tmp, path)


def check_rows(out: Path, run_id: str, rows: Mapping[str, int], round_: int) -> None:
    """Refuse (ConfigError) to continue a run whose table files hold fewer rows than its
    checkpoint of round `round_` counts (`rows`): a lost or damaged file would otherwise
    be continued as if its rows had never existed. Names the first such file."""
    for name in APPENDED:
        counted = rows.get(name, 0)
        path = Path(out) / name / f"run_id={run_id}" / RunWriter.FILE
        if counted == 0:
            continue
        try:
            held = pq.read_metadata(path).num_rows
        except FileNotFoundError:
            problem = "is missing"
        except (OSError, pa.ArrowException) as err:
            problem = f"cannot be read ({first_line(err)})"
        else:
            if held >= counted:
                continue
            problem = f"holds {held} rows"
        raise ConfigError(
            f"{path} {problem}; the run's checkpoint of round {round_} counts {counted} rows "
            f"there: restore the file, or start the run again"
        )


class RunWriter:
    """Buffers one run's rows and appends them to its table files as the run goes."""

    FILE = "part-0.parquet"

    def __init__(self, out: Path, run_id: str, cfg: RunConfig) -> None:
        self.out = Path(out)
        self.run_id = run_id
        self.config = cfg.to_dict()
        self.config_schema = config_schema(cfg)
        self.buffers: dict[str, list[pa.Table]] = {name: [] for name in APPENDED}
        # What each table's file holds, kept so that a flush appends without reading it back.
        self.written: dict[str, pa.Table | None] = dict.fromkeys(APPENDED)
        self.writes = 0
        for name in TABLES:
            self.folder(name).mkdir(parents=True, exist_ok=True)

    @property
    def rows(self) -> dict[str, int]:
        """Rows on disk per table: what a checkpoint counts."""
        return {
            name: 0 if table is None else table.num_rows for name, table in self.written.items()
        }

    def resume(self, rows: Mapping[str, int]) -> None:
        """Continue after the checkpoint that counted `rows` rows per table: rows
        written after it (and temporary files of an interrupted write) are removed, so
        the rounds replayed from the checkpoint are neither lost nor written twice.
        Rows still buffered belong to those rounds too, and are dropped."""
        for name in APPENDED:
            self.buffers[name].clear()
            self.written[name] = None
            for path in self.folder(name).iterdir():
                if path.name != self.FILE:
                    path.unlink()
            path, kept = self.folder(name) / self.FILE, rows.get(name, 0)
            if not path.exists():
                continue
            if kept == 0:
                path.unlink()
                continue
            table = pq.read_table(path)
            if table.num_rows > kept:
                table = table.slice(0, kept)
                write_atomically(path, lambda tmp, t=table: pq.write_table(t, tmp))
            self.written[name] = table

    def folder(self, table: str) -> Path:
        return self.out / table / f"run_id={self.run_id}"

    def _table(self, name: str, rows: Iterable[Mapping[str, Any]] | pa.Table) -> pa.Table:
        """The rows (dicts, or a table of the table's own columns) with the run's
        configuration in front, each value one repeated column (not copied into every
        row: a million users' evaluation stays arrays)."""
        own = self._own(name, rows)  # run_id: the folder
        config = [
            pa.repeat(pa.scalar(self.config[f.name], f.type), own.num_rows)
            for f in self.config_schema
        ]
        schema = pa.unify_schemas([self.config_schema, TABLES[name]])
        return pa.Table.from_arrays([*config, *own.columns], schema=schema)

    def _write(self, table: pa.Table, path: Path) -> None:
        self.writes += 1
        write_atomically(
            path,
            lambda tmp: pq.write_table(table, tmp),
            lambda: faults.crash_at("driver-write", self.writes),
        )

    def write_run(self, row: Mapping[str, Any]) -> None:
        """(Re)write the run's single row: at the start, and with its final status."""
        self._write(self._table("runs", [row]), self.folder("runs") / self.FILE)

    @staticmethod
    def _own(name: str, rows: Iterable[Mapping[str, Any]] | pa.Table) -> pa.Table:
        if isinstance(rows, pa.Table):
            return rows.select(TABLES[name].names).cast(TABLES[name])
        return pa.Table.from_pylist(list(rows), schema=TABLES[name])

    def add(self, table: str, rows: Iterable[Mapping[str, Any]] | pa.Table) -> None:
        self.buffers[table].append(self._own(table, rows))

    def flush(self) -> None:
        """Append the buffered rows to each table's file, rewritten whole from the rows
        held here (kilobytes to a few megabytes, next to minutes of training between
        flushes)."""
        for name, rows in self.buffers.items():
            if rows:
                held, new = self.written[name], self._table(name, pa.concat_tables(rows))
                table = new if held is None else pa.concat_tables([held, new])
                self._write(table, self.folder(name) / self.FILE)
                self.written[name] = table
                rows.clear()
