"""What one user's local step costs in perfed-ray beside a plain PyTorch loop, on the same
thread count: issue 36's "a per-user step as cheap as a plain PyTorch step".

    python experiments/bench/step_overhead.py [--threads 1] [--repeats 15] [--models cnn]
    python experiments/bench/step_overhead.py --smoke --out /tmp/bench   # CI: seconds

Workload: CIFAR-10's shapes (3x32x32, 10 classes), batch 10, FedAvg with plain SGD
(beta 0.01), a round of `--users` users' `--tau` steps each from the server's model;
random inputs (a step's cost depends on shapes, not values). Dropout is off on every
side (the models in eval mode), so each side computes the same function. Modes, in
turns, `--repeats` rounds each, every figure a median of per-step times:

- `plain`: a plain PyTorch loop, no framework: the model's own parameters reset to the
  server's, then per step `loss.backward()` and an in-place SGD step (`p.sub_`), the
  images in PyTorch's default layout (NCHW);
- `plain, ours`: the same loop with the images laid out as our models lay them out on
  a CPU (`cpu_layout`, channels-last);
- `engine, before`: the sequential engine as it was before this benchmark:
  `torch.func.grad_and_value` over `functional_call` for each step, the SGD step's
  result in new memory, NCHW images;
- `engine, torch.func`, `engine, new memory`, `engine, NCHW`: the engine as it is but
  for one of these three;
- `engine`: the sequential engine as it is: ordinary autograd for one user's plain
  tensors, the SGD step written over the fresh gradient, channels-last images;
- `engine, actor`: the same engine inside a Ray actor of `--threads` CPUs, on a local Ray
  started with perfed-ray's own system configuration (its workers' niceness included,
  `--niceness` to override), timed inside the actor;
- `gather`: the round's batches gathered from a 5,000-sample shard as `Learner.block_batches`
  does, per step (it runs once a round before the engine).

Each process's torch threads, inter-op threads, OMP_NUM_THREADS and niceness are columns.
Each round is timed by the clock and by the calling thread's CPU time (a one-thread
step runs on it whole): on a shared machine the CPU time is the step's cost, the clock
adds whatever the other processes took.

Writes OUT/step_overhead.parquet (default experiments/bench/results) and a short note,
OUT/step_overhead.md, of the medians and ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import ray
import torch
from common import RESULTS, save
from torch import nn

from perfed_ray.algorithms.fedavg import FedAvg
from perfed_ray.config import from_mapping
from perfed_ray.data.batches import gather
from perfed_ray.engines.functional import FunctionalOps
from perfed_ray.engines.sequential import Sequential
from perfed_ray.models import build_model, params_of
from perfed_ray.registry import ALGORITHMS
from perfed_ray.runtime import local_ray

SHAPE = (3, 32, 32)


class NewMemory(FedAvg):
    """FedAvg's step as it was: the optimiser's result in new memory."""

    def client_step(self, ops, state, batches):
        g, loss = ops.grad_and_loss(state["w"], batches[0])
        w, opt = self.optimizer.step(state["w"], g, state["opt"], self.beta)
        return {"w": w, "opt": opt}, loss


SHARD = 5000


def process_facts() -> dict[str, object]:
    """The settings of this process that decide a step's speed."""
    return {
        "torch_threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS", ""),
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),
    }


def _clocks() -> tuple[float, float]:
    """(wall seconds, this thread's CPU seconds): one thread's step is all on the calling
    thread, so its CPU time leaves out the time other processes held the core."""
    return time.perf_counter(), time.thread_time()


def built(name: str, layout: torch.memory_format | None = None) -> nn.Module:
    """The model with its initial weights, dropout off; its images in `layout` on the
    CPU (None: the model's own, `cpu_layout`)."""
    model = build_model(name, SHAPE, 10, seed=0).eval()
    if layout is not None:
        model.cpu_layout = layout
    return model


class Workload:
    """One model's round: the server's model, the users' batches, the engines."""

    def __init__(self, model: str, users: int, tau: int, batch: int, threads: int) -> None:
        torch.set_num_threads(threads)
        cfg = from_mapping({"model": model, "algorithm": "fedavg", "beta": 0.01})
        self.cfg = cfg
        ours, nchw = built(model), built(model, torch.contiguous_format)
        self.server = params_of(ours)
        gen = torch.Generator().manual_seed(0)
        self.x = torch.rand(users, tau, 1, batch, 3 * 32 * 32, generator=gen)
        self.y = torch.randint(0, 10, (users, tau, 1, batch), generator=gen)
        self.shard = torch.rand(SHARD, 3 * 32 * 32, generator=gen)
        self.index = torch.randint(0, SHARD, self.y.shape[1:], generator=gen)
        algorithm, before = ALGORITHMS.load("fedavg")(cfg), NewMemory(cfg)
        self.engines = {
            "engine, before": Sequential(before, nchw),
            "engine, torch.func": Sequential(algorithm, ours),
            "engine, new memory": Sequential(before, ours),
            "engine, NCHW": Sequential(algorithm, nchw),
            "engine": Sequential(algorithm, ours),
        }
        for name in ("engine, before", "engine, torch.func"):
            engine = self.engines[name]
            engine.functional = FunctionalOps(engine.model, autograd=False)
        self.loops = {"plain": built(model, torch.contiguous_format), "plain, ours": built(model)}
        self.steps = users * tau

    def plain(self, model: nn.Module) -> float:
        """Seconds per step of a plain PyTorch loop over the round."""
        params = list(model.parameters())
        start = list(self.server.values())
        clock = _clocks()
        for u in range(self.x.shape[0]):
            with torch.no_grad():
                for p, s in zip(params, start, strict=True):
                    p.copy_(s)
            for t in range(self.x.shape[1]):
                loss = nn.functional.cross_entropy(model(self.x[u, t, 0]), self.y[u, t, 0])
                loss.backward()
                with torch.no_grad():
                    for p in params:
                        p.sub_(p.grad, alpha=self.cfg.beta)
                        p.grad = None
        return self._per_step(clock)

    def run(self, engine: Sequential) -> float:
        """Seconds per step of the engine's round."""
        clock = _clocks()
        engine.run(self.server, self.x, self.y, None)
        return self._per_step(clock)

    def gather(self) -> float:
        """Seconds per step of gathering the round's batches (one user's shard)."""
        out = torch.empty(*self.index.shape, self.shard.shape[1])
        clock = _clocks()
        for _ in range(self.x.shape[0]):
            gather(self.shard, self.index, out=out)
        return self._per_step(clock)

    def _per_step(self, clock: tuple[float, float]) -> tuple[float, float]:
        wall, cpu = _clocks()
        return (wall - clock[0]) / self.steps, (cpu - clock[1]) / self.steps

    def mode(self, name: str) -> tuple[float, float]:
        if name in self.loops:
            return self.plain(self.loops[name])
        if name == "gather":
            return self.gather()
        return self.run(self.engines[name])


@ray.remote
class Host:
    """The workload inside an actor, set up as perfed-ray's actors set themselves up
    (torch's threads = the actor's CPUs)."""

    def __init__(self, model: str, users: int, tau: int, batch: int, threads: int) -> None:
        self.work = Workload(model, users, tau, batch, threads)

    def facts(self) -> dict[str, object]:
        return process_facts()

    def step(self) -> tuple[float, float]:
        return self.work.mode("engine")


LOCAL = [
    "plain",
    "plain, ours",
    "engine, before",
    "engine, torch.func",
    "engine, new memory",
    "engine, NCHW",
    "engine",
    "gather",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["simple_cnn", "cnn", "lenet"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--tau", type=int, default=5)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--niceness", type=int, default=None, help="Ray workers' (default: ours)")
    parser.add_argument("--smoke", action="store_true", help="simple_cnn, 2 repeats of 2 steps")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.smoke:
        args.models, args.users, args.tau, args.repeats = ["simple_cnn"], 1, 2, 2
    system = dict(local_ray.SYSTEM_CONFIG)
    if args.niceness is not None:
        system["worker_niceness"] = args.niceness
    ray.init(include_dashboard=False, num_cpus=max(2, args.threads), _system_config=system)
    here = {**process_facts(), "torch_threads": args.threads}
    rows = []
    shape = (args.users, args.tau, args.batch, args.threads)
    for model in args.models:
        work = Workload(model, *shape)
        actor = Host.options(num_cpus=args.threads).remote(model, *shape)
        there = ray.get(actor.facts.remote())
        seconds: dict[str, list[tuple[float, float]]] = {m: [] for m in [*LOCAL, "engine, actor"]}
        for m in LOCAL:  # warm-up: first calls pay one-off costs
            work.mode(m)
        ray.get(actor.step.remote())
        load = os.getloadavg()[0]
        for _ in range(args.repeats):
            for m in LOCAL:
                seconds[m].append(work.mode(m))
            seconds["engine, actor"].append(ray.get(actor.step.remote()))
        load = (load + os.getloadavg()[0]) / 2
        plain = [statistics.median(c) for c in zip(*seconds["plain"], strict=True)]
        for m, times in seconds.items():
            wall, cpu = zip(*times, strict=True)
            rows.append(
                {
                    "model": model,
                    "mode": m,
                    **(there if m == "engine, actor" else here),
                    "users": args.users,
                    "tau": args.tau,
                    "batch": args.batch,
                    "repeats": len(times),
                    "load_average": load,
                    "ms_per_step": statistics.median(wall) * 1000,
                    "cpu_ms_per_step": statistics.median(cpu) * 1000,
                    "vs_plain": statistics.median(wall) / plain[0],
                    "cpu_vs_plain": statistics.median(cpu) / plain[1],
                }
            )
            r = rows[-1]
            print(
                f"{model:10} {m:20} wall {r['ms_per_step']:7.2f} ms x{r['vs_plain']:.3f}  "
                f"cpu {r['cpu_ms_per_step']:7.2f} ms x{r['cpu_vs_plain']:.3f}",
                flush=True,
            )
        ray.kill(actor)
    ray.shutdown()
    save(rows, "step_overhead", args.out)
    note(rows, args.out / "step_overhead.md")


def note(rows: list[dict], path: Path) -> None:
    """The medians and their ratios to the plain loop, as a Markdown table."""
    first = rows[0]
    lines = [
        f"# Step overhead ({first['users']} users x {first['tau']} steps, batch {first['batch']}, "
        f"{first['torch_threads']} thread(s), median of {first['repeats']} rounds, modes in turns)",
        "",
        "CPU: the calling thread's CPU time (what the step costs, whoever else holds the "
        "core); wall: the clock (what a round waits, the machine's load included).",
        "",
        "| model | mode | CPU ms/step | x plain | wall ms/step | x plain | niceness | load |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {r['model']} | {r['mode']} | {r['cpu_ms_per_step']:.2f} | {r['cpu_vs_plain']:.3f} "
        f"| {r['ms_per_step']:.2f} | {r['vs_plain']:.3f} | {r['niceness']} "
        f"| {r['load_average']:.1f} |"
        for r in rows
    ]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
