"""`perfed-ray report`: the extended Table 1, learning curves and per-group accuracies,
regenerated from a results folder's Parquet alone.

Writes into the report folder:

- `table1.md`: per section (see :mod:`perfed_ray.report.cells`) one row per
  Table 1 row and one column per method, each cell the mean over seeds with
  two 95% intervals, the paper's figure and the difference in points;
- `curves/<section>-<row>.png`: accuracy against round and against seconds;
- `groups.md`: group A / group B accuracies before and after adaptation;
- `runs.md`: every run, its status and its own interval over draws.
"""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from perfed_ray.analysis import summary
from perfed_ray.config.schema import FIELDS
from perfed_ray.display import format_summary
from perfed_ray.errors import InputError
from perfed_ray.markdown import table
from perfed_ray.paper import ROW_KEYS, TABLE1, describe
from perfed_ray.report.cells import (
    METHODS,
    NORMALIZED_HF,
    TABLE_KEYS,
    Cell,
    cells,
    finished,
    ordered_methods,
    run_results,
)
from perfed_ray.report.curves import plot, run_curves
from perfed_ray.results.layout import EVALS, ROUNDS
from perfed_ray.results.reader import read_table

PROTOCOL_SCALE = FIELDS["input_scale"].default

SECTIONS = {
    "main": "Table 1 (protocol as in docs/PROTOCOL.md)",
    "leaking": "FedAvg adapted on TEST data (`adapt_on: test`): leaks test labels, "
    "the paper's FedAvg text; not comparable with the main table",
    "study": "Study: input scaling and HF's difference step",
}
LEGEND = (
    "Each cell: mean over training seeds of the final personalised accuracy (%), "
    "± the 95% t interval over seeds (from the per-seed means), [± the 95% t interval "
    "over the final evaluation's adaptation draws of all seeds pooled, which is what the "
    "paper's ± seems to be]; then the paper's figure and our difference in points. "
    "Only finished runs give accuracies; diverged runs (NaN or infinite weights or "
    "losses, the round given) and unfinished ones are counted, never averaged. "
    "'not run': no run of that cell in the results."
)


def reproduces_table1(runs: pd.DataFrame) -> bool:
    """Whether some run is on one of Table 1's rows (its data set, split, tau and alpha):
    only then is the report Table 1's, its six rows shown whether run or not. A folder
    of one's own runs gets a table of its own settings alone."""
    rows = {tuple(r) for r in runs[list(ROW_KEYS)].itertuples(index=False)}
    return bool(rows & set(TABLE1))


def _section_rows(section: str, runs: pd.DataFrame) -> list[tuple]:
    """The table rows of a section: Table 1's six rows first for the main and leaking
    sections of a Table 1 report (shown even when not run); in the study, each studied
    row on the protocol's inputs first (see `_cell`), then on the other scales."""
    present = {
        tuple(r) for r in runs.loc[runs["section"] == section, TABLE_KEYS].itertuples(index=False)
    }
    if section == "study":
        present |= {(section, *r[1:5], PROTOCOL_SCALE) for r in present}
        return sorted(present, key=lambda r: (str(r[1:5]), r[5] != PROTOCOL_SCALE, r[5]))
    if section in ("main", "leaking") and reproduces_table1(runs):
        fixed = [(section, *row, PROTOCOL_SCALE) for row in TABLE1]
        return fixed + sorted(present - set(fixed), key=str)
    return sorted(present, key=str)


def _cell(by_cell: dict[tuple, Cell], row: tuple, method: str) -> Cell:
    """A cell of a table row. The study's row on the protocol's inputs holds the main
    table's runs beside HF with delta / ||g||, so the baseline and the variant sit in
    one row."""
    cell = by_cell.get((*row, method))
    if cell is None and row[0] == "study" and row[5] == PROTOCOL_SCALE:
        cell = by_cell.get(("main", *row[1:], method))
    return cell or Cell()


def _methods(section: str, runs: pd.DataFrame) -> list[str]:
    """A section's columns: the methods that ran in it, and in a Table 1 report the
    paper's methods and exact Per-FedAvg (main) or FedAvg (leaking) whether run or not."""
    ran = set(runs.loc[runs["section"] == section, "method"])
    if section == "main" and reproduces_table1(runs):
        return ordered_methods({*METHODS, *ran} - {NORMALIZED_HF})
    if section == "leaking" and reproduces_table1(runs):
        return ordered_methods({"fedavg", *ran})
    pick = runs["section"] == section
    if section == "study":
        pick |= runs["section"] == "main"
    return ordered_methods(runs.loc[pick, "method"])


def _paper(section: str, row: tuple, method: str) -> float | None:
    """The paper's figure for a cell, where the paper's setting is the cell's."""
    if section.startswith("other"):
        return None
    algorithm = "perfedavg-hf" if method == NORMALIZED_HF else method
    return TABLE1.get(tuple(row[1:5]), {}).get(algorithm)


def _slug(row: tuple) -> str:
    """A row's file name: letters, digits, '.', '_' and '-' only, so it needs no quoting
    in a shell or a URL (a section `other: fraction = 0.5` becomes `other-fraction-0.5`)."""
    section, dataset, partition, tau, alpha, scale = row
    name = f"{section}-{dataset}-{partition}-tau{tau}-alpha{alpha:g}-{scale}"
    return re.sub(r"[^A-Za-z0-9._]+", "-", name).strip("-")


def _label(row: tuple) -> str:
    section, *rest = row
    text = describe(tuple(rest[:4]))
    scale = rest[4]
    return text + (f", input {scale}" if section == "study" or scale != PROTOCOL_SCALE else "")


def table1_markdown(runs: pd.DataFrame) -> str:
    """Every section's table, Table 1's layout."""
    by_cell = cells(runs)
    table1 = reproduces_table1(runs)
    sections = [
        *(s for s in ("main", "leaking") if table1 or (runs["section"] == s).any()),
        *(s for s in ("study",) if (runs["section"] == s).any()),
        *sorted({s for s in runs["section"] if s.startswith("other")}),
    ]
    title = (
        "Extended Table 1 (Fallah et al. 2020), reproduced"
        if table1
        else "Final personalised accuracy of the runs, by setting"
    )
    lines = [f"# {title}", "", LEGEND, ""]
    for section in sections:
        methods = _methods(section, runs)
        title = SECTIONS.get(
            section,
            "Other settings: "
            + section[len("other: ") :]
            + (" (LEAKS TEST LABELS)" if "adapt_on = test" in section else ""),
        )
        rows = []
        for row in _section_rows(section, runs):
            texts = [_cell(by_cell, row, m).text(_paper(row[0], row, m)) for m in methods]
            where = " (protocol)" if section == "study" and row[5] == PROTOCOL_SCALE else ""
            rows.append([f"{_label(row)}{where}", *texts])
        lines += [f"## {title}", "", table(["row", *methods], rows), ""]
    lines += [
        "Learning curves: `curves/`; per-group accuracies: `groups.md`; every run: `runs.md`.",
        "",
    ]
    return "\n".join(lines)


def groups_markdown(runs: pd.DataFrame) -> str:
    """Group A (classes 0-4) and group B (mostly one class of 5-9) users' accuracy before
    and after the adaptation step: where personalisation helps."""
    done = finished(runs)
    lines = [
        "# Accuracy by group of users (final model, %, mean over seeds)",
        "",
        "Group A: users holding classes 0-4 evenly; group B: users holding mostly one "
        "class of 5-9 (docs/PROTOCOL.md). Unweighted means over the users of the group, then "
        "over finished seeds.",
        "",
    ]
    columns = [f"{m}_{g}" for g in ("A", "B") for m in ("acc_before", "acc_after")]
    rows = []
    for key, frame in done.groupby([*TABLE_KEYS, "method"], sort=True):
        values = [
            f"{100 * frame[c].mean():.2f}" if c in frame and frame[c].notna().any() else "-"
            for c in columns
        ]
        rows.append([f"{key[0]}", _label(key[:-1]), f"{key[-1]}", f"{len(frame)}", *values])
    header = ["section", "row", "method", "seeds", "A before", "A after", "B before", "B after"]
    return "\n".join([*lines, table(header, rows)]) + "\n"


def write_curves(out: Path, runs: pd.DataFrame, dest: Path) -> list[Path]:
    """One PNG per table row that has finished runs, every method in it."""
    done = finished(runs)
    if done.empty:
        return []
    curves = run_curves(read_table(out, EVALS), read_table(out, ROUNDS))
    paths = []
    for row, frame in done.groupby(TABLE_KEYS, sort=True):
        by_method = {
            m: curves[curves["run_id"].isin(frame.loc[frame["method"] == m, "run_id"])]
            for m in ordered_methods(frame["method"])
        }
        path = dest / "curves" / f"{_slug(row)}.png"
        plot(by_method, f"{_label(row)} [{row[0]}]", path)
        paths.append(path)
    return paths


def write_report(out: str | Path, dest: str | Path | None = None) -> list[Path]:
    """Write the report of results folder `out` into `dest` (default `out/report`);
    returns the files written. Raises InputError when `out` holds no runs."""
    out = Path(out)
    if not out.is_dir():
        raise InputError(f"results folder {str(out)!r} does not exist")
    runs = run_results(out)
    if runs.empty:
        raise InputError(f"no runs under {str(out)!r}: expected {out}/runs/run_id=*/")
    dest = Path(dest) if dest is not None else out / "report"
    dest.mkdir(parents=True, exist_ok=True)
    files = {
        "table1.md": table1_markdown(runs),
        "groups.md": groups_markdown(runs),
        "runs.md": "# Every run\n\n" + format_summary(summary(out), markdown=True) + "\n",
    }
    for name, text in files.items():
        (dest / name).write_text(text)
    return [dest / name for name in files] + write_curves(out, runs, dest)
