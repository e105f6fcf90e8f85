"""Reading the results tables back, whichever version of perfed-ray wrote them.

A table is read with the current schema joined with every file's own, so a column
added since reads back as nulls instead of hiding; :func:`read_runs` then gives the
runs of older versions the values they ran with (a key's default, a setting's old
flat column). One unreadable file is skipped with a warning instead of hiding every
run.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from perfed_ray.config import FIELDS, legacy_keys, registered_settings
from perfed_ray.errors import UnreadableFile, first_line
from perfed_ray.results.layout import RUNS
from perfed_ray.results.schema import table_schema


def _skip(path: Path, why: str) -> None:
    # One place of warning: each file is warned of once per process, however often read.
    warnings.warn(f"skipped {path}: {why}", UnreadableFile, stacklevel=1)


def _readable(folder: Path, run_id: str | None) -> list[tuple[Path, pa.Schema]]:
    """The Parquet files of a table's run folders (one run's with `run_id`) and their
    schemas. A file that is not a table's, or cannot be read (corrupt, truncated), is
    skipped with one warning naming it, so that one bad file does not hide every run;
    hidden files (writes in progress) are skipped silently."""
    runs = sorted(folder.iterdir()) if run_id is None else [folder / f"run_id={run_id}"]
    paths = [
        path
        for entry in runs
        if not entry.name.startswith(".")
        for path in (
            sorted(entry.iterdir())
            if entry.is_dir() and entry.name.startswith("run_id=")
            else [entry]
        )
    ]
    files = []
    for path in paths:
        if path.name.startswith(".") or not path.exists():
            continue
        if path.is_dir() or not path.parent.name.startswith("run_id=") or path.suffix != ".parquet":
            _skip(path, f"not a results file ({folder}/run_id=<id>/*.parquet)")
            continue
        try:
            files.append((path, pq.read_schema(path)))
        except (OSError, pa.ArrowException) as err:
            _skip(path, f"not a readable Parquet file ({first_line(err)})")
    return files


def read_table(out: str | Path, table: str, run_id: str | None = None) -> pd.DataFrame:
    """One results table across every run under `out` (empty if there is none yet).

    Reads with the current schema joined with every file's own (components' settings
    are columns of their runs alone), so files written before a column existed read
    back with nulls there instead of hiding the column. Files that cannot be read are
    skipped, each with one warning (:class:`~perfed_ray.errors.UnreadableFile`).
    """
    folder = Path(out) / table
    files = _readable(folder, run_id) if folder.is_dir() else []
    if not files:
        return pd.DataFrame()
    schema = pa.unify_schemas(
        [table_schema(table), *(s for _, s in files)], promote_options="permissive"
    )
    data = ds.dataset(
        [str(f) for f, _ in files],
        schema=schema,
        format="parquet",
        partitioning="hive",
        partition_base_dir=str(folder),
    )
    return data.to_table().to_pandas()


def read_runs(out: str | Path, run_id: str | None = None, *, settings: bool = True) -> pd.DataFrame:
    """The runs table with configuration values that older results lack (a key added
    later reads back as null) filled in with the key's default, which is what those
    runs used. Without `settings`, only the core keys are: components' settings are
    read through every registered component, whose import brings torch (seconds of
    CPU), which a reader of the core columns alone (a run's summary, in the trackers'
    process at each run's end) does not need."""
    runs = read_table(out, RUNS, run_id)
    for name, f in FIELDS.items():
        if f.default is None or runs.empty:
            continue
        if name not in runs:  # a key added after every run here was made
            runs[name] = f.default
        elif runs[name].isna().any():
            runs[name] = runs[name].fillna(f.default)
    if not settings:
        return runs
    # Runs from before components declared their settings kept them in flat columns
    # (`pfedme_lr`): they are read as the setting of the run's own method.
    for old, dotted in legacy_keys().items():
        if old in runs:
            mine = runs["algorithm"] == dotted.partition(".")[0]
            values = runs[old].where(mine)
            runs[dotted] = runs[dotted].fillna(values) if dotted in runs else values
            runs = runs.drop(columns=old)
    # A setting a component declared later reads back, for that component's runs, as
    # its default (what they ran with), so a finished run still matches its config.
    for dotted, (key, component, setting) in registered_settings().items():
        if key not in runs:
            continue
        mine = runs[key] == component
        if not mine.any():
            continue
        if dotted not in runs:
            runs[dotted] = pd.Series([None] * len(runs), index=runs.index, dtype=object)
        if setting.default is not None:
            runs.loc[mine & runs[dotted].isna(), dotted] = setting.default
    return runs
