"""The interface every federated algorithm implements, built-in or a user's own.

In the spirit of FedJAX's ``FederatedAlgorithm``: an algorithm is a value whose client
side is three small functions (``client_init``, ``client_step``, ``client_final``)
and whose server side says how the users' aggregated results become the next model.
It computes through a :class:`ModelOps`, never through a model or an engine
directly, so one definition runs one user at a time, under ``vmap``, or for a block of
users whose parameters are stacked (see :mod:`perfed_ray.engines`), on CPU or GPU.
Nothing here knows about Ray, actors or files.

Per-user state (a personal model, a personal head) is what ``init_user_state``
returns; it is kept with the user on the actor that hosts it between rounds and is
saved with every checkpoint, so a resumed run continues exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, Self

import torch

from perfed_ray.algorithms.tree import Params, Scalar, per_user, sgd, tree_map
from perfed_ray.config.owners import HParams
from perfed_ray.config.schema import RunConfig
from perfed_ray.config.settings import Setting
from perfed_ray.data.batches import steps_in
from perfed_ray.registry import ALGORITHMS, CLIENT_OPTIMIZERS

if TYPE_CHECKING:
    from perfed_ray.optimizers.client import ClientOptimizer

Batch = tuple[torch.Tensor, torch.Tensor]  # inputs, labels


class ModelOps(Protocol):
    """The model's maths as an algorithm may use it. An engine supplies it: by
    ``torch.func`` for one user (and under ``vmap``), or by batched matrix products for
    users stacked along a leading axis, where every result has that axis too."""

    def loss(self, params: Params, batch: Batch) -> torch.Tensor:
        """f(w; D), the mean cross-entropy over the batch."""

    def grad_and_loss(self, params: Params, batch: Batch) -> tuple[Params, torch.Tensor]:
        """(grad f(w; D), f(w; D))."""

    def grad(self, params: Params, batch: Batch) -> Params:
        """grad f(w; D)."""

    def hvp(self, params: Params, batch: Batch, v: Params) -> Params:
        """H(w; D) v, exactly (forward-over-reverse autodiff)."""

    def grad_difference(self, params: Params, v: Params, step: Scalar, batch: Batch) -> Params:
        """grad f(w + step v; D) - grad f(w - step v; D) (an engine may share work
        between the two)."""

    def norm(self, tree: Params) -> torch.Tensor:
        """The Euclidean norm of a whole tree (per user)."""

    def inner(self, a: Params, b: Params) -> torch.Tensor:
        """<a, b> over whole trees, per user (a scalar for one user, [U] for users stacked
        along a leading axis): APFL's mixing weight's gradient."""


@dataclass(frozen=True, kw_only=True)
class AlgorithmHParams(HParams):
    """What every algorithm reads of a run: the step sizes alpha (of personalisation)
    and beta (of the local steps), the round's local work (tau steps or local_epochs
    passes, of batches of batch_size), the client optimiser of its local steps, and its
    own section (``self.settings``). A method that reads more core keys subclasses it as
    its ``HParams`` (Per-FedAvg (HF): `delta`, `hf_delta`)."""

    key: ClassVar[str] = "algorithm"
    alpha: float
    beta: float
    tau: int
    local_epochs: int | None
    batch_size: int
    optimizer: ClientOptimizer

    @classmethod
    def of(cls, cfg: RunConfig, **made: Any) -> Self:
        """Also the client optimiser the run names, made from its own section."""
        optimizer = CLIENT_OPTIMIZERS.load(cfg.client_optimizer)(cfg)
        return super().of(cfg, optimizer=optimizer, **made)


class Algorithm:
    """A federated algorithm: FedAvg's shape unless a method overrides a part.

    Made from its `HParams` (pure data), on the driver and on every actor.
    `batches_per_step` independent batches are drawn for each local step from the
    user's training shard, from the user's own random stream; `tau` steps make a
    round. `draws_per_step`, if larger, is how many the stream draws per step (the
    rest unused), so that methods compared on one seed see the same batches.
    `personalise_batches` fresh batches are drawn for each personalisation step.
    """

    batches_per_step: ClassVar[int] = 1
    draws_per_step: ClassVar[int | None] = None
    # Whether the method can run its local work in epochs (`local_epochs`) instead of
    # tau steps: not Per-FedAvg, whose steps draw three batches each, as its paper does.
    epochs: ClassVar[bool] = True
    personalise_batches: int = 1
    # The method's own settings: the section of the configuration named after it
    # (`fedrep: {head_epochs: 10}`), validated, listed by `perfed-ray keys`, stored as
    # columns (`fedrep.head_epochs`) and sweepable; read them from `self.settings`.
    settings: ClassVar[dict[str, Setting]] = {}
    # The model a user's first state is made from (what `init_user_state` is given):
    # "global", the server's model of the round in which the user is first trained or
    # scored, or "initial", the run's initial model w_0 (as Ditto's authors' code starts
    # its personal models). A method may set it per instance, from one of its settings.
    state_start: str = "global"
    # Whether the server's model stays w_0 for good (`server_update` returns the server's
    # model: Local, whose users learn alone). No round's work then waits for the round
    # before it, so the rounds up to the next evaluation or checkpoint go to each actor
    # in one call instead of one call a round (:mod:`perfed_ray.runtime.rounds`); the
    # driver checks each round that the model did not move.
    fixed_server: ClassVar[bool] = False

    # What the method reads of a run; a method that reads more subclasses it.
    HParams: ClassVar[type[AlgorithmHParams]] = AlgorithmHParams

    @classmethod
    def validate(cls, hparams: AlgorithmHParams) -> None:
        """Raise ConfigError for settings the method cannot run (its own against the
        core keys it reads), when the configuration is read: before Ray starts."""

    def __init__(self, hparams: AlgorithmHParams | RunConfig) -> None:
        self.hparams = self.HParams.given(hparams)
        self.alpha = self.hparams.alpha
        self.beta = self.hparams.beta
        self.settings: dict[str, Any] = self.hparams.section
        # The local steps' update rule for methods that use one (`client_optimizer`);
        # its state lives in the round's local state.
        self.optimizer = self.hparams.optimizer

    # -- client side -------------------------------------------------------------------
    def task_samples(self, n_train: int) -> int:
        """The training samples one round's local work of a user holding `n_train` puts
        through the model: what its device's compute time is charged for on the
        simulated clock (:func:`perfed_ray.population.devices.task_seconds`). A batch
        counts once for each pass of the model over it (a gradient, a loss, a
        Hessian-vector product or HF's difference of two gradients alike), whatever the
        stream draws and leaves unused. Here FedAvg's: one batch a step, tau steps, or
        with `local_epochs` that many passes over the user's shard in full batches
        (ceil(n_train / batch_size) a pass); a method whose steps touch more overrides
        it."""
        hp = self.hparams
        return steps_in(n_train, hp.local_epochs, hp.tau, hp.batch_size) * hp.batch_size

    def init_user_state(self, start: Params) -> Params | None:
        """A user's state before its first round (None: the method keeps none), made
        from `start`: the server's model or w_0, as `state_start` says."""
        return None

    def client_init(self, ops: ModelOps, server: Params, user_state: Params | None) -> Any:
        """The local iterate at the start of a round: the server's weights."""
        return server

    def round_steps(self, state: Any, steps: torch.Tensor) -> Any:
        """The local state told how many steps the user takes this round (`local_epochs`:
        users of different sizes differ; a per-user count), for a method whose steps
        depend on it (FedRep's head and body epochs). Most ignore it."""
        return state

    def client_step(
        self, ops: ModelOps, state: Any, batches: Sequence[Batch]
    ) -> tuple[Any, torch.Tensor]:
        """One local step; returns the new state and the training loss it saw."""
        raise NotImplementedError

    def client_final(
        self, ops: ModelOps, server: Params, state: Any
    ) -> tuple[Params, Params | None]:
        """What the user sends the server (a model) and its state for the next round."""
        return state, None

    def personal_model(self, ops: ModelOps, server: Params, user_state: Params | None) -> Params:
        """The model a user's personalisation starts from (step 0 of its evaluation
        curve): the server's for Per-FedAvg and FedAvg, the user's own for methods that
        keep one (given the initial state for a user that never trained: a newcomer)."""
        return server

    def personalise(
        self, ops: ModelOps, model: Params, user_state: Params | None, batches: Sequence[Batch]
    ) -> Params:
        """One personalisation step for evaluation, from the model it is given (the
        personal model, or the result of the previous step): SGD of size alpha on each
        of its `personalise_batches` batches in turn; with one batch, PROTOCOL.md's
        step."""
        for batch in batches:
            g = ops.grad(model, batch)
            model = sgd(model, g, self.alpha, into=g)
        return model

    def shared(self, params: Params) -> tuple[str, ...]:
        """The parameters whose updates leave a user for the server (all of them unless
        the method keeps a part personal): what differential privacy clips and noises,
        while the rest, and every personalisation step, stays with the user."""
        return tuple(params)

    # -- server side -------------------------------------------------------------------
    def server_update(self, server: Params, aggregate: Params) -> Params:
        """The next global model from the users' aggregated models (Algorithm 1: the
        aggregate itself)."""
        return aggregate


def make_algorithm(cfg: RunConfig) -> Algorithm:
    """The run's method, built from its configuration: the one way the learner, the
    strategy and the engine measurement get it, so that a method's constructor sees
    the same configuration everywhere."""
    return ALGORITHMS.load(cfg.algorithm)(cfg)


def keeps_user_state(algorithm: Algorithm, template: Params) -> bool:
    """Whether the method's users keep per-user state on their actor: checkpoints then
    fetch it, a dead actor means a roll-back rather than a replacement, and a user
    trained on another actor (balanced rounds) takes its state there and back."""
    return algorithm.init_user_state(template) is not None


def concrete(flag: torch.Tensor) -> bool | None:
    """A one-element flag's value where Python may branch on it: one user's plain
    tensor. None under ``vmap``, for users stacked along an axis, or while
    ``torch.compile`` traces, where a method takes its branch-free path instead."""
    if (
        flag.numel() != 1
        or torch.compiler.is_compiling()
        or torch._C._functorch.is_functorch_wrapped_tensor(flag)
    ):
        return None
    return bool(flag)


def grad_and_loss_of(
    ops: ModelOps, params: Params, batch: Batch, keys: Sequence[str]
) -> tuple[Params, torch.Tensor]:
    """(grad f(w; D) with respect to `keys` alone, zeros for the other parameters;
    f(w; D)): autodiff stops at the parameters held fixed, so a step that trains a
    model's last layer does not differentiate the layers below it. Through
    ``ops.loss``, for a method whose step trains a part decided by `concrete`."""
    fixed = {k: v for k, v in params.items() if k not in keys}

    def loss(part: Params) -> tuple[torch.Tensor, torch.Tensor]:
        value = ops.loss({**fixed, **part}, batch)
        return value.sum(), value

    g, value = torch.func.grad(loss, has_aux=True)({k: params[k] for k in keys})
    return {k: g[k] if k in g else torch.zeros_like(v) for k, v in params.items()}, value


def client_update(
    algorithm: Algorithm,
    ops: ModelOps,
    server: Params,
    steps: Sequence[Sequence[Batch]],
    user_state: Params | None,
    step: Callable[..., tuple[Any, torch.Tensor]] | None = None,
    active: torch.Tensor | None = None,
    counts: torch.Tensor | None = None,
) -> tuple[Params, torch.Tensor, Params | None]:
    """One user's round (or a stacked block's): init, one step per entry of `steps`,
    final. Returns the model sent to the server, the mean training loss over the steps
    and the user's next state. Free of Python control flow on values, so `vmap` takes
    it whole; `step` replaces `algorithm.client_step` (by a compiled one).

    `active` [steps] (or [steps, U] for a stacked block) marks the steps each user
    takes, for users with different numbers of steps (`local_epochs`): a user's state
    goes through its inactive steps unchanged and its loss is the mean over its own.
    `counts` instead, where every step in `steps` is taken (one user's own steps alone):
    only the method is told how many (`round_steps`), no step is masked, which would
    copy the whole state at every step."""
    step = step or algorithm.client_step
    state = algorithm.client_init(ops, server, user_state)
    if active is not None:
        counts = active.sum(0)
    if counts is not None:
        state = algorithm.round_steps(state, counts)
    losses = []
    for t, batches in enumerate(steps):
        new, loss = step(ops, state, batches)
        if active is None:
            state = new
        else:
            on = active[t]
            state = tree_map(lambda n, o, on=on: torch.where(per_user(on, n), n, o), new, state)
            loss = loss * on
        losses.append(loss)
    update, user_state = algorithm.client_final(ops, server, state)
    losses = torch.stack(losses)
    mean = losses.mean(0) if active is None else losses.sum(0) / active.sum(0)
    return update, mean, user_state
