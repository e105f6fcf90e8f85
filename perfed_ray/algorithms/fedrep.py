"""FedRep: Collins, Hassani, Mokhtari, Shakkottai, "Exploiting Shared Representations
for Personalized Federated Learning", ICML 2021, Algorithm 1.

The model is a shared body (the representation phi) and a head h_i per user (the last
layer), which the user keeps on its actor between rounds. In a round a sampled user
takes the server's body and its own head, first trains the head alone (eq. 3's head
update, body fixed), then the body alone (its body update, head fixed), with the
client optimiser at step size beta. The server averages what it is sent, heads
included. Users are scored on their own head over the server's body and personalise
by training the head alone (step size alpha), as the paper adapts new clients
(Section 5.2); a newcomer's head is the server's, the mean of the trained heads
(`fedrep.head_start: global`), or w_0's (`initial`).

Two protocols:
- the Per-FedAvg paper's (the default): tau - `fedrep.body_steps` single-batch steps on
  the head, then `fedrep.body_steps` on the body, plain SGD;
- its authors' (lgcollins/FedRep, main_fedrep.py, models/Update.py, scripts/
  FedRep_cifar10_2shards.sh): `local_epochs: 11` split into `fedrep.head_epochs: 10`
  then `fedrep.body_epochs: 1` passes over the user's data in batches of 10
  (`--local_ep 11 --local_rep_ep 1 --local_bs 10`), SGD with lr 0.01 and momentum 0.5
  (`beta: 0.01`, `sgd: {momentum: 0.5, weight_decay: 0.0001}`); the optimiser is made
  anew in each client's train(), so its state lives for one round.

Where a user's head starts (`fedrep.head_start`): `global` (the default) takes the
server's head of the round the user first trains in (the mean of the heads trained so
far), and a user that never trained is scored with the round's server head, so a
newcomer starts from the trained heads' consensus rather than from noise; `initial`
takes w_0's head (w_0 made on each actor from the run's seed), as Algorithm 1
initialises every h_i^0 on its own, and no user ever takes the averaged head. The
authors' code looks meant for `initial` (main_fedrep.py fills `w_locals`, each user's
kept parameters, from the model before the first round) but runs `global`: those
entries are `net_glob.state_dict()`'s tensors, which share storage with the global
model's parameters (`.data` in their PyTorch 0.4.1, as `.detach()` today), and
`load_state_dict` copies each round's average into those parameters in place; so until
a user first trains, its kept head is the global model's, and it starts training (and
is scored) from the averaged head.

Their server averages every parameter it is sent, heads too, weighted by the users'
sample counts (all 1 for their CIFAR splits: a plain mean), as ours does with
`aggregation: samples`. Their weight decay applies to weights only, not biases
(`sgd: {decay_biases: false}`; PyTorch's default, decaying every parameter, is ours),
and their CIFAR data are augmented and normalised with ImageNet's statistics
(`augment: crop-flip`, `input_scale: imagenet`: data settings, since Local and FedAvg
read the same data in their code). Where we differ: their last round trains
every user and fine-tunes on `--m_ft` samples, which our evaluation's personalisation
replaces; their accuracy counts correct answers over all users' test samples together
(this project's `pooled_accuracy`) where PROTOCOL.md averages over users.

Which of the two parts a step trains is a mask on the step size driven by a step
counter in the local state (and, in epochs, each user's own count of head steps), not
Python control flow, so the method runs whole under `vmap`, the stacked engine and
`torch.compile`, where a step takes a full gradient, as FedAvg's does. One user at a
time (the sequential engine, which `engine: auto` picks for CNNs on CPU) the part is
known, and a step differentiates only that part: a head step then backpropagates
through the head alone, a third of a full step's arithmetic for the authors' CNN,
whose 10 head epochs are ten elevenths of a round. The numbers are the same either
way (the engines' tests compare the two).

Under differential privacy (`privacy: central | local`) a user shares its body alone
(`shared`): the body's update is clipped and noised, and its head never leaves its
actor, so the server's head stays w_0's (and `fedrep.head_start: global` starts a
newcomer's head there too).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from perfed_ray.algorithms.base import Algorithm, AlgorithmHParams, concrete, grad_and_loss_of
from perfed_ray.algorithms.tree import Params, per_user, tree_map
from perfed_ray.config.settings import Setting
from perfed_ray.errors import ConfigError

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig


def head_keys(params: Params) -> list[str]:
    """The head: the parameters of the model's last layer (those sharing the last
    parameter's module prefix, e.g. ``fc3.weight`` and ``fc3.bias``)."""
    last = next(reversed(params)).rpartition(".")[0]
    return [k for k in params if k.rpartition(".")[0] == last]


def _parts(params: Params) -> dict[str, list[str]]:
    head = head_keys(params)
    return {"head": head, "body": [k for k in params if k not in head]}


class FedRep(Algorithm):
    """The stream draws D, D', D'' per step like Per-FedAvg's; FedRep uses D. Its task on
    the simulated clock is FedAvg's, one batch a step, head steps and body steps alike
    (a head step backpropagates through less of the model, which the clock does not
    count)."""

    batches_per_step = 1
    draws_per_step = 3
    settings: ClassVar[dict[str, Setting]] = {
        "body_steps": Setting(
            1,
            "local steps on the body, after tau minus these on the head",
            low=1,
            legacy="fedrep_body_steps",
        ),
        "head_epochs": Setting(
            10, "with local_epochs: epochs on the head first (the authors' 10)", low=0
        ),
        "body_epochs": Setting(
            1, "with local_epochs: then epochs on the body (the authors' 1)", low=1
        ),
        "head_start": Setting(
            "global",
            "where a user's head starts: the global model's of the round the user first "
            "trains in (what the authors' code runs), or w_0's (initial)",
            choices=("global", "initial"),
        ),
    }

    @classmethod
    def validate(cls, hparams: AlgorithmHParams) -> None:
        mine, local_epochs = hparams.section, hparams.local_epochs
        epochs = mine["head_epochs"] + mine["body_epochs"]
        if local_epochs is not None and epochs != local_epochs:
            raise ConfigError(
                f"local_epochs = {local_epochs} is not fedrep.head_epochs + "
                f"fedrep.body_epochs = {epochs}: a round is the head's epochs then the body's"
            )
        if local_epochs is None and mine["body_steps"] > hparams.tau:
            raise ConfigError(
                f"fedrep.body_steps = {mine['body_steps']} exceeds tau = {hparams.tau}: "
                "a round has tau local steps, head steps first, then body steps"
            )

    def __init__(self, hparams: AlgorithmHParams | RunConfig) -> None:
        super().__init__(hparams)
        self.epochs_split = (self.settings["head_epochs"], self.settings["body_epochs"])
        self.head_steps = self.hparams.tau - self.settings["body_steps"]
        self.state_start = self.settings["head_start"]

    def init_user_state(self, start):
        return {k: start[k] for k in head_keys(start)}

    def personal_model(self, ops, server, head):
        return {k: head.get(k, v) for k, v in server.items()}

    def client_init(self, ops, server, head):
        w = self.personal_model(ops, server, head)
        parts = _parts(w)
        opt = {part: self.optimizer.init({k: w[k] for k in keys}) for part, keys in parts.items()}
        return {"w": w, "t": torch.zeros(()), "opt": opt}

    def round_steps(self, state, steps):
        """With local_epochs, a user of S batches an epoch takes head_epochs * S head
        steps of its head_epochs + body_epochs epochs' steps."""
        head, body = self.epochs_split
        return {**state, "head_steps": torch.div(steps * head, head + body, rounding_mode="floor")}

    def client_step(self, ops, state, batches):
        """A step of the client optimiser on the part this step trains: each part's
        step size is beta or 0, and its optimiser state (momentum) moves only while the
        part trains, as PyTorch's optimiser skips a frozen parameter."""
        w, t = state["w"], state["t"]
        on_body = t >= state.get("head_steps", self.head_steps)
        parts = _parts(w)
        known = concrete(on_body)
        if known is None:
            g, loss = ops.grad_and_loss(w, batches[0])
        else:
            g, loss = grad_and_loss_of(ops, w, batches[0], parts["body" if known else "head"])
        new_w, opt = dict(w), {}
        for part, keys in parts.items():
            trains = on_body if part == "body" else ~on_body
            stepped, moved = self.optimizer.step(
                {k: w[k] for k in keys},
                {k: g[k] for k in keys},
                state["opt"][part],
                self.beta * trains.to(loss.dtype),
            )
            new_w.update(stepped)
            opt[part] = tree_map(
                lambda n, o, s=trains: torch.where(per_user(s, n), n, o), moved, state["opt"][part]
            )
        return {**state, "w": new_w, "t": t + 1, "opt": opt}, loss

    def client_final(self, ops, server, state):
        w = state["w"]
        return w, {k: w[k] for k in head_keys(w)}

    def shared(self, params):
        """The body alone: under privacy the head never leaves its user (without it the
        server averages the heads too, as a starting head for newcomers)."""
        return tuple(_parts(params)["body"])

    def personalise(self, ops, model, head, batches):
        keys = head_keys(model)
        for batch in batches:
            g = ops.grad(model, batch)
            model = {k: v - self.alpha * g[k] if k in keys else v for k, v in model.items()}
        return model
