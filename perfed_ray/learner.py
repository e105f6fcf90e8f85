"""The users an actor hosts, and their side of every round: local training through an
engine, per-user state, and personalised evaluation (PROTOCOL.md).

This is where an algorithm meets users' shards and random streams; it knows nothing
about Ray, so the same object runs inside an actor, in a test, or in a plain loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial

import numpy as np
import pyarrow as pa
import torch
from torch import nn

from perfed_ray.algorithms.base import Algorithm, ModelOps, make_algorithm
from perfed_ray.algorithms.tree import Params
from perfed_ray.config.schema import RunConfig
from perfed_ray.data import Shard
from perfed_ray.data.augment import CropFlip
from perfed_ray.data.batches import epoch_indices, evaluation_indices, gather, round_indices
from perfed_ray.engines import make_engine
from perfed_ray.engines.base import one_by_one, per_user_copies, stack, unstack
from perfed_ray.engines.functional import FunctionalOps
from perfed_ray.masks import Masks, Site, index, round_masks, sites
from perfed_ray.models import FlatParams, activation_bytes, params_of
from perfed_ray.seeding import Stream, torch_generator
from perfed_ray.states import StateStore

EVAL_SAMPLES = 2**15  # test samples (padding included) scored at once in a block of users,
EVAL_BYTES = 2**28  # at most, and at most as many as the model's activations of one
# forward pass fill this: a CNN's are hundreds of times an MLP's (simple_cnn's 0.8 MB a
# CIFAR-10 image), and an actor's 5,000 test images of it took 8.8 GB at once


class Learner:
    """Local training and evaluation of the users whose shards it holds.

    Each user's per-user state (for methods that keep one) is the method's initial
    one until the user first trains, then what its last round left, kept in a
    :class:`~perfed_ray.states.StateStore` on local disk; a checkpoint saves them
    (:meth:`state_vectors`) and a resumed run starts from them (`states`). The
    initial one is made from the server's model, or from w_0 for a method whose
    `state_start` is "initial": `model`'s own parameters, which must be the run's w_0
    (:func:`~perfed_ray.models.initial_model`, a function of the seed alone, so a
    replacement actor makes the same)."""

    def __init__(
        self,
        cfg: RunConfig,
        model: nn.Module,
        shards: Mapping[int, Shard],
        states: dict[int, np.ndarray] | None = None,
        users: range | Sequence[int] | None = None,
        augment: CropFlip | None = None,
    ) -> None:
        self.cfg = cfg
        self.augment = augment
        self.model = model
        self.shards = shards
        self.algorithm: Algorithm = make_algorithm(cfg)
        self.engine = make_engine(cfg.engine, self.algorithm, model, bool(cfg.compile))
        self.ops = FunctionalOps(model)
        self.device = next(model.parameters()).device
        self.store = StateStore(sorted(shards) if users is None else users)
        for user, vector in (states or {}).items():
            self.store.put(user, vector)
        self.state_layout: FlatParams | None = None
        start = self.algorithm.state_start
        if start not in ("global", "initial"):
            raise ValueError(f"state_start = {start!r}: it is 'global' or 'initial'")
        self.initial = params_of(model) if start == "initial" else None
        self._sites: list[Site] | None = None
        self._eval_samples: int | None = None

    def sites(self, shard: Shard) -> list[Site]:
        """The model's dropout sites (none for most models), found on first use from
        the shape of a shard's samples."""
        if self._sites is None:
            self._sites = sites(self.model, shard.x_train.shape[1:])
        return self._sites

    def _state(
        self, user: int, server: Params, visiting: Mapping[int, np.ndarray | None] | None = None
    ) -> Params | None:
        """The user's state: stored (here, or handed over in `visiting` by the actor
        hosting the user), or the method's initial one, from this server's model or
        from w_0."""
        initial = self.algorithm.init_user_state(server if self.initial is None else self.initial)
        if initial is None:
            return None
        self.state_layout = self.state_layout or FlatParams(initial)
        saved = visiting[user] if visiting and user in visiting else self.store.get(user)
        return initial if saved is None else self.state_layout.unflatten(saved, self.device)

    def eval_samples(self, shard: Shard) -> int:
        """Test samples scored at once in a block of users: EVAL_SAMPLES, fewer where
        the model's activations would pass EVAL_BYTES."""
        if self._eval_samples is None:
            per_sample = activation_bytes(self.model, shard.x_test.shape[1:])
            self._eval_samples = max(1, min(EVAL_SAMPLES, EVAL_BYTES // per_sample))
        return self._eval_samples

    def block_batches(
        self, users: list[int], round_: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, Masks | None]:
        """Fresh batches for each step of a round, for several users, stacked:
        x [U, T, per_step, B, ...], gathered straight into place, each user's number
        of steps (None: all take tau) and the batches' dropout masks (None: the model
        has none). With `local_epochs` users take different numbers of steps: T is the
        most, and a user's steps past its own repeat its first batch (masked by the
        engine)."""
        first, cfg, algorithm = self.shards[users[0]], self.cfg, self.algorithm
        sizes = [self.n_train(u) for u in users]
        if cfg.local_epochs is None:  # one call for every user's indices
            index = round_indices(
                cfg.seed,
                users,
                round_,
                sizes,
                cfg.tau,
                algorithm.batches_per_step,
                cfg.batch_size,
                algorithm.draws_per_step,
                self.device,
            )
            steps = torch.full((len(users),), cfg.tau)
        else:
            idx = [
                epoch_indices(cfg.seed, u, round_, n, cfg.local_epochs, cfg.batch_size)
                for u, n in zip(users, sizes, strict=True)
            ]
            steps = torch.tensor([len(i) for i in idx])
            longest = int(steps.max())
            index = torch.stack(
                [torch.cat([i, i[:1].expand(longest - len(i), *i.shape[1:])]) for i in idx]
            ).to(self.device)  # one transfer of every user's indices
        shape = index.shape
        x = torch.empty(
            *shape, *first.x_train.shape[1:], dtype=first.x_train.dtype, device=self.device
        )
        y = torch.empty(*shape, dtype=first.y_train.dtype, device=self.device)
        if self.device.type == "cuda":  # one gather from the users' shards laid end to end:
            # a launch per user costs more there than copying the shards together
            starts = torch.tensor(np.cumsum([0, *sizes[:-1]]), device=self.device)
            index = index + starts.view(-1, *(1,) * (index.ndim - 1))
            gather(torch.cat([self.shards[u].x_train for u in users]), index, out=x)
            gather(torch.cat([self.shards[u].y_train for u in users]), index, out=y)
        else:
            for i, u in enumerate(users):
                gather(self.shards[u].x_train, index[i], out=x[i])
                gather(self.shards[u].y_train, index[i], out=y[i])
        if self.augment is not None:  # each user's own steps; the rest are masked
            for i, (u, own) in enumerate(zip(users, steps.tolist(), strict=True)):
                gen = torch_generator(cfg.seed, Stream.AUGMENTATION, u, round_)
                x[i, :own] = self.augment(x[i, :own], gen)
        masks = round_masks(
            cfg.seed, users, (round_,), steps.tolist(), shape[2:], self.sites(first), self.device
        )
        return x, y, steps.to(self.device) if cfg.steps_vary else None, masks

    def train(
        self,
        server: Params,
        users: list[int],
        round_: int,
        visiting: dict[int, np.ndarray | None] | None = None,
    ) -> tuple[Params, torch.Tensor]:
        """Round k's local work of the given users from the server's model: their models
        stacked along a leading axis and their mean training losses; their states move
        on to the next round, in the store, or for users hosted elsewhere in `visiting`
        (their states as handed over, None for none yet), replaced there by the new."""
        # Users of like sizes in the same blocks; an engine that runs them one by one
        # needs no order, and putting its users' models back in theirs copies them all.
        reorder = self.cfg.steps_vary and not self.engine.one_at_a_time
        if reorder:
            order = sorted(range(len(users)), key=lambda i: -len(self.shards[users[i]].y_train))
            users = [users[i] for i in order]
        x, y, steps, masks = self.block_batches(users, round_)
        states = stack([self._state(u, server, visiting) for u in users])
        models, losses, new_states = self.engine.run(server, x, y, states, steps, masks)
        if new_states is not None:
            for user, state in zip(users, unstack(new_states, len(users)), strict=True):
                vector = self.state_layout.flatten(state)
                if visiting is not None and user in visiting:
                    visiting[user] = vector
                else:
                    self.store.put(user, vector)
        if reorder:  # back to the order asked for
            back = torch.argsort(torch.tensor(order))
            models, losses = {k: v[back] for k, v in models.items()}, losses[back]
        return models, losses

    def n_train(self, user: int) -> int:
        return len(self.shards[user].y_train)

    def state_vectors(self, users: Sequence[int] | None = None) -> dict[int, np.ndarray]:
        """Every hosted user's state as a flat vector (restored ones not yet used
        included), for a checkpoint; or those of `users` that have one."""
        if users is None:
            return dict(self.store.items())
        found = {u: self.store.get(u) for u in users}
        return {u: v for u, v in found.items() if v is not None}

    def _score(
        self, ops: ModelOps, params: Params, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(accuracy, mean loss) on test shards padded to the block's longest, `mask`
        marking each user's own samples: one user's (x [N, ...], under ``vmap``) or a
        stacked block's (x [U, N, ...], one score per user)."""
        logits = ops.logits(params, x)
        losses = nn.functional.cross_entropy(
            logits.flatten(0, -2), y.flatten(), reduction="none"
        ).view_as(y)
        n = mask.sum(-1)
        hits = (logits.argmax(dim=-1) == y).to(mask.dtype)
        return (hits * mask).sum(-1) / n, (losses * mask).sum(-1) / n

    def _curve(self, ops, server, state, x, y, masks, x_test, y_test, mask, before):
        """Scores before and after each personalisation step, [..., steps + 1]: one
        user's (under ``vmap``) or a stacked block's, whose batches x (and dropout
        `masks`) come step-major ([batches, U, B, ...]); `before` is the server's, the
        first score where personalisation starts there."""
        per_step = self.algorithm.personalise_batches
        personal = self.algorithm.personal_model(ops, server, state)
        scores = [
            before if personal is server else self._score(ops, personal, x_test, y_test, mask)
        ]
        for step in range(self.cfg.personalise_steps):
            at = [step * per_step + j for j in range(per_step)]
            batches = [(x[i], y[i]) if masks is None else (x[i], y[i], index(masks, i)) for i in at]
            personal = self.algorithm.personalise(ops, personal, state, batches)
            scores.append(self._score(ops, personal, x_test, y_test, mask))
        accs, losses = zip(*scores, strict=True)
        return torch.stack(accs, -1), torch.stack(losses, -1)

    def evaluate(self, server: Params, users: list[int], round_: int, draws: int) -> pa.Table:
        """Accuracy on the whole test shard of the server's model (`acc_before`), and of
        the method's personal model before and after each of `personalise_steps` steps of
        its personalisation (SGD of size alpha from the server's model for Per-FedAvg and
        FedAvg) on fresh batches from the user's own data, once per independent draw. A
        user the method has no state for yet is personalised as a newcomer would be.

        Users are scored in blocks, their test shards padded to the block's longest;
        blocks gather users of similar test sizes, so a heavy-tailed population
        (Synthetic's power law) pads little. A block goes through the engine's own
        stacked maths where it has them (fused, grouped: the same hand-written gradient
        as training, and no `torch.func.grad`, whose first call imports all of
        `torch._dynamo`, 1.4 s in each actor), else one user after another where the
        engine trains them so (sequential: the CNNs on a CPU), else under `vmap`. The
        scores come as
        columns, one row per user and draw in (user, draw) order: a million users'
        evaluation stays a few arrays, never a million objects."""
        order = sorted(users, key=lambda u: len(self.shards[u].y_test))
        parts: list[dict[str, np.ndarray]] = []
        block: list[int] = []
        for u in order:
            longest = len(self.shards[u].y_test)
            if block and (len(block) + 1) * longest > self.eval_samples(self.shards[u]):
                parts += self._evaluate_block(server, block, round_, draws)
                block = []
            block.append(u)
        if block:
            parts += self._evaluate_block(server, block, round_, draws)
        columns = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.lexsort((columns["draw"], columns["user"]))
        columns = {k: v[order] for k, v in columns.items()}
        for curve in ("acc_steps", "loss_steps"):
            steps = columns[curve]
            offsets = np.arange(0, steps.size + 1, steps.shape[1], dtype=np.int32)
            columns[curve] = pa.ListArray.from_arrays(offsets, steps.reshape(-1))
        return pa.table(columns)

    def _evaluate_block(
        self, server: Params, users: list[int], round_: int, draws: int
    ) -> list[dict[str, np.ndarray]]:
        shards = [self.shards[u] for u in users]
        longest = max(len(s.y_test) for s in shards)
        first = shards[0]
        x_test = first.x_test.new_zeros(len(users), longest, *first.x_test.shape[1:])
        y_test = first.y_test.new_zeros(len(users), longest)
        mask = torch.zeros(len(users), longest, device=self.device)
        for i, s in enumerate(shards):
            x_test[i, : len(s.y_test)] = s.x_test
            y_test[i, : len(s.y_test)] = s.y_test
            mask[i, : len(s.y_test)] = 1.0
        states = stack([self._state(u, server) for u in users])
        batches = self.cfg.personalise_steps * self.algorithm.personalise_batches
        state_axis = None if states is None else 0
        stacked = self.engine.ops
        if stacked is None:
            each = one_by_one if self.engine.one_at_a_time else torch.func.vmap
            score = partial(each(self._score, in_dims=(None, None, 0, 0, 0)), self.ops)
            masks_axis = None if not self.sites(first) else 0
            curve = partial(
                each(self._curve, in_dims=(None, None, state_axis, 0, 0, masks_axis, 0, 0, 0, 0)),
                self.ops,
            )
        else:  # the engine's maths for the whole block: no per-user autodiff
            server = per_user_copies(server, len(users))
            score = partial(self._score, stacked)

            def curve(server, states, x, y, masks, *test):
                step_major = (
                    None if masks is None else {k: m.transpose(0, 1) for k, m in masks.items()}
                )
                return self._curve(
                    stacked, server, states, x.transpose(0, 1), y.transpose(0, 1), step_major, *test
                )

        before = score(server, x_test, y_test, mask)
        on_test = self.cfg.adapt_on == "test"
        sources = [(s.x_test, s.y_test) if on_test else (s.x_train, s.y_train) for s in shards]
        fixed = {
            "user": np.array(users, dtype=np.int64),
            "group": np.array([s.group for s in shards], dtype=object),
            "n_train": np.array([len(s.y_train) for s in shards], dtype=np.int64),
            "n_test": np.array([len(s.y_test) for s in shards], dtype=np.int64),
            "acc_before": before[0].double().cpu().numpy(),
            "loss_before": before[1].double().cpu().numpy(),
        }
        parts = []
        for draw_ in range(draws):
            idx = [
                torch.stack(
                    evaluation_indices(
                        self.cfg.seed, u, round_, draw_, len(y), self.cfg.batch_size, batches
                    )
                )
                for u, (_, y) in zip(users, sources, strict=True)
            ]
            x = torch.stack([gather(x, i) for (x, _), i in zip(sources, idx, strict=True)])
            if self.augment is not None and not on_test:  # training images only
                for i, u in enumerate(users):
                    gen = torch_generator(self.cfg.seed, Stream.AUGMENTATION, u, round_, draw_)
                    x[i] = self.augment(x[i], gen)
            y = torch.stack([gather(y, i) for (_, y), i in zip(sources, idx, strict=True)])
            masks = round_masks(
                self.cfg.seed,
                users,
                (round_, draw_),
                [batches] * len(users),
                (self.cfg.batch_size,),
                self.sites(first),
                self.device,
            )
            accs, losses = curve(server, states, x, y, masks, x_test, y_test, mask, before)
            accs, losses = accs.double().cpu().numpy(), losses.double().cpu().numpy()
            parts.append(
                {
                    **fixed,
                    "draw": np.full(len(users), draw_, dtype=np.int64),
                    "acc_after": accs[:, -1],
                    "loss_after": losses[:, -1],
                    "acc_steps": accs,
                    "loss_steps": losses,
                }
            )
        return parts
