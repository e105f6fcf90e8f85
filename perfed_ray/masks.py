"""Dropout whose masks are drawn from the run's keyed streams, not from torch's global
generator, so a model with ``nn.Dropout`` gives the same numbers whatever actor, engine
or block a user runs in, and a resumed run continues exactly.

A model's dropout sites are its ``nn.Dropout`` modules with p > 0. For every training
step (local steps and the personalisation steps of evaluation) a user's batch carries
one mask per site, drawn from the stream keyed (seed, DROPOUT, user, round[, draw]) as
its batches are from theirs; a batch is then (x, y, masks) instead of (x, y). Every
forward pass on that batch uses its masks, so the several gradients a step takes on
one batch (Per-FedAvg's Hessian-vector product, Ditto's two models) differentiate one
function, as the paper's stochastic gradients on one batch assume; PyTorch would draw
a fresh mask for each forward. Without masks (scoring) a site is the identity, as
``model.eval()`` would make it.

The masks travel as data through the engines: under ``torch.func`` (one user, or
``vmap``) the sites' forward hooks read them from :data:`_MASKS` while the model runs
(:func:`applying`); the grouped engine applies them to its stacked activations itself.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from perfed_ray.errors import ConfigError
from perfed_ray.seeding import Stream, torch_generator

Masks = dict[str, torch.Tensor]  # site name -> bool [..., *one sample's shape at the site]

_MASKS: contextvars.ContextVar[Masks | None] = contextvars.ContextVar("masks", default=None)


@dataclass(frozen=True)
class Site:
    name: str  # the module's name in the model (and in a grouped chain)
    p: float
    shape: tuple[int, ...]  # one sample's input to the module


def apply(h: torch.Tensor, mask: torch.Tensor, p: float) -> torch.Tensor:
    """Inverted dropout with a given mask (True: kept): the one expression every engine
    uses, so their numbers agree to rounding."""
    return h * mask * (1.0 / (1.0 - p))


def _hook(module: nn.Dropout, args: tuple, output: torch.Tensor, name: str) -> torch.Tensor:
    masks = _MASKS.get()
    if masks is None:
        return output
    return apply(output, masks[name], module.p)


def keyed(model: nn.Module) -> dict[str, nn.Dropout]:
    """The model's dropout modules by name, made keyed: each the identity itself (it
    would draw from torch's global generator, which ``vmap`` refuses and no run could
    reproduce), with a hook, registered once, that applies the masks of
    :func:`applying`. A kind of dropout whose masks are not elementwise is refused with
    the reason."""
    found = {}
    for name, module in model.named_modules():
        if type(module) is nn.Dropout:
            if module.p > 0:
                found[name] = module
        elif isinstance(module, nn.modules.dropout._DropoutNd | nn.AlphaDropout):
            raise ConfigError(
                f"model {type(model).__name__}: {name} is {type(module).__name__}; "
                f"perfed-ray draws keyed masks for nn.Dropout only (elementwise)"
            )
    for name, module in found.items():
        module.eval()
        if not getattr(module, "_perfed_keyed", False):
            module.register_forward_hook(lambda m, a, o, n=name: _hook(m, a, o, n))
            module._perfed_keyed = True
    return found


def sites(model: nn.Module, sample_shape: Sequence[int]) -> list[Site]:
    """The model's dropout sites (:func:`keyed`), in module order, with one sample's
    shape at each: one forward pass of a zero sample finds them."""
    found = keyed(model)
    if not found:
        return []
    shapes: dict[str, tuple[int, ...]] = {}

    def probe(name: str):
        def record(module: nn.Module, args: tuple) -> None:
            shapes.setdefault(name, tuple(args[0].shape[1:]))

        return record

    probes = [m.register_forward_pre_hook(probe(n)) for n, m in found.items()]
    try:
        like = next(model.parameters())
        with torch.no_grad(), applying(None):
            model(torch.zeros(1, *sample_shape, dtype=like.dtype, device=like.device))
    finally:
        for probe in probes:
            probe.remove()
    return [Site(n, m.p, tuple(shapes[n])) for n, m in found.items() if n in shapes]


@contextlib.contextmanager
def applying(masks: Masks | None) -> Iterator[None]:
    """Within it, the model's dropout sites apply `masks` (None: none, as in scoring)."""
    token = _MASKS.set(masks)
    try:
        yield
    finally:
        _MASKS.reset(token)


def round_masks(
    seed: int,
    users: Sequence[int],
    keys: Sequence[int],
    steps: Sequence[int],
    lead: tuple[int, ...],
    found: Sequence[Site],
    device: torch.device | str = "cpu",
) -> Masks | None:
    """Each user's masks for `steps[i]` training steps of `lead` ([per_step, B]) samples,
    stacked [U, T, *lead, *site shape] with T the most steps (a user's steps past its
    own are left dropped: the engines mask those steps out). A user's masks depend on
    its own stream and step count only, never on the block it runs in. `keys`: the
    round, or the round and the evaluation draw."""
    if not found:
        return None
    longest = max(steps)
    out = {
        s.name: torch.zeros(len(users), longest, *lead, *s.shape, dtype=torch.bool, device=device)
        for s in found
    }
    for i, (user, own) in enumerate(zip(users, steps, strict=True)):
        gen = torch_generator(seed, Stream.DROPOUT, user, *keys)
        for s in found:
            kept = torch.rand(own, *lead, *s.shape, generator=gen) >= s.p
            out[s.name][i, :own] = kept.to(device)
    return out


def random_masks(found: Sequence[Site], lead: tuple[int, ...], seed: int = 0) -> Masks | None:
    """Masks of the right shapes from a fixed generator, for timing an engine."""
    if not found:
        return None
    gen = torch.Generator().manual_seed(seed)
    return {s.name: torch.rand(*lead, *s.shape, generator=gen) >= s.p for s in found}


def index(masks: Masks | None, where) -> Masks | None:
    """masks[where] at every site (None stays None)."""
    return None if masks is None else {k: v[where] for k, v in masks.items()}
