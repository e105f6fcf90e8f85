"""The pfl-research half of `pfl.py`: FedAvg on pfl's simulator (`SimulatedBackend`, one
process), run in pfl's own environment; it imports pfl, torch and numpy only, never
perfed-ray.

    /work/pfl-env/bin/python -P experiments/bench/pfl_side.py --users USERS.npz \
        --model simple_cnn --rounds 100 --cohort 50 --epochs 1 --batch-size 10 \
        --lr 0.1 --central-lr 1.0 --eval-every 10 [--epsilon 8 --delta 1e-6 --clip 0.4] \
        --out T.json

(-P keeps this folder off the module path: its pfl.py would hide the pfl package.)

USERS.npz (written by pfl.py from perfed-ray's partition) holds the initial model as
`w:<name>` arrays and the users in one of two layouts:

- samples: user u's training samples as `x<u>` (float32, already scaled) and `y<u>`,
  its test samples as `tx<u>`, `ty<u>` (the MNIST workload, flower.py's export);
- indices: `data_file` (a CIFAR-10 .npz of uint8 HWC images), `offset` and `divisor`
  (the per-channel input scaling) and user u's sample numbers as `train<u>`, `test<u>`
  (the CIFAR-10 workload, whose 50,000 scaled images would be 600 MB written out). The
  images are read and scaled here as pfl-research's `load_and_preprocess` does
  (float32, minus the channel's mean, over its deviation), with perfed-ray's constants.

The run follows pfl-research's benchmark (benchmarks/image_classification/pytorch/
train.py): a `FederatedDataset.from_slices` of the users with their `random` user
sampler (each cohort member drawn uniformly, with replacement), `PyTorchModel` with
torch.optim.SGD as the local optimiser and SGD at `--central-lr` on the server,
`WeightByUser` (weight_by_samples false), `FederatedAveraging`, `NNTrainHyperParams`
with `local_num_epochs` (CIFAR-10) or `local_num_steps` (MNIST: pfl walks a user's data
in order and stops after that many batches; the users' samples are shuffled each time
they are drawn here, as perfed-ray draws its batches at random), and central
evaluation on all users' test samples (`CentralEvaluationCallback`, batches of 10,000)
before training, every `--eval-every` rounds, and once more on the final model.

With --epsilon, central differential privacy as their benchmark's
`central_privacy_mechanism: gaussian_moments_accountant` builds it
(benchmarks/utils/argument_parsing.py, `parse_mechanism`, with train.py's arguments):
a `PLDPrivacyAccountant` over `--rounds` compositions of the Gaussian mechanism at
sampling probability max(cohort, noise cohort) / population, solved for the noise
multiplier z that spends --epsilon at --delta (their binary search, relative tolerance
1e-3), and `GaussianMechanism.from_privacy_accountant` with clipping bound --clip:
each user's update is clipped to L2 norm --clip, and the server adds Gaussian noise
of deviation z * noise_scale * clip to the sum (`CentrallyAppliedPrivacyMechanism`,
after `WeightByUser`), noise_scale = cohort / noise cohort. Their train.py passes
population 1e6 and noise_cohort_size 1000 (a deployment's cohort of 1,000 users of a
million, whose noise is scaled down to 50 simulated users: noise_scale 0.05); here
--population defaults to the users in USERS.npz and --noise-cohort to --cohort
(noise_scale 1), the accounting of the run as simulated.

Writes to --out each round's seconds (from the end of the previous round's callbacks to
the start of this round's, so pfl's central evaluation, a callback, is not in it: user
sampling, local training, weighting, aggregation and the server's step are), the final
model's mean loss and accuracy on the test samples, the versions and, with --epsilon,
the accountant's noise multiplier, sampling probability and seconds to calibrate.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch
from pfl.aggregate.simulate import SimulatedBackend
from pfl.aggregate.weighting import WeightByUser
from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
from pfl.callback.base import TrainingProcessCallback
from pfl.callback.central_evaluation import CentralEvaluationCallback
from pfl.data import FederatedDataset
from pfl.data.dataset import Dataset
from pfl.data.sampling import get_user_sampler
from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
from pfl.metrics import Metrics, Weighted
from pfl.model.pytorch import PyTorchModel
from pfl.privacy import (
    CentrallyAppliedPrivacyMechanism,
    GaussianMechanism,
    PLDPrivacyAccountant,
)
from torch import nn

EVAL_BATCH = 10_000  # their central_eval_batch_size


class Classifier(nn.Module):
    """What pfl's PyTorchModel asks of a model: `loss` (training mode unless `eval`)
    and `metrics`, as their benchmark's image_classification_loss and _metrics."""

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:
        self.train(not eval)
        return nn.functional.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict:
        self.train(not eval)
        logits = self(x)
        loss = nn.functional.cross_entropy(logits, y, reduction="sum").item()
        correct = (logits.argmax(-1) == y).sum().item()
        return {"loss": Weighted(loss, len(y)), "accuracy": Weighted(correct, len(y))}


class MLP(Classifier):
    """perfed-ray's `mlp` (d -> 80 -> ELU -> 60 -> ELU -> classes), its parameter names."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        features, classes = state["net.0.weight"].shape[1], state["net.4.weight"].shape[0]
        self.net = nn.Sequential(
            nn.Linear(features, 80), nn.ELU(), nn.Linear(80, 60), nn.ELU(), nn.Linear(60, classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SimpleCNN(Classifier):
    """pfl-research's `simple_cnn` on channels-first images, with perfed-ray's parameter
    names (its `simple_cnn`): conv 3x3 to 32, ReLU, conv 3x3 to 64, ReLU, max-pool 2,
    dropout 0.25, flatten, dense 128, ReLU, dropout 0.5, dense to the classes. Theirs
    takes channels-last batches and permutes each; these images are channels-first once,
    when they are read."""

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        channels = state["features.0.weight"].shape[1]
        flat, classes = state["classifier.0.weight"].shape[1], state["classifier.3.weight"].shape[0]
        self.features = nn.Sequential(
            nn.Conv2d(channels, 32, 3),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
            nn.Flatten(),
        )
        self.classifier = nn.Sequential(
            nn.Linear(flat, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, classes)
        )
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        side = round((x[0].numel() / self.channels) ** 0.5)
        return self.classifier(self.features(x.view(-1, self.channels, side, side)))


MODELS = {"mlp": MLP, "simple_cnn": SimpleCNN}


def users(path: Path) -> tuple[dict, list[tuple[torch.Tensor, torch.Tensor]], dict]:
    """Each user's (x, y) training tensors, each user's test tensors, and w_0."""
    with np.load(path) as f:
        state = {k[2:]: torch.from_numpy(f[k]) for k in f.files if k.startswith("w:")}
        if "data_file" not in f.files:  # samples
            ids = sorted(int(k[1:]) for k in f.files if k.startswith("y"))
            train = {u: (f[f"x{u}"], f[f"y{u}"]) for u in ids}
            test = [(f[f"tx{u}"], f[f"ty{u}"]) for u in ids]
        else:  # indices into a CIFAR-10 file, scaled as their load_and_preprocess does
            with np.load(str(f["data_file"])) as d:
                x = {s: d[f"x_{s}"] for s in ("train", "test")}
                y = {s: d[f"y_{s}"].astype(np.int64) for s in ("train", "test")}
            offset, divisor = f["offset"].astype(np.float32), f["divisor"].astype(np.float32)
            x = {s: ((v.astype(np.float32) - offset) / divisor) for s, v in x.items()}
            x = {s: np.ascontiguousarray(v.transpose(0, 3, 1, 2)) for s, v in x.items()}
            ids = sorted(int(k[5:]) for k in f.files if k.startswith("train"))
            train = {u: (x["train"][f[f"train{u}"]], y["train"][f[f"train{u}"]]) for u in ids}
            test = [(x["test"][f[f"test{u}"]], y["test"][f[f"test{u}"]]) for u in ids]
    tensors = {u: (torch.from_numpy(a), torch.from_numpy(b)) for u, (a, b) in train.items()}
    return tensors, [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in test], state


def federated(train: dict, shuffle: bool) -> FederatedDataset:
    """pfl's FederatedDataset of the users, sampled by their `random` user sampler; with
    `shuffle`, a user's samples come in a fresh order each time it is drawn."""
    if not shuffle:
        return FederatedDataset.from_slices(train, get_user_sampler("random", list(train)))

    def make(user: int) -> Dataset:
        x, y = train[user]
        order = torch.from_numpy(np.random.permutation(len(y)))
        return Dataset((x[order], y[order]), user_id=user)

    return FederatedDataset(make, get_user_sampler("random", list(train)))


def central_privacy(
    args: argparse.Namespace, population: float
) -> tuple[CentrallyAppliedPrivacyMechanism, dict]:
    """Their `gaussian_moments_accountant` (module doc) and what it computed."""
    noise_cohort = args.noise_cohort or args.cohort
    noise_scale = args.cohort / noise_cohort
    start = time.perf_counter()
    accountant = PLDPrivacyAccountant(
        num_compositions=args.rounds,
        sampling_probability=max(args.cohort, noise_cohort) / population,
        mechanism="gaussian",
        epsilon=args.epsilon,
        delta=args.delta,
        noise_scale=noise_scale,
    )
    facts = {
        "noise_multiplier": float(accountant.noise_parameter),
        "epsilon": float(accountant.epsilon),
        "cohort_noise_multiplier": float(accountant.cohort_noise_parameter),
        "sampling_probability": float(accountant.sampling_probability),
        "accountant_population": float(population),
        "noise_cohort": noise_cohort,
        "calibration_seconds": time.perf_counter() - start,
    }
    mechanism = GaussianMechanism.from_privacy_accountant(accountant, args.clip)
    return CentrallyAppliedPrivacyMechanism(mechanism), facts


class RoundStart(TrainingProcessCallback):
    """Last of the callbacks: the next round starts when it returns."""

    def __init__(self) -> None:
        self.at = 0.0

    def on_train_begin(self, *, model: PyTorchModel) -> Metrics:
        self.at = time.perf_counter()
        return Metrics()

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self.at = time.perf_counter()
        return False, Metrics()


class RoundEnd(TrainingProcessCallback):
    """First of the callbacks: the round's training and the server's step are done."""

    def __init__(self, start: RoundStart) -> None:
        self.start, self.seconds = start, []

    def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
        self.seconds.append(time.perf_counter() - self.start.at)
        return False, Metrics()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=Path, required=True)
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--rounds", type=int, required=True)
    parser.add_argument("--cohort", type=int, required=True)
    parser.add_argument("--epochs", type=int, help="local epochs (else --steps)")
    parser.add_argument("--steps", type=int, help="local steps (else --epochs)")
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True, help="local learning rate")
    parser.add_argument("--central-lr", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, help="torch's threads (default: torch's choice)")
    parser.add_argument("--epsilon", type=float, help="central DP's budget (default: no DP)")
    parser.add_argument("--delta", type=float, default=1e-6, help="their central_delta")
    parser.add_argument("--clip", type=float, default=0.4, help="their clipping bound")
    parser.add_argument("--population", type=float, help="the accountant's (default: users)")
    parser.add_argument(
        "--noise-cohort", type=int, help="their noise_cohort_size (default: cohort)"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # as their train.py
    np.random.seed(args.seed)

    train, test, state = users(args.users)
    module = MODELS[args.model](state)
    module.load_state_dict(state)
    postprocessors, privacy = [WeightByUser()], {}
    if args.epsilon is not None:
        mechanism, privacy = central_privacy(args, args.population or len(train))
        postprocessors.append(mechanism)
    params = [p for p in module.parameters() if p.requires_grad]
    model = PyTorchModel(
        model=module,
        local_optimizer_create=torch.optim.SGD,
        central_optimizer=torch.optim.SGD(params, args.central_lr),
    )
    backend = SimulatedBackend(
        training_data=federated(train, shuffle=args.steps is not None),
        val_data=None,
        postprocessors=postprocessors,
    )
    central = Dataset(
        (torch.cat([x for x, _ in test]), torch.cat([y for _, y in test])), user_id="central"
    )
    eval_params = NNEvalHyperParams(local_batch_size=EVAL_BATCH)
    start = RoundStart()
    end = RoundEnd(start)
    callbacks = [end, CentralEvaluationCallback(central, eval_params, args.eval_every), start]
    FederatedAveraging().run(
        algorithm_params=NNAlgorithmParams(
            central_num_iterations=args.rounds,
            evaluation_frequency=args.eval_every,
            train_cohort_size=args.cohort,
            val_cohort_size=0,
        ),
        backend=backend,
        model=model,
        model_train_params=NNTrainHyperParams(
            local_learning_rate=args.lr,
            local_num_epochs=args.epochs,
            local_num_steps=args.steps,
            local_batch_size=args.batch_size,
        ),
        model_eval_params=eval_params,
        callbacks=callbacks,
    )
    final = model.evaluate(central, lambda name: name, eval_params)
    report = {
        "round_seconds": end.seconds,
        "final_test_loss": float(final["loss"].overall_value),
        "final_test_accuracy": float(final["accuracy"].overall_value),
        "pfl": version("pfl"),
        "pfl_torch": torch.__version__,
        "pfl_threads": torch.get_num_threads(),
        **privacy,
    }
    args.out.write_text(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
