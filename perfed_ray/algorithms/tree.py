"""Arithmetic on parameter trees (dicts of tensors, possibly nested) for algorithms.

The same expression serves one user (tensors as the model has them), many users under
`vmap` (the user axis hidden), and many users stacked along a leading axis (the
`fused` engine): a per-user scalar there is a tensor of shape [U], broadcast here over
each leaf's remaining axes, so an algorithm never needs to know which it runs under.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

Params = dict[str, Any]  # name -> tensor, or name -> Params for composite states
Scalar = float | torch.Tensor


def tree_map(fn, tree: Params, *rest: Params) -> Params:
    return pytree.tree_map(fn, tree, *rest)


def per_user(s: Scalar, like: torch.Tensor) -> Scalar:
    """A scalar, or a [U] vector of per-user scalars shaped to broadcast against `like`."""
    if isinstance(s, torch.Tensor) and 0 < s.ndim < like.ndim:
        return s.reshape(*s.shape, *(1,) * (like.ndim - s.ndim))
    return s


def eager_plain(leaves: list[torch.Tensor]) -> bool:
    """Whether the leaves are plain tensors run eagerly, which the multi-tensor kernels and
    in-place shortcuts may take: not `torch.func`'s wrappers (`vmap` has no batching rule
    for the former, forward-mode autodiff none for some of the latter), and not while
    `torch.compile` traces (it fuses the plain forms itself, and asking would break its
    graph)."""
    if torch.compiler.is_compiling():
        return False
    return not any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in leaves)


def _pairwise(many, one, a: Params, b: Params) -> Params:
    """`one` leaf by leaf, or `many` (its multi-tensor form) on every leaf at once."""
    leaves, spec = pytree.tree_flatten(a)
    others = spec.flatten_up_to(b)
    if leaves and eager_plain(leaves) and eager_plain(others):  # the kernels take no []
        return pytree.tree_unflatten(many(leaves, others), spec)
    return tree_map(one, a, b)


def sgd(w: Params, direction: Params, lr: Scalar, into: Params | None = None) -> Params:
    """w - lr * direction, leaf by leaf, in one pass over each leaf (`add` with a scale,
    or `addcmul` for step sizes that are tensors): large layers make these passes a third of
    a step's time when done as a product and a difference. With a number for a step size,
    every leaf goes in one multi-tensor call (one kernel launch for all on a GPU, one
    dispatch on a CPU) where the leaves are plain tensors.

    `into`: a temporary of the caller's that it reads no more (most often `direction`
    itself, a fresh gradient), which the result may be written over instead of into new
    memory, with the same numbers: where the leaves are plain tensors, the step size a
    number and each of its leaves a dense tensor of its own like w's. A new tree's worth
    of memory a step cost 8-10% of a CNN's step on a CPU (experiments/bench/step_overhead.py)."""
    if isinstance(lr, torch.Tensor):
        lr = -lr
        return tree_map(lambda a, d: torch.addcmul(a, per_user(lr, d), d), w, direction)
    if into is not None:
        leaves, spec = pytree.tree_flatten(w)
        others, out = spec.flatten_up_to(direction), spec.flatten_up_to(into)
        if _writable(out, leaves, others):
            for a, d, o in zip(leaves, others, out, strict=True):
                torch.add(a, d, alpha=-lr, out=o)
            return pytree.tree_unflatten(out, spec)
    return _pairwise(
        lambda a, d: torch._foreach_add(a, d, alpha=-lr),
        lambda a, d: torch.add(a, d, alpha=-lr),
        w,
        direction,
    )


def _writable(out: list, w: list[torch.Tensor], direction: list) -> bool:
    """Whether `out`'s leaves may take the results of an element-wise step from w and
    direction: plain tensors of w's shapes, dtypes and devices, dense and each with
    memory of its own (none shared with another leaf of any of the three, save an out
    leaf that is its own direction leaf), outside autograd."""
    if not all(isinstance(o, torch.Tensor) for o in out):
        return False
    if not (eager_plain(w) and eager_plain(out)):
        return False
    if not all(isinstance(d, torch.Tensor) for d in direction) or not eager_plain(direction):
        return False
    for o, a in zip(out, w, strict=True):
        if o.shape != a.shape or o.dtype != a.dtype or o.device != a.device:
            return False
        if not (o.is_contiguous() or o.is_contiguous(memory_format=torch.channels_last)):
            return False  # dense, in the layout of a convolution's gradient
    if any(t.requires_grad for t in [*out, *w, *direction]):  # `out=` has no autograd
        return False
    memory = {o.untyped_storage().data_ptr() for o in out}
    if len(memory) < len(out):
        return False
    pairs = zip(direction, out, strict=True)
    read = [*w, *(d for d, o in pairs if d is not o)]
    return memory.isdisjoint(t.untyped_storage().data_ptr() for t in read)


def axpy(w: Params, direction: Params, scale: Scalar) -> Params:
    """w + scale * direction, leaf by leaf."""
    return sgd(w, direction, -scale)


def add(a: Params, b: Params) -> Params:
    return _pairwise(torch._foreach_add, torch.add, a, b)


def sub(a: Params, b: Params) -> Params:
    return _pairwise(torch._foreach_sub, torch.sub, a, b)


def lerp(a: Params, b: Params, weight: Scalar) -> Params:
    """(1 - weight) a + weight b, leaf by leaf."""
    return tree_map(lambda x, y: x + per_user(weight, y) * (y - x), a, b)
