"""How long a run on a cluster takes to go on after one of its worker nodes dies, and
whether its rows are still those of a local run.

    python experiments/bench/node_loss.py [--rounds 40] [--kill-at 15] [--smoke] [--out DIR]

For each case, a head and two worker nodes from `cluster/local.sh` (its own state
folder and ports): `room`, two CPUs a node, so a replacement actor finds a free CPU;
`no room`, one CPU a node, all three taken by the run's actors, so the replacement
shares a survivor's CPU. The run is the paper's FedAvg on 60 IID MNIST users, 12 a
round, 20 users an actor (three actors, one a node), checkpoints every 10 rounds,
`perfed-ray run --address`; once its progress shows round `--kill-at`, every process of
a worker node hosting an actor is SIGKILLed (`cluster/local.sh kill-node`). The head
gives the node up with Ray's own health checks (a check every 3 s, dead after 5 missed:
the figures include them) unless `--fast-detection` shortens them as the tests do.

Recorded per case: the round in flight when the node died (its `node-died` event's),
how long that round took (from the kill to its end it took at most that: the time from
the node's death to the next round finishing) beside the median round, whether the
replacement actors host the lost ones' users on surviving nodes, and whether the
run's `rounds` and `evals` equal those of the same run on a local Ray. `--smoke`: 12
users, 8 rounds, the kill at round 3, fast detection, one case.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd
import ray
import yaml
from common import RESULTS
from report import publish

from perfed_ray.analysis import read_table
from perfed_ray.api import simulate
from perfed_ray.config import load

LOCAL_SH = Path(__file__).resolve().parents[2] / "cluster" / "local.sh"
RUN = {
    "dataset": "mnist",
    "partition": "iid",
    "algorithm": "fedavg",
    "n_users": 60,
    "fraction": 0.2,
    "users_per_actor": 20,
    "checkpoint_every": 10,
    "eval_every": 10,
    "final_eval_draws": 2,
    "data_transport": "data_root",
}
SMOKE = {"n_users": 12, "fraction": 0.5, "users_per_actor": 4, "eval_every": 2}
FAST_DETECTION = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "5",
}
CASES = {"room": "2", "no room": "1"}  # CPUs a node


def _local_sh(env: dict[str, str], *args: str) -> str:
    done = subprocess.run(
        ["bash", str(LOCAL_SH), *args], env=env, capture_output=True, text=True, timeout=300
    )
    if done.returncode != 0:
        raise RuntimeError(f"local.sh {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def worker_with_an_actor(state: Path) -> int:
    """The index of a worker node (not the head) of the cluster in `state` whose session
    runs a user actor (cluster/local.sh kill-node's I)."""
    for i, line in enumerate((state / "pids").read_text().splitlines()):
        pid, name = line.split()
        ps = subprocess.run(["ps", "-o", "args=", "-s", pid], capture_output=True, text=True)
        if name != "head" and "UserActor" in ps.stdout:
            return i
    raise RuntimeError("no worker node hosts a user actor")


def one_case(config: Path, cpus: str, kill_at: int, fast: bool, out: Path) -> dict:
    """A cluster up, the run with a worker node killed at round `kill_at`, the cluster
    down; the run's figures."""
    state = Path(tempfile.mkdtemp(prefix="pnl-", dir="/tmp"))  # short: Ray's sockets
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PERFED_CLUSTER_DIR": str(state),
        "PERFED_CLUSTER_PORT": str(6700 + 100 * int(cpus)),
        "PERFED_CLUSTER_CPUS": cpus,
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": secrets.token_hex(32),
        **(FAST_DETECTION if fast else {}),
    }
    env.pop("RAY_ADDRESS", None)
    try:
        _local_sh(env, "up", "2")
        address = f"127.0.0.1:{env['PERFED_CLUSTER_PORT']}"
        command = [sys.executable, "-m", "perfed_ray.cli", "run", str(config)]
        run = subprocess.Popen(
            [*command, "--address", address, "--out", str(out)],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
            env=env,
        )
        for line in run.stderr:
            shown = line.split()[1].split("/")[0] if line.startswith("round ") else "0"
            if int(shown) >= kill_at:
                _local_sh(env, "kill-node", str(worker_with_an_actor(state)))
                break
        run.stderr.read()
        if run.wait(timeout=900) != 0:
            raise RuntimeError(f"the run on the cluster failed (exit {run.returncode})")
    finally:
        _local_sh(env, "down")
        shutil.rmtree(state, ignore_errors=True)
    events = read_table(out, "events")
    died = events[events["kind"] == "node-died"]
    rounds = read_table(out, "rounds").set_index("round")["wall_seconds"]
    in_flight = int(died["round"].min())
    actors = read_table(out, "actors")
    replaced = actors[actors["incarnation"] == 1]
    return {
        "node_died_in_round": in_flight,
        "actors_lost": len(died),
        # the replacements host the lost actors' users, on nodes that survived
        "replacements_keep_users": sorted(u for us in replaced["users"] for u in us)
        == sorted(u for us in died["users"] for u in us),
        "replacements_on_survivors": not any(
            node in detail for node in replaced["node_id"] for detail in died["detail"]
        ),
        "recovery_round_seconds": float(rounds.get(in_flight, float("nan"))),
        "median_round_seconds": float(rounds.median()),
        "detail": died["detail"].iloc[0],
    }


def same_rows(out: Path, local: Path) -> bool:
    """Whether the run's rounds and evals equal the local run's, every number."""
    for table, keys in (("rounds", ["round"]), ("evals", ["round", "user", "draw"])):
        metrics = ["train_loss"] if table == "rounds" else ["acc_after", "loss_after"]
        a, b = (
            read_table(folder, table).sort_values(keys).reset_index(drop=True)[keys + metrics]
            for folder in (out, local)
        )
        if not a.equals(b):
            return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--kill-at", type=int, default=15)
    parser.add_argument("--fast-detection", action="store_true")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    values = {**RUN, "rounds": args.rounds}
    cases, kill_at, fast = CASES, args.kill_at, args.fast_detection
    if args.smoke:
        values, kill_at, fast = {**values, **SMOKE, "rounds": 8}, 3, True
        cases = {"no room": CASES["no room"]}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "run.yaml"
        config.write_text(yaml.safe_dump(values))
        for case, cpus in cases.items():
            out = Path(folder) / case.replace(" ", "-")
            figures = one_case(config, cpus, kill_at, fast, out)
            rows.append({"case": case, "node_cpus": int(cpus), "kill_at": kill_at, **figures})
            print(rows[-1], flush=True)
        if not ray.is_initialized():
            ray.init(num_cpus=2)
        simulate(load(config), Path(folder) / "local", progress=False)
        for row, case in zip(rows, cases, strict=True):
            row["same_rows_as_local"] = same_rows(
                Path(folder) / case.replace(" ", "-"), Path(folder) / "local"
            )
    for row in rows:
        row.update(rounds=values["rounds"], n_users=values["n_users"], fast_detection=fast)
    print(pd.DataFrame(rows).drop(columns="detail").to_string(index=False))
    publish(rows, "node_loss", args.out)


if __name__ == "__main__":
    main()
