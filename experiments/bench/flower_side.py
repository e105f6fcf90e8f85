"""The Flower half of `flower.py`: FedAvg on Flower's simulation engine (Ray backend),
run in Flower's own environment; it imports flwr, torch and numpy only, never perfed-ray.

    /work/flower-env/bin/python experiments/bench/flower_side.py --data USERS.npz \
        --rounds 100 --users-per-round 10 --tau 10 --batch-size 40 --lr 0.001 --out T.json

USERS.npz (written by flower.py from perfed-ray's partition) holds user u's training
samples as `x<u>` (float32, already scaled) and `y<u>`, and the initial model as
`w:<name>` arrays. Node u of the simulation is user u. Each round the strategy samples
`--users-per-round` nodes uniformly (Flower's FedAvg); a node loads the model, runs tau
steps of plain SGD on batches of `--batch-size` drawn without replacement from its
samples, and replies with its weights counted as one example, so the aggregate is the
plain mean of the users' models, as perfed-ray's `aggregation: mean`. No federated
evaluation (`fraction_evaluate = 0`) and no server-side evaluation.

Writes to --out the seconds of each round, timed by the strategy itself (from
`configure_train` to the end of `aggregate_train`: sampling, sending, training,
replies, aggregation), the last round's mean training loss and the versions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterable
from pathlib import Path

import flwr
import numpy as np
import ray
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from torch import nn

# A node's samples, loaded once per actor process: Flower rebuilds the ClientApp for
# every message, so without this each call would read the file again.
_SAMPLES: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


class MLP(nn.Module):
    """perfed-ray's `mlp` (d -> 80 -> ELU -> 60 -> ELU -> classes), with the same
    parameter names, so its initial weights load as they are."""

    def __init__(self, features: int, classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(features, 80), nn.ELU(), nn.Linear(80, 60), nn.ELU(), nn.Linear(60, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def initial_arrays(data: Path) -> ArrayRecord:
    """perfed-ray's w_0 from the file, as Flower's record of a state dict."""
    with np.load(data) as f:
        state = {k[2:]: torch.from_numpy(f[k]) for k in f.files if k.startswith("w:")}
    return ArrayRecord(state)


def samples(data: str, user: int) -> tuple[torch.Tensor, torch.Tensor]:
    if user not in _SAMPLES:
        with np.load(data) as f:
            _SAMPLES[user] = (torch.from_numpy(f[f"x{user}"]), torch.from_numpy(f[f"y{user}"]))
    return _SAMPLES[user]


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    """tau steps of plain SGD from the server's model on the node's samples."""
    config = msg.content["config"]
    x, y = samples(str(config["data"]), int(context.node_config["partition-id"]))
    state = msg.content["arrays"].to_torch_state_dict()
    model = MLP(x.shape[1], int(state["net.4.weight"].shape[0]))
    model.load_state_dict(state)
    optimizer = torch.optim.SGD(model.parameters(), lr=float(config["lr"]))
    batch, loss_sum = int(config["batch-size"]), 0.0
    for _ in range(int(config["tau"])):
        idx = torch.randperm(len(y))[:batch]
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        loss_sum += loss.item()
    metrics = MetricRecord({"train_loss": loss_sum / int(config["tau"]), "num-examples": 1})
    reply = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics})
    return Message(content=reply, reply_to=msg)


class TimedFedAvg(FedAvg):
    """Flower's FedAvg, with each round's seconds taken at its own hooks."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.seconds: list[float] = []
        self._start = 0.0

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._start = time.perf_counter()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        out = super().aggregate_train(server_round, replies)
        self.seconds.append(time.perf_counter() - self._start)
        return out


def server(args: argparse.Namespace, n_users: int) -> ServerApp:
    """The ServerApp: FedAvg over `n_users` nodes for args.rounds rounds; writes the
    timings to args.out when the rounds are done."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        strategy = TimedFedAvg(
            fraction_train=args.users_per_round / n_users,
            min_train_nodes=args.users_per_round,
            min_available_nodes=n_users,
            fraction_evaluate=0.0,
        )
        config = {"lr": args.lr, "tau": args.tau, "batch-size": args.batch_size}
        result = strategy.start(
            grid=grid,
            initial_arrays=initial_arrays(args.data),
            num_rounds=args.rounds,
            train_config=ConfigRecord({**config, "data": str(args.data)}),
        )
        last = result.train_metrics_clientapp[args.rounds]
        report = {
            "round_seconds": strategy.seconds,
            "final_train_loss": float(last["train_loss"]),
            "flwr": flwr.__version__,
            "flower_torch": torch.__version__,
            "flower_ray": ray.__version__,
        }
        args.out.write_text(json.dumps(report))

    return app


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--users-per-round", type=int, required=True)
    parser.add_argument("--tau", type=int, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--actors", type=int, default=2, help="client actors: 1 CPU each")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with np.load(args.data) as f:
        n_users = sum(1 for k in f.files if k.startswith("y"))
    run_simulation(
        server_app=server(args, n_users),
        client_app=app,
        num_supernodes=n_users,
        backend_config={
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
            "init_args": {"num_cpus": args.actors},
        },
    )
    return 0 if args.out.exists() else 1


if __name__ == "__main__":
    # Run as the module `flower_side`, not `__main__`: the actors then import the
    # ClientApp by name (this folder is on the path Flower hands them) and keep
    # _SAMPLES across calls, instead of receiving a copy of it with every message.
    import flower_side

    sys.exit(flower_side.main())
