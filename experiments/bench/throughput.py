"""User-steps per second on the paper's MNIST workload: every algorithm and engine,
beside a plain single-process loop and the machine's measured GEMM peak.

    python experiments/bench/throughput.py [--rounds 30] [--algorithms ...] [--no-whole-runs]
    python experiments/bench/throughput.py --smoke --out /tmp/bench   # CI: seconds, not minutes

Workload: MLP (80, 60), batch 40, tau = 10, n = 50 users (paper split), 10 users per
round (experiments/configs/table1/mnist-tau10-alpha0.01.yaml). Measured, per algorithm:

- `loop, 1 thread` / `loop, all threads`: a plain single-process loop over the round's
  users, one after another, `torch.func` gradients (the `sequential` engine, no Ray);
- `<engine>, 1 thread`: one process, one thread, the round's users in one call of the
  engine (what one actor does with its share of a round); `fused, all threads` the
  same on every core;
- `ray <engine>`: perfed-ray itself on the local Ray with its default placement (one
  actor per core here, each round's users balanced over them), rounds end to end
  (sampling, object store, aggregation); `ray fused, users on their hosts` the same
  with `balance_rounds: false`, each user trained by the actor hosting it;
- `ray <engine>, one actor x N threads`: the same with `num_cpus_per_actor` = the
  machine's cores, so one actor hosts every user and its engine uses every core.

User-steps per second = users per round x tau / seconds per round (median over rounds,
the first round, which compiles, excluded). Each figure's share of the GEMM peak
counts the paper's arithmetic: a gradient is the MLP's forward, weight-gradient and
input-gradient matrix products; FedAvg takes one a step, FO two, HF four and exact
Per-FedAvg four (its Hessian-vector product priced as two gradients). The peak is a
1024 x 1024 float32 matrix product on one thread and on all threads.

Unless --no-whole-runs: the first run of docs/index.md (1000 rounds of HF) timed from
command to summary, and a whole 300-round run beside the single-thread loop doing the
same 300 rounds of training, start-up and compilation included.

Writes OUT/throughput.parquet (default experiments/bench/results) and, for the
default OUT, refreshes BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import ray
import torch
from common import MNIST, RESULTS, timed_run
from report import publish

from perfed_ray.config import load, revise
from perfed_ray.learner import Learner
from perfed_ray.models import FlatParams, params_of
from perfed_ray.runtime import simulation
from perfed_ray.strategy import Strategy

ALGORITHMS = ["fedavg", "perfedavg-fo", "perfedavg-hf", "perfedavg"]
GRADIENTS = {"fedavg": 1, "perfedavg-fo": 2, "perfedavg-hf": 4, "perfedavg": 4}
ENGINES = [("vmap", False), ("fused", False), ("fused", True)]


def gemm_peak(threads: int, seconds: float = 2.0) -> float:
    """FLOP/s of a 1024^3 float32 matrix product on `threads` threads."""
    torch.set_num_threads(threads)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    torch.mm(a, b)
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        torch.mm(a, b)
        n += 1
    return 2 * 1024**3 * n / (time.perf_counter() - start)


def gradient_flops(model: torch.nn.Module, batch: int) -> float:
    """Matrix-product FLOPs of one gradient of the MLP on one batch."""
    sizes = [m.weight.shape for m in model.modules() if isinstance(m, torch.nn.Linear)]
    forward = sum(2 * batch * out * inp for out, inp in sizes)
    input_grads = sum(2 * batch * out * inp for out, inp in sizes[1:])
    return 2 * forward + input_grads


def label(engine: str, compile_: bool) -> str:
    return engine + (" + compile" if compile_ else "")


def in_process(
    cfg, prepared, engine: str, compile_: bool, threads: int, rounds: int, device: str = "cpu"
) -> list[float]:
    """Seconds per round of one process training each round's users in one engine call
    on `device` and averaging them (no Ray); the first round is dropped (compilation).
    The averaged weights come back to the CPU each round, as they would to the driver,
    so a GPU's queued work is done when the clock stops."""
    torch.set_num_threads(threads)
    model = simulation.initial_model(cfg, prepared.source([])).to(device)
    users = list(range(cfg.n_users))
    shards = prepared.source(users).shards(users, torch.device(device), prepared.data)
    learner = Learner(revise(cfg, engine=engine, compile=compile_), model, shards)
    flat, strategy = FlatParams(params_of(model)), Strategy(cfg)
    weights = flat.flatten(params_of(model))
    seconds = []
    for round_ in range(1, rounds + 2):
        clock = time.perf_counter()
        server = flat.unflatten(weights, device)
        models, _ = learner.train(server, strategy.sample(round_), round_)
        weights = flat.flatten({k: v.mean(0) for k, v in models.items()})
        seconds.append(time.perf_counter() - clock)
    return seconds[1:]


def on_ray(
    cfg, engine: str | None, compile_: bool, rounds: int, **changes
) -> tuple[list[float], str]:
    """Seconds per round of a perfed-ray run (default placement and balancing, or as
    `changes` to the configuration say), the first round dropped, and the engine it ran
    (`engine`, or what None, auto, resolved to)."""
    from perfed_ray.api import simulate
    from perfed_ray.results.reader import read_table

    run_cfg = revise(cfg, engine=engine, compile=compile_, rounds=rounds + 1, **changes)
    with tempfile.TemporaryDirectory() as out:
        simulate(run_cfg, out, progress=False)
        table, runs = read_table(out, "rounds"), read_table(out, "runs")
    return table.sort_values("round")["wall_seconds"].tolist()[1:], runs["engine"].iloc[0]


def timed_cli(sets: list[str]) -> dict[str, float]:
    """Seconds from `perfed-ray run` to its summary, and the seconds its rounds took."""
    seconds, rounds, _ = timed_run(MNIST, sets)
    return {"seconds": seconds, "rounds_seconds": float(rounds["wall_seconds"].sum())}


def plain_loop_run(rounds: int) -> float:
    """Seconds of the single-thread loop's whole run: data, partition and `rounds` rounds."""
    start = time.perf_counter()
    prepared = simulation.prepare(load(MNIST, [f"rounds={rounds}"]))
    in_process(prepared.cfg, prepared, "sequential", False, 1, rounds - 1)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--algorithms", nargs="+", default=ALGORITHMS, choices=ALGORITHMS)
    parser.add_argument("--no-whole-runs", action="store_true")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="2 rounds of FedAvg, 3 users, tau 2, no compilation, no whole runs",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    sets = ["eval_every=1000000", "final_eval_draws=1"]
    engines = ENGINES
    if args.smoke:
        args.rounds, args.algorithms, args.no_whole_runs = 2, ["fedavg"], True
        sets += ["n_users=6", "fraction=0.5", "tau=2"]
        engines = [e for e in ENGINES if not e[1]]
    cores = os.cpu_count() or 1
    # One actor holds every CPU of the Ray: the machine's, or those of a Ray this process
    # joined (a test session's, which may hold fewer).
    ray_cpus = int(ray.cluster_resources()["CPU"]) if ray.is_initialized() else cores
    peak = {t: gemm_peak(t, 0.5 if args.smoke else 2.0) for t in sorted({1, cores, ray_cpus})}
    rows = [
        {
            "kind": "gemm",
            "mode": f"GEMM peak, {t} thread{'s' * (t > 1)}",
            "threads": t,
            "flops_per_second": f,
        }
        for t, f in peak.items()
    ]
    print(
        f"GEMM peak: {peak[1] / 1e9:.1f} GFLOP/s on 1 thread, {peak[cores] / 1e9:.1f} on {cores}",
        flush=True,
    )
    for algorithm in args.algorithms:
        prepared = simulation.prepare(load(MNIST, [*sets, f"algorithm={algorithm}"]))
        cfg = prepared.cfg
        steps = cfg.users_per_round * cfg.tau
        model = simulation.initial_model(cfg, prepared.source([]))
        flops = GRADIENTS[algorithm] * gradient_flops(model, cfg.batch_size)
        modes = [
            ("loop, 1 thread", 1, "sequential", False),
            ("loop, all threads", cores, "sequential", False),
            *[(f"{label(e, c)}, 1 thread", 1, e, c) for e, c in engines],
            ("fused, all threads", cores, "fused", False),
            *[(f"ray {label(e, c)}", cores, e, c) for e, c in engines],
            ("ray fused, users on their hosts", cores, "fused", False),
            *[
                (f"ray {label(e, c)}, one actor x {ray_cpus} threads", ray_cpus, e, c)
                for e, c in engines
                if e == "fused"
            ],
        ]
        for mode, threads, engine, compile_ in modes:
            if not mode.startswith("ray "):
                seconds = in_process(cfg, prepared, engine, compile_, threads, args.rounds)
            elif mode.endswith("threads"):
                seconds, _ = on_ray(
                    cfg, engine, compile_, args.rounds, num_cpus_per_actor=float(ray_cpus)
                )
            else:
                hosts = {"balance_rounds": False} if mode.endswith("hosts") else {}
                seconds, _ = on_ray(cfg, engine, compile_, args.rounds, **hosts)
            per_round = float(np.median(seconds))
            rate = steps / per_round
            rows.append(
                {
                    "kind": "engine",
                    "algorithm": algorithm,
                    "mode": mode,
                    "threads": threads,
                    "rounds": args.rounds,
                    "users_per_round": cfg.users_per_round,
                    "tau": cfg.tau,
                    "seconds_per_round": per_round,
                    "user_steps_per_second": rate,
                    "flops_per_user_step": flops,
                    "share_of_peak": rate * flops / peak[threads],
                }
            )
            print(
                f"{algorithm:13} {mode:28} {rate:8.1f} user-steps/s "
                f"({100 * rate * flops / peak[threads]:.0f}% of the GEMM peak)",
                flush=True,
            )
    if not args.no_whole_runs:
        quick = timed_cli([])
        rows.append(
            {
                "kind": "whole-run",
                "mode": "quick start: 1000 rounds of HF, command to summary",
                **quick,
            }
        )
        print(f"quick start: {quick['seconds']:.1f} s", flush=True)
        whole, loop = timed_cli(["rounds=300"]), plain_loop_run(300)
        rows += [
            {"kind": "whole-run", "mode": "perfed-ray run, 300 rounds of HF", **whole},
            {
                "kind": "whole-run",
                "mode": "single-thread loop, 300 rounds of HF (training only)",
                "seconds": loop,
            },
        ]
        print(f"300 rounds: perfed-ray {whole['seconds']:.1f} s, loop {loop:.1f} s", flush=True)
    publish(rows, "throughput", args.out)


if __name__ == "__main__":
    main()
