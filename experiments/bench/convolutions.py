"""User-steps per second of the CIFAR-10 CNNs: `engine: auto` beside the per-user loop,
on one thread and on Ray.

    python experiments/bench/convolutions.py [--rounds 4] [--repeats 2] [--models cnn lenet]
    python experiments/bench/convolutions.py --smoke --out /tmp/bench   # CI: seconds

Workload: CIFAR-10, paper split, n = 50 users, 10 a round, tau = 4, batch 40
(experiments/configs/table1/cifar10-tau4-alpha0.01.yaml with `model` set). Modes, per
model and algorithm:

- `loop, 1 thread`: one process, one thread, the round's users one after another (the
  `sequential` engine, no Ray);
- `auto, 1 thread`: the same with the engine `auto` chooses for this workload (10
  users on one CPU thread), measured afresh by this invocation;
- `ray loop` / `ray auto`: perfed-ray itself on the local Ray, default placement (one
  actor per core here), rounds end to end; `ray auto` measures as a run does, on the
  driver with an actor's threads and users.

The machine is shared, so the modes run in turns, `--repeats` times, and each figure is
the median of all its rounds (the first of each measurement dropped). The engine auto
chose, and the timings it chose on, are columns of the Parquet (`engine`).

Writes OUT/convolutions.parquet (default experiments/bench/results) and, for the
default OUT, refreshes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np
from common import RESULTS
from report import publish
from throughput import in_process, on_ray

from perfed_ray.config import load
from perfed_ray.engines import auto
from perfed_ray.runtime import simulation

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "experiments" / "configs" / "table1" / "cifar10-tau4-alpha0.01.yaml"
MODES = ["loop, 1 thread", "auto, 1 thread", "ray loop", "ray auto"]


def auto_engine(prepared) -> tuple[str, dict[str, float]]:
    """What `auto` picks for one process training a round's users on one thread, and
    the seconds it measured (from its cache)."""
    cfg = prepared.cfg
    source = prepared.source([])
    model = simulation.initial_model(cfg, source)
    work = auto.Workload(source.input_shape, source.n_classes, cfg.users_per_round, 1, "cpu")
    engine = auto.choose(cfg, model, work)
    entries = json.loads(auto.cache_file().read_text())
    return engine, entries[work.key(cfg, model)[0]]["seconds"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", nargs="+", default=["cnn", "lenet"])
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "perfedavg-hf"])
    parser.add_argument("--smoke", action="store_true", help="1 round, 3 users, tau 1, cnn")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sets = ["eval_every=1000000", "final_eval_draws=1"]
    if args.smoke:
        args.rounds, args.repeats, args.models, args.algorithms = 1, 1, ["cnn"], ["fedavg"]
        sets += ["n_users=6", "fraction=0.5", "tau=1"]
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        os.environ[auto.CACHE_ENV] = str(Path(cache) / "engines.json")  # measured afresh
        for model in args.models:
            for algorithm in args.algorithms:
                prepared = simulation.prepare(
                    load(CONFIG, [*sets, f"model={model}", f"algorithm={algorithm}"])
                )
                cfg = prepared.cfg
                chosen, timings = auto_engine(prepared)
                seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
                engines = {"loop, 1 thread": "sequential", "auto, 1 thread": chosen}
                for _ in range(args.repeats):
                    for mode in MODES:
                        if mode.startswith("ray "):
                            engine = "sequential" if mode == "ray loop" else None
                            took, engines[mode] = on_ray(cfg, engine, False, args.rounds)
                        else:
                            took = in_process(cfg, prepared, engines[mode], False, 1, args.rounds)
                        seconds[mode] += took
                for mode in MODES:
                    per_round = float(np.median(seconds[mode]))
                    rate = cfg.users_per_round * cfg.tau / per_round
                    rows.append(
                        {
                            "model": model,
                            "algorithm": algorithm,
                            "mode": mode,
                            "engine": engines[mode],
                            "auto_seconds": json.dumps(timings) if mode == "auto, 1 thread" else "",
                            "rounds": len(seconds[mode]),
                            "seconds_per_round": per_round,
                            "user_steps_per_second": rate,
                        }
                    )
                    print(
                        f"{model:6} {algorithm:13} {mode:16} {engines[mode]:10} {rate:7.1f}",
                        flush=True,
                    )
    publish(rows, "convolutions", args.out)


if __name__ == "__main__":
    main()
