"""Reading a population's table (devices or online intervals): a Parquet or CSV file with
a `user` column, checked whole when the configuration is read, so a bad table stops a
run with one line before Ray starts.

Tables are read on the driver, relative to the directory the run starts in. What a model
makes of a table is kept by the file's :func:`stamp` (its path, size and modification
time), since a configuration is validated several times in a run's life and a
million-user table takes seconds to read and check.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from perfed_ray.errors import ConfigError

SUFFIXES = (".parquet", ".pq", ".csv")


Stamp = tuple[str, int, int]  # a file's absolute path, size and modification time


def stamp(key: str, path: str) -> Stamp:
    """What identifies the file `key` names (``devices.file``) as it is now: what a
    table made from it is kept under. ConfigError if it is not set, of an unknown
    format or missing."""
    if not path:
        raise ConfigError(f"{key} is not set: name a Parquet or CSV file")
    file = Path(path)
    if file.suffix.lower() not in SUFFIXES:
        raise ConfigError(f"{key} = {path!r}: the file must end in .parquet, .pq or .csv")
    try:
        stat = file.stat()
    except OSError:
        raise ConfigError(f"{key} = {path!r}: no such file") from None
    return str(file.resolve()), stat.st_size, stat.st_mtime_ns


def read(key: str, path: str, columns: Sequence[str]) -> dict[str, np.ndarray]:
    """The table at `path` (named by `key`), its `columns` as arrays, `user` first as
    int64 and the others as float64, every value finite; ConfigError naming the key, the
    file and what is wrong otherwise."""
    try:
        frame = pd.read_csv(path) if path.lower().endswith(".csv") else pd.read_parquet(path)
    except Exception as err:
        text = str(err).strip().splitlines()
        raise ConfigError(
            f"{key} = {path!r} cannot be read: {text[0] if text else type(err).__name__}"
        ) from None
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise ConfigError(
            f"{key} = {path!r} has no column {', '.join(missing)}: it needs columns "
            f"{', '.join(columns)}"
        )
    if frame.empty:
        raise ConfigError(f"{key} = {path!r} has no rows")
    out = {}
    for column in columns:
        values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64)
        bad = ~np.isfinite(values)
        if column == "user":
            bad |= values != np.round(values)
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            kind = "an integer" if column == "user" else "a finite number"
            raise ConfigError(
                f"{key} = {path!r}, row {row}: {column} = {frame[column].iloc[row]!r} is not {kind}"
            )
        out[column] = values.astype(np.int64) if column == "user" else values
    return out


def check_users(key: str, path: str, users: np.ndarray, n_users: int, once: bool) -> None:
    """Every user of the run, 0 to n_users - 1, has a row (`once`: exactly one), and no
    other user has any."""
    unknown = users[(users < 0) | (users >= n_users)]
    if len(unknown):
        raise ConfigError(
            f"{key} = {path!r} has rows for user {int(unknown[0])}, which the run does not "
            f"have (users 0 to {n_users - 1}, n_users = {n_users})"
        )
    counts = np.bincount(users, minlength=n_users)
    if (counts == 0).any():
        absent = np.flatnonzero(counts == 0)
        raise ConfigError(
            f"{key} = {path!r} has no row for user {int(absent[0])} ({len(absent)} of the "
            f"run's {n_users} users missing): it needs every user 0 to {n_users - 1}"
        )
    if once and (counts > 1).any():
        raise ConfigError(
            f"{key} = {path!r} has {int(counts.max())} rows for user "
            f"{int(np.argmax(counts))}: one row per user"
        )
