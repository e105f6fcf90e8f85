"""The fused engine's local-step speed in this checkout beside another (a baseline
commit), side by side: one process per measurement, alternating in ABBA order, so
that a busy machine, or whichever process runs second, slows both alike.

    git worktree add /tmp/baseline 08a2306      # the commit to compare with
    python experiments/bench/versus.py --baseline /tmp/baseline [--repeats 5]

Workload: the paper's MLP, 10 users of a round in one call of the `fused` engine (what
an actor does with its share), tau = 10 steps of batch 40, one thread, plain SGD
(FedAvg) and Per-FedAvg (HF). Prints user-steps per second for each checkout and
their ratio (median over repeats); writes OUT/versus.parquet.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

MEASURE = """
import json, time, torch
torch.set_num_threads(1)
from perfed_ray.config import from_mapping
from perfed_ray.engines import make_engine
from perfed_ray.models import build_model, params_of
from perfed_ray.registry import ALGORITHMS
cfg = from_mapping({"algorithm": __ALGORITHM__, "tau": 10, "engine": "fused"})
model = build_model("mlp", (1, 28, 28), 10, seed=0)
engine = make_engine("fused", ALGORITHMS.load(__ALGORITHM__)(cfg), model, False)
server = params_of(model)
gen = torch.Generator().manual_seed(0)
per_step = 3 if __ALGORITHM__.startswith("perfedavg") else 1
x = torch.rand(10, 10, per_step, 40, 784, generator=gen)
y = torch.randint(0, 10, (10, 10, per_step, 40), generator=gen)
for _ in range(3):
    engine.run(server, x, y, None)
times = []
for _ in range(__CALLS__):
    start = time.perf_counter()
    engine.run(server, x, y, None)
    times.append(time.perf_counter() - start)
times.sort()
print(json.dumps({"user_steps_per_second": 100 / times[len(times) // 2]}))
"""


def measure(checkout: Path, algorithm: str, calls: int) -> float:
    code = MEASURE.replace("__ALGORITHM__", repr(algorithm)).replace("__CALLS__", str(calls))
    env = {**os.environ, "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": "1"}
    # run in the checkout: `-c` puts the working folder first on the path, so from
    # another checkout's root its package would be the one measured
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        cwd=checkout,
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["user_steps_per_second"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the other checkout")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--algorithms", nargs="+", default=["fedavg", "perfedavg-hf"])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    rows = []
    for repeat in range(args.repeats):
        for algorithm in args.algorithms:
            pair = [("baseline", args.baseline), ("this", REPO)]
            for name, checkout in pair if repeat % 2 == 0 else pair[::-1]:  # ABBA order
                speed = measure(checkout, algorithm, args.calls)
                rows.append(
                    {"repeat": repeat, "algorithm": algorithm, "checkout": name, "speed": speed}
                )
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_parquet(args.out / "versus.parquet")
    medians = table.pivot_table(
        index="algorithm", columns="checkout", values="speed", aggfunc="median"
    )
    medians["ratio"] = medians["this"] / medians["baseline"]
    print(medians.round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
