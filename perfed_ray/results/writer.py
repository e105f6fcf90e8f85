"""Writing a run's rows into the results folder's tables (:mod:`.layout`, :mod:`.schema`),
one file per table and run, hive-partitioned by run so that
``pandas.read_parquet("results/evals")`` reads every run in one call.

A flush rewrites the run's file with the new rows appended: written under a dot-name
that readers skip, then renamed into place, so at any instant, crashes included, a
reader sees one complete file per table and run, and a finished run is a few files of
kilobytes rather than a file, and its repeated Parquet footer, per flush. The rows a
checkpoint has not yet counted are cut off when a run is resumed
(:meth:`RunWriter.resume`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from perfed_ray import faults
from perfed_ray.config import RunConfig
from perfed_ray.errors import ConfigError, first_line
from perfed_ray.results.layout import APPENDED, FILE, RUNS, TABLES, run_folder
from perfed_ray.results.schema import SCHEMAS, config_schema


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
        path = run_folder(out, name, run_id) / FILE
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

    def __init__(self, out: Path, run_id: str, cfg: RunConfig) -> None:
        self.out = Path(out)
        self.run_id = run_id
        self.config = cfg.to_dict()
        self.config_schema = config_schema(cfg)
        self.buffers: dict[str, list[pa.Table]] = {name: [] for name in APPENDED}
        # What each table's file holds, kept so that a flush appends without reading it back.
        self.written: dict[str, pa.Table | None] = dict.fromkeys(APPENDED)
        self.writes = 0
        # Called with each write's new rows (the tables' own columns), once they are on
        # disk: the run's trackers (perfed_ray.tracking.feed) follow the record so.
        self.listeners: list[Callable[[dict[str, pa.Table]], None]] = []
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
                if path.name != FILE:
                    path.unlink()
            path, kept = self.folder(name) / FILE, rows.get(name, 0)
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
        return run_folder(self.out, table, self.run_id)

    def _table(self, name: str, rows: Iterable[Mapping[str, Any]] | pa.Table) -> pa.Table:
        """The rows (dicts, or a table of the table's own columns) with the run's
        configuration in front, each value one repeated column (not copied into every
        row: a million users' evaluation stays arrays)."""
        own = self._own(name, rows)  # run_id: the folder
        config = [
            pa.repeat(pa.scalar(self.config[f.name], f.type), own.num_rows)
            for f in self.config_schema
        ]
        schema = pa.unify_schemas([self.config_schema, SCHEMAS[name]])
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
        own = self._own(RUNS, [row])
        self._write(self._table(RUNS, own), self.folder(RUNS) / FILE)
        self._tell({RUNS: own})

    def _tell(self, written: dict[str, pa.Table]) -> None:
        for listener in self.listeners:
            listener(written)

    @staticmethod
    def _own(name: str, rows: Iterable[Mapping[str, Any]] | pa.Table) -> pa.Table:
        if isinstance(rows, pa.Table):
            return rows.select(SCHEMAS[name].names).cast(SCHEMAS[name])
        return pa.Table.from_pylist(list(rows), schema=SCHEMAS[name])

    def add(self, table: str, rows: Iterable[Mapping[str, Any]] | pa.Table) -> None:
        self.buffers[table].append(self._own(table, rows))

    def flush(self) -> None:
        """Append the buffered rows to each table's file, rewritten whole from the rows
        held here (kilobytes to a few megabytes, next to minutes of training between
        flushes)."""
        written = {}
        for name, rows in self.buffers.items():
            if rows:
                written[name] = own = pa.concat_tables(rows)
                held, new = self.written[name], self._table(name, own)
                table = new if held is None else pa.concat_tables([held, new])
                self._write(table, self.folder(name) / FILE)
                self.written[name] = table
                rows.clear()
        if written:
            self._tell(written)
