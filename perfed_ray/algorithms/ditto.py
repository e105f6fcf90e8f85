"""Ditto: Li, Hu, Beirami, Smith, "Ditto: Fair and Robust Federated Learning Through
Personalization", ICML 2021, Algorithm 1.

Each sampled user does both of its parts on the same batch D at every local step:
its personal model v_k, kept on its actor between rounds, takes a step on
f_k(v_k) + lambda/2 ||v_k - w^t||^2 (eq. 2's personal objective, w^t the global model
the round started from); then its copy of the global model takes a plain SGD step, as
FedAvg's would. The server averages the global copies (Algorithm 1's global update).
Users are scored on v_k.

`ditto.lambda` defaults to 1, the value of the authors' run scripts; the personal and
global steps share the step size beta and the client optimiser (plain SGD in their
code; its state lives for one round).

Where a personal model starts (`ditto.personal_start`): `global` (the default, which
the committed Ditto results ran with) starts a user's v from the global model of the
round the user first trains in, and scores a user that never trained on the round's
global model, so a user first sampled late starts near the others' consensus;
`initial` starts every v from the run's initial model w_0, as the authors' code does
(litian96/ditto, flearn/trainers_MTL/fedbase.py: its `local_models` are deep copies
of the model before the first round), and scores a user that never trained on w_0, as
theirs does. w_0 is made on each actor from the run's seed.

The authors' protocol (their run scripts, run_fashion_clean_ditto_lam1.sh and
run_vehicle_clean_ditto_lam1.sh) and what to set: lambda 1; `--local_iters` 2 (FMNIST)
or 1 (Vehicle) single-batch steps a round, batches of 16 or 32 (`tau`, `batch_size`);
TensorFlow's plain gradient descent at 0.05 or 0.01 for both parts (`beta`, no
momentum); 10 users a round drawn in proportion to their sample counts (`--sampling=2`:
`sampling: samples`); the server adds the plain mean of the users' moves; personal
models from w_0 (`ditto.personal_start: initial`). Where we still differ: their
batches come from one generator per user that runs through reshuffled passes of its
data across rounds, ours are drawn afresh each round from the user's own stream; and
they score pooled accuracy (correct answers over all users' test samples,
`pooled_accuracy`) where PROTOCOL.md averages over users.

Under differential privacy (`privacy: central | local`) a user shares its copy of the
global model alone (its update from w^t, clipped and noised); its personal model v_k,
trained on the same data, stays on its actor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from perfed_ray.algorithms.base import Algorithm, AlgorithmHParams
from perfed_ray.algorithms.tree import tree_map
from perfed_ray.config.settings import Setting

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig


class Ditto(Algorithm):
    """The stream draws D, D', D'' per step like Per-FedAvg's; Ditto uses D twice a
    step (a gradient of the personal model, one of the global copy), so its task is
    2 tau batch_size samples on the clock, or twice FedAvg's epochs' samples
    (:meth:`task_samples`)."""

    batches_per_step = 1
    draws_per_step = 3
    settings: ClassVar[dict[str, Setting]] = {
        "lambda": Setting(
            1.0, "pull of each personal model towards the global one", low=0, legacy="ditto_lambda"
        ),
        "personal_start": Setting(
            "global",
            "where a personal model starts: the global model of the round its user first "
            "trains in, or w_0 (initial: the authors' code)",
            choices=("global", "initial"),
        ),
    }

    def __init__(self, hparams: AlgorithmHParams | RunConfig) -> None:
        super().__init__(hparams)
        self.lam = self.settings["lambda"]
        self.state_start = self.settings["personal_start"]

    def task_samples(self, n_train: int) -> int:
        return 2 * super().task_samples(n_train)

    def init_user_state(self, start):
        return start

    def client_init(self, ops, server, personal):
        opt = self.optimizer.init(server)
        return {"w": server, "v": personal, "anchor": server, "opt_w": opt, "opt_v": opt}

    def client_step(self, ops, state, batches):
        batch = batches[0]
        g_v = ops.grad(state["v"], batch)
        pull = tree_map(lambda g, v, w: g + self.lam * (v - w), g_v, state["v"], state["anchor"])
        g_w, loss = ops.grad_and_loss(state["w"], batch)
        w, opt_w = self.optimizer.consuming_step(state["w"], g_w, state["opt_w"], self.beta)
        v, opt_v = self.optimizer.consuming_step(state["v"], pull, state["opt_v"], self.beta)
        return {"w": w, "v": v, "anchor": state["anchor"], "opt_w": opt_w, "opt_v": opt_v}, loss

    def client_final(self, ops, server, state):
        return state["w"], state["v"]

    def personal_model(self, ops, server, personal):
        return personal
