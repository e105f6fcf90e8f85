"""A run's life, owned by one object from start to end, so that what a run's status is
and what it exits with are decided in one place for the CLI, the Python API and sweeps.

:class:`RunLife` claims a run (its lock: one driver at a time), checks before Ray starts
that a stopped run can be continued (its record, checkpoint and result files), keeps
the runs row saying `running` while it runs and then how it ended (whatever ended it:
a full disk while the last rows are written included), keeps the traceback of an
unexpected failure, and cleans up (the lock, and the folder of a run that never got
as far as its record). :func:`status_of` turns what ended a run into its status, and
:data:`~perfed_ray.results.schema.EXIT_CODES` a status into the command's exit status.
"""

from __future__ import annotations

import re
import secrets
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from perfed_ray import config as configuration
from perfed_ray.errors import ConfigError, first_line
from perfed_ray.results.layout import (
    CHECKPOINTS,
    RUNS,
    SAFE_ID,
    TABLES,
    run_folder,
    traceback_log,
)
from perfed_ray.results.reader import read_table
from perfed_ray.results.writer import check_rows
from perfed_ray.runtime.checkpoint import Checkpoint, RunRecord, RunStore, locate
from perfed_ray.runtime.lock import Busy, RunLock

if TYPE_CHECKING:
    from perfed_ray.results.writer import RunWriter


def status_of(err: BaseException | None) -> str:
    """The runs table's status of a run that ended with `err` (None: it ran every round)."""
    if err is None:
        return "finished"
    if isinstance(err, KeyboardInterrupt):  # Ctrl-C, SIGTERM, a sweep interrupted
        return "interrupted"
    from perfed_ray.runtime.rounds import Diverged, Stopped  # torch: only once a run ran

    if isinstance(err, Stopped):
        return "stopped"
    return "diverged" if isinstance(err, Diverged) else "failed"


def expected(err: BaseException) -> bool:
    """Whether a run ended the way runs are meant to be able to end (its message says
    it all), rather than by a defect whose traceback is worth keeping."""
    from perfed_ray.runtime.pool import RunLost

    return status_of(err) != "failed" or isinstance(err, RunLost)


def new_run_id(algorithm: str) -> str:
    """Sortable by start time, unique across concurrent runs, and a safe folder name
    whatever the algorithm is called (`mypkg.methods:Reptile` -> `mypkg-methods-Reptile`)."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", algorithm)
    return f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{name}-{secrets.token_hex(3)}"


def recorded(out: Path, run_id: str) -> tuple[str | None, str | None]:
    """The status and error the runs table holds for a run; (None, None) without a row."""
    runs = read_table(out, RUNS, run_id)
    if runs.empty:
        return None, None
    return runs["status"].iloc[0], runs["error"].iloc[0]


class RunLife:
    """One run from its claim to its end: `new` or `resume` claims it (exit 2 for what
    cannot be run), `running` brackets its rounds, `close` (or leaving a `with` block)
    lets go of it."""

    def __init__(
        self,
        out: Path,
        run_id: str,
        record: RunRecord | None = None,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self.out, self.run_id = Path(out), run_id
        self.store = RunStore(self.out, run_id)
        self.record = record  # the stopped run's, when resuming
        self.checkpoint = checkpoint  # its last, when resuming (None: before the first)
        self.lock = RunLock(self.store.folder)
        self.writer: RunWriter | None = None
        self.row: dict[str, Any] = {}
        self.unwritten: Exception | None = None  # why the final runs row could not be written
        self.made_out = not self.out.exists()  # a run that never starts leaves no --out

    @property
    def resumed(self) -> bool:
        return self.record is not None

    @classmethod
    def new(cls, out: str | Path, run_id: str) -> RunLife:
        """Claim a new run: its id must be a safe folder name and new in `out` (a run
        that exists, its record saved, is continued, never started again)."""
        if not SAFE_ID.fullmatch(run_id):
            raise ConfigError(
                f"run id {run_id!r} is not allowed: letters, digits, '-' and '_' only"
            )
        life = cls(Path(out), run_id)
        if life.store.started:
            raise ConfigError(
                f"run {run_id} already exists in {out}: continue it with --resume "
                f"{life.store.folder}"
            )
        life._claim("run")
        return life

    @classmethod
    def resume(
        cls,
        run_dir: str | Path,
        given: configuration.RunConfig | None,
        changes: Mapping[str, Any],
        out: str | Path | None = None,
    ) -> RunLife:
        """Claim the stopped run `run_dir` names after checking that it can and should be
        continued: nobody else runs it, its record and checkpoint are whole, its result
        files hold every row the checkpoint counts, and `given` (a whole configuration)
        or `changes` (some keys) agree with the configuration it was started with."""
        folder, run_id = locate(run_dir)
        if out is not None and Path(out).resolve() != folder.resolve():
            raise ConfigError(
                f"--out {str(out)!r} differs from the folder of the run being "
                f"resumed ({folder}): drop --out"
            )
        life = cls(folder, run_id)
        life._claim("resumed")
        try:
            life.record = life.store.load_record()
            life.checkpoint = life.store.load()
            life._check(given, changes)
        except BaseException:
            life.close()
            raise
        return life

    @property
    def config(self) -> configuration.RunConfig:
        """The configuration a resumed run was started with."""
        return configuration.from_mapping(self.record.config)

    def _claim(self, doing: str) -> None:
        try:
            self.lock.acquire(doing)
        except Busy as busy:
            raise ConfigError(
                f"run {self.run_id} is being {busy.doing} by process {busy.pid}: "
                f"wait for it to end, or stop it first"
            ) from None

    def _check(self, given: configuration.RunConfig | None, changes: Mapping[str, Any]) -> None:
        stored = self.config
        if given is not None or changes:
            given = given or configuration.from_mapping({**stored.to_dict(), **changes})
            now = given.to_dict()
            changed = [
                (k, v, now.get(k))
                for k, v in stored.to_dict().items()
                if now.get(k) != v
                # an auto value the run made concrete (an engine, a noise multiplier)
                and not (now.get(k) is None and configuration.spec(k).auto)
            ]
            if changed:
                k, old, new = changed[0]
                more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
                raise ConfigError(
                    f"--resume: run {self.run_id} was started with a different "
                    f"configuration: {k} = {old!r} there, {new!r} here{more}; give "
                    f"--resume alone to continue it as it was, or start a new run"
                )
        status, error = recorded(self.out, self.run_id)
        if status == "finished":
            raise ConfigError(
                f"run {self.run_id} already finished all {stored.rounds} rounds: nothing to resume"
            )
        if status == "diverged":
            raise ConfigError(
                f"run {self.run_id} diverged ({error}); resuming would diverge again: "
                f"start a new run with a smaller beta or alpha"
            )
        if self.checkpoint is not None:
            check_rows(self.out, self.run_id, self.checkpoint.rows, self.checkpoint.round)

    @contextmanager
    def running(self, writer: RunWriter, row: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """The runs row says `running` while the body runs, then how it ended; yields the
        row, for the body to add what it measures. Whatever ends the body, its rows so
        far are written and the row says so; if the disk refuses even that,
        :attr:`unwritten` says why the row could not be (and a run that had finished
        fails with that error)."""
        self.writer, self.row = writer, {**row, "status": "running"}
        writer.write_run(self.row)  # if this fails, nothing says `running`: just raise
        try:
            yield self.row
        except BaseException as err:
            self._end(err)
            raise
        self._end(None)

    def _end(self, err: BaseException | None) -> None:
        status, failure = status_of(err), None
        try:
            self.writer.flush()  # the rows so far
        except Exception as failed:  # a full disk: the status must still be written
            if err is None:
                status, failure = "failed", failed
        cause = err or failure
        self.row.update(
            status=status,
            error=None if cause is None else first_line(cause),
            ended_at=datetime.now(UTC),
        )
        try:
            self.writer.write_run(self.row)
        except Exception as failed:  # the row on disk is the last one written
            self.unwritten = failed
        if cause is not None and not expected(cause):
            self._keep_traceback(cause)
        if err is None and (failure or self.unwritten):
            raise failure or self.unwritten

    def _keep_traceback(self, err: BaseException) -> None:
        log = traceback_log(self.out, self.run_id)
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text("".join(traceback.format_exception(err)))
        except OSError:
            pass  # a full disk: the runs row, or the message, says what happened

    def close(self) -> None:
        """Let go of the run: its lock, and the empty folders of a new run that stopped
        before its record was written (nothing there to continue)."""
        never_started = not self.store.started
        self.lock.release(remove=never_started)
        if never_started:
            tables = [run_folder(self.out, t, self.run_id) for t in TABLES]
            for folder in [self.store.folder, *tables]:
                for empty in (folder, folder.parent):  # the run's, then the table's
                    if empty.is_dir() and not any(empty.iterdir()):
                        empty.rmdir()
            for empty in (self.out / CHECKPOINTS, self.out):
                if self.made_out and empty.is_dir() and not any(empty.iterdir()):
                    empty.rmdir()

    def __enter__(self) -> RunLife:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
