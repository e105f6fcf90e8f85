"""pFedMe's authors' own code on its own data, run in its own environment.

pFedMe (Dinh, Tran and Nguyen, NeurIPS 2020; github.com/CharlieDinh/pFedMe) reports
its MNIST numbers from users that its generator (data/Mnist/generate_niid_20users.py)
makes, and from its own training code (main.py). This script runs both unchanged,
given a checkout of their repository and a Python environment that has their
dependencies, so that perfed-ray's runs can be set beside theirs on exactly their
users (`dataset: leaf`, `partition: natural`, `n_users: 20`):

    python experiments/reproduction/pfedme_authors.py generate --checkout /tmp/pfedme
    python experiments/reproduction/pfedme_authors.py train --checkout /tmp/pfedme \\
        --algorithm pFedMe --times 3

Two things of their environment are stood in for, in their process, before their
script runs, and nothing of their code is changed:
- sklearn's `fetch_openml('mnist_784')` needs the network; it is answered from the
  local MNIST IDX files, as OpenML gives them: the 60,000 training images then the
  10,000 test images, float64 pixels 0-255 in a DataFrame, labels '0'-'9' as strings;
- `torchvision` is imported by their utils/model_utils.py but used only for CIFAR-10;
  PyPI's torchvision wheels are CUDA builds that do not load beside a CPU-only torch,
  so a module that fails when used stands in for it.

Their code runs in a copy of the checkout (`--work`), since it writes its data and
results relative to its working folder. This file imports only the standard library
at its top, because part of it (`inside-*`) runs under the authors' Python.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve()
DEFAULT_ENV = Path("/tmp/authors-env")
DEFAULT_WORK = Path("/tmp/pfedme-authors-work")
DEFAULT_DATA = REPO / "data" / "pfedme-mnist-20users"
DEFAULT_RESULTS = REPO / "experiments" / "results" / "reproduction" / "authors"
MNIST_RAW = Path(os.environ.get("PERFED_DATA", REPO.parent / "shared" / "data")) / "MNIST" / "raw"
GENERATOR = Path("data/Mnist/generate_niid_20users.py")
DATA_FOLDER = Path("data/Mnist/data")  # where the generator writes and main.py reads

# The README's MNIST, strongly convex (mclr) command lines, without --times.
README_ARGS = {
    "pFedMe": "--dataset Mnist --model mclr --batch_size 20 --learning_rate 0.005 "
    "--personal_learning_rate 0.1 --beta 1 --lamda 15 --num_global_iters 800 "
    "--local_epochs 20 --algorithm pFedMe --numusers 5",
    "FedAvg": "--dataset Mnist --model mclr --batch_size 20 --learning_rate 0.005 "
    "--num_global_iters 800 --local_epochs 20 --algorithm FedAvg --numusers 5",
}


# --- inside the authors' environment -------------------------------------------------


def read_idx(path: Path) -> Any:
    """An IDX file (MNIST's format) as a numpy array of its shape."""
    import numpy as np

    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def openml_frames(raw: Path) -> tuple[Any, Any]:
    """The data and target of OpenML's mnist_784 as `fetch_openml` gives them (as_frame
    auto, with pandas), from the IDX files: 70,000 rows, training images first, float64
    pixels `pixel1`..`pixel784`, and the `class` target, a categorical of '0'-'9'."""
    import numpy as np
    import pandas as pd

    images = np.concatenate(
        [read_idx(raw / f"{s}-images-idx3-ubyte.gz") for s in ("train", "t10k")]
    ).reshape(-1, 784)
    labels = np.concatenate(
        [read_idx(raw / f"{s}-labels-idx1-ubyte.gz") for s in ("train", "t10k")]
    )
    names = [f"pixel{i}" for i in range(1, 785)]
    data = pd.DataFrame(images.astype(np.float64), columns=names)
    target = pd.Series(
        pd.Categorical(labels.astype(str), categories=[str(i) for i in range(10)]), name="class"
    )
    return data, target


def openml_mnist(raw: Path) -> Any:
    """What `fetch_openml('mnist_784')` returns: :func:`openml_frames` in sklearn's Bunch."""
    from sklearn.utils import Bunch

    data, target = openml_frames(raw)
    return Bunch(
        data=data,
        target=target,
        frame=None,
        feature_names=list(data.columns),
        target_names=["class"],
        DESCR="MNIST from the local IDX files, in OpenML mnist_784's order",
        categories=None,
        details={"name": "mnist_784", "id": "554"},
        url="",
    )


def stand_in_torchvision() -> None:
    """A `torchvision` whose every attribute fails when used (their MNIST path never
    uses it)."""

    class Absent(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            raise RuntimeError(f"torchvision.{name} is not available in this environment")

    module = Absent("torchvision")
    module.transforms = Absent("torchvision.transforms")
    sys.modules["torchvision"] = module
    sys.modules["torchvision.transforms"] = module.transforms


def openml_arrays(raw: Path) -> Any:
    """`fetch_openml('mnist_784')` as scikit-learn before 0.24 gave it, and so as the
    generator of May 2020 expects it: numpy arrays, float64 pixels, labels as strings."""
    bunch = openml_mnist(raw)
    bunch.data = bunch.data.to_numpy()
    bunch.target = bunch.target.astype(str).to_numpy().astype(object)
    return bunch


def inside_generate(raw: Path, script: Path, form: str) -> None:
    """Run their generator with fetch_openml answered from `raw`, as a DataFrame
    (scikit-learn 0.24 on, as their current generator expects) or as arrays."""
    import sklearn.datasets

    fetch = openml_mnist if form == "frame" else openml_arrays
    sklearn.datasets.fetch_openml = lambda *args, **kwargs: fetch(raw)
    sys.argv = [str(script)]
    runpy.run_path(str(script), run_name="__main__")


def inside_main(args: list[str]) -> None:
    """Run their main.py (in the working folder) with the torchvision stand-in."""
    stand_in_torchvision()
    sys.path.insert(0, os.getcwd())
    sys.argv = ["main.py", *args]
    runpy.run_path("main.py", run_name="__main__")


def inside_h5(paths: list[str]) -> None:
    """Print their result files' series as JSON."""
    import h5py

    out = {}
    for path in paths:
        with h5py.File(path, "r") as f:
            out[Path(path).name] = {k: [float(v) for v in f[k][:]] for k in f}
    print(json.dumps(out))


# --- outside: the driver -------------------------------------------------------------


def authors_python(env: Path) -> Path:
    python = env / "bin" / "python"
    if not python.is_file():
        sys.exit(f"no Python at {python}: make the authors' environment first (see --help)")
    return python


def prepare_work(checkout: Path, work: Path) -> None:
    """A copy of their checkout to run in (their code writes beside itself)."""
    if not (checkout / "main.py").is_file() or not (checkout / GENERATOR).is_file():
        sys.exit(f"{checkout} is not a checkout of CharlieDinh/pFedMe (no main.py, {GENERATOR})")
    if not work.exists():
        shutil.copytree(checkout, work, ignore=shutil.ignore_patterns(".git", "*.mat"))


def commit_of(checkout: Path) -> str:
    """Their repository's commit, from the checkout's git or a COMMIT file beside it."""
    found = subprocess.run(
        ["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True
    )
    if found.returncode == 0:
        return found.stdout.strip()
    marker = checkout / "COMMIT"
    return marker.read_text().strip() if marker.is_file() else "unknown"


def in_env(python: Path, args: list[str], cwd: Path, log: Path) -> tuple[float, list[float]]:
    """Run this file's `inside-*` command under their Python, nice and on one thread,
    its output into `log`; the seconds it took, and when each of their runs began."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    env.pop("PYTHONPATH", None)
    start, marks = time.perf_counter(), []
    with log.open("w") as out:
        proc = subprocess.Popen(
            ["nice", "-n", "10", str(python), "-u", str(HERE), *args],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for line in proc.stdout:
            out.write(line)
            if "Running time:" in line:
                marks.append(time.perf_counter() - start)
        if proc.wait():
            sys.exit(f"their code failed (exit {proc.returncode}): see {log}")
    return time.perf_counter() - start, marks


def generate(a: argparse.Namespace) -> None:
    prepare_work(a.checkout, a.work)
    if a.generator:  # another version of their generator, run in its place
        shutil.copy2(a.generator, a.work / GENERATOR)
    folder = a.work / GENERATOR.parent
    seconds, _ = in_env(
        authors_python(a.env),
        ["inside-generate", str(a.mnist.resolve()), str((a.work / GENERATOR).resolve()), a.openml],
        folder,
        a.work / "generate.log",
    )
    for split in ("train", "test"):
        (a.out / split).mkdir(parents=True, exist_ok=True)
        for f in (a.work / DATA_FOLDER / split).glob("*.json"):
            shutil.copy2(f, a.out / split / f.name)
    print(f"their generator took {seconds:.0f} s; LEAF folder: {a.out}")


def collect(
    python: Path, work: Path, algorithm: str, since: float
) -> dict[str, dict[str, list[float]]]:
    """Their per-run result files of `algorithm` written since `since` (not averages)."""
    files = sorted(
        str(p)
        for p in (work / "results").glob(f"Mnist_{algorithm}_*.h5")
        if p.stat().st_mtime >= since and not p.name.endswith("_avg.h5")
    )
    out = subprocess.run(
        [str(python), str(HERE), "inside-h5", *files], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def curves(series: dict[str, dict[str, list[float]]]) -> Any:
    """One row per (their result file's model, run, round): the accuracies and loss."""
    import pandas as pd

    rows = []
    for name, values in series.items():
        match = re.match(r"Mnist_(\w+?)_\d.*_(\d+)\.h5$", name)
        model, run = match.group(1), int(match.group(2))
        for r, acc in enumerate(values["rs_glob_acc"]):
            rows.append(
                {
                    "model": model,  # pFedMe_p: personalised; pFedMe, FedAvg: global
                    "run": run,
                    "round": r,
                    "test_acc": acc,
                    "train_acc": values["rs_train_acc"][r],
                    "train_loss": values["rs_train_loss"][r],
                }
            )
    return pd.DataFrame(rows)


def train(a: argparse.Namespace) -> None:
    import pandas as pd

    prepare_work(a.checkout, a.work)
    python = authors_python(a.env)
    args = README_ARGS[a.algorithm].split()
    if a.rounds:
        args[args.index("--num_global_iters") + 1] = str(a.rounds)
    args += ["--times", str(a.times), "--gpu", "-1"]
    since = time.time()
    log = a.work / f"{a.algorithm}.log"
    seconds, marks = in_env(python, ["inside-main", *args], a.work, log)
    frame = curves(collect(python, a.work, a.algorithm, since))
    frame.insert(0, "algorithm", a.algorithm)
    a.results.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(a.results / f"{a.algorithm.lower()}_curves.parquet", index=False)
    ends = [*marks[1:], seconds]
    run = {
        "algorithm": a.algorithm,
        "command": "python3 main.py " + " ".join(args),
        "commit": commit_of(a.checkout),
        "seconds": seconds,
        "seconds_per_run": [b - s for s, b in zip(marks, ends, strict=False)],
        # their own averages, as main.py prints them (pFedMe: personalised model first)
        "printed": [x for x in log.read_text().splitlines() if x.startswith(("Mean:", "std:"))],
    }
    (a.results / f"{a.algorithm.lower()}_run.json").write_text(json.dumps(run, indent=1))
    best = frame.groupby(["model", "run"])["test_acc"].max().unstack("run")
    print(pd.DataFrame(best).to_string(), f"\n{seconds:.0f} s", sep="\n")


SCORING = (
    "Their code's own rule (FLAlgorithms/servers/serverbase.py, utils/plot_utils.py): every "
    "round, each of the 20 users' models (pFedMe_p: the personalised model theta after "
    "that round's local training of all users; pFedMe, FedAvg: the global model sent that "
    "round) is scored on the user's whole test set; the round's accuracy is the correct "
    "answers summed over all users divided by all test samples. A run's figure is its best "
    "round; the reported number (main.py's printed `Mean`) is the mean of those over runs."
)


def best_rounds(frame: Any) -> Any:
    """Per model and run: the best round's accuracy (their figure), the round, the last
    round's, and the mean of the last ten."""
    rows = []
    for (model, run), f in frame.sort_values("round").groupby(["model", "run"]):
        acc = f["test_acc"].to_numpy()
        best = int(acc.argmax())
        rows.append(
            {
                "model": model,
                "run": run,
                "best": acc[best],
                "best_round": int(f["round"].iloc[best]),
                "last": acc[-1],
                "last10": acc[-10:].mean(),
            }
        )
    import pandas as pd

    return pd.DataFrame(rows)


def summary(a: argparse.Namespace) -> None:
    """summary.md of a results folder: what ran, and their figures run by run."""
    import pandas as pd

    lines = ["# pFedMe's authors' code: MNIST, MLR", "", SCORING, ""]
    for meta_path in sorted(a.results.glob("*_run.json")):
        meta = json.loads(meta_path.read_text())
        frame = pd.read_parquet(
            meta_path.with_name(meta_path.name.replace("_run.json", "_curves.parquet"))
        )
        table = best_rounds(frame)
        best = table.rename(
            columns={"best": "best_accuracy", "last": "last_accuracy", "last10": "last10_accuracy"}
        )
        for column in ("best_accuracy", "last_accuracy", "last10_accuracy"):
            best[column] = 100 * best[column]  # in %, as papers print them
        best.to_parquet(meta_path.with_name(meta_path.name.replace("_run.json", "_best.parquet")))
        lines += [
            f"## {meta['algorithm']}",
            "",
            f"Their commit {meta['commit']}; in their environment, one thread, `nice`:",
            "",
            f"    {meta['command']}",
            "",
            f"{meta['seconds']:.0f} s in all; per run: "
            + ", ".join(f"{t:.0f} s" for t in meta["seconds_per_run"])
            + ". Their printed averages: "
            + "; ".join(f"`{x}`" for x in meta["printed"])
            + ".",
            "",
            "| model | run | best round's accuracy | best round | last round | mean of last 10 |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for r in table.itertuples():
            lines.append(
                f"| {r.model} | {r.run} | {100 * r.best:.2f} | {r.best_round} | "
                f"{100 * r.last:.2f} | {100 * r.last10:.2f} |"
            )
        for model, t in table.groupby("model"):
            lines.append(
                f"| {model} | mean ± sd | {100 * t['best'].mean():.2f} ± "
                f"{100 * t['best'].std(ddof=0):.2f} | | {100 * t['last'].mean():.2f} | "
                f"{100 * t['last10'].mean():.2f} |"
            )
        lines.append("")
    lines += [
        "Standard deviations are over runs with ddof 0, as their `np.std`. Per-round curves: "
        "`*_curves.parquet` (model, run, round, test_acc, train_acc, train_loss); per run: "
        "`*_best.parquet` (model, run, best_accuracy, best_round, last_accuracy, "
        "last10_accuracy; accuracies in %).",
        "",
    ]
    (a.results / "summary.md").write_text("\n".join(lines))
    print(a.results / "summary.md")


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    inside = {
        "inside-generate": lambda r: inside_generate(Path(r[0]), Path(r[1]), r[2]),
        "inside-main": inside_main,
        "inside-h5": inside_h5,
    }
    if argv and argv[0] in inside:
        inside[argv[0]](argv[1:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("generate", "train"):
        p = sub.add_parser(name)
        p.add_argument("--checkout", type=Path, required=True, help="their repository")
        p.add_argument("--env", type=Path, default=DEFAULT_ENV, help="their environment")
        p.add_argument("--work", type=Path, default=DEFAULT_WORK, help="where their code runs")
    sub.choices["generate"].add_argument("--mnist", type=Path, default=MNIST_RAW)
    sub.choices["generate"].add_argument("--out", type=Path, default=DEFAULT_DATA)
    sub.choices["generate"].add_argument(
        "--generator", type=Path, help="another version of their generate_niid_20users.py"
    )
    sub.choices["generate"].add_argument(
        "--openml",
        choices=("frame", "arrays"),
        default="frame",
        help="fetch_openml's answer: a DataFrame (scikit-learn >= 0.24) or numpy arrays",
    )
    t = sub.choices["train"]
    t.add_argument("--algorithm", choices=sorted(README_ARGS), default="pFedMe")
    t.add_argument("--times", type=int, default=3, help="runs, as their --times")
    t.add_argument("--rounds", type=int, default=0, help="their --num_global_iters (0: 800)")
    t.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    sub.add_parser("summary").add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    a = parser.parse_args(argv)
    {"generate": generate, "train": train, "summary": summary}[a.command](a)


if __name__ == "__main__":
    main()
