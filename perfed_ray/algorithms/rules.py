"""Local update rules of Per-FedAvg and FedAvg, as pure functions of parameters.

Fallah, Mokhtari, Ozdaglar, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach", NeurIPS 2020.

A rule maps the current local iterate ``w`` and three independent batches
``D, D', D''`` to the direction of one local step, eq. (7):
``w <- w - beta * direction``. Per-FedAvg's direction is the stochastic
gradient of the meta-function ``F_i(w) = f_i(w - alpha grad f_i(w))``,
eq. (8); the FO and HF variants replace its Hessian-vector product as in
Section 5 and Appendix H. Nothing here knows about users, actors or Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.func import grad, grad_and_value, jvp, vmap

Params = dict[str, torch.Tensor]
Batch = tuple[torch.Tensor, torch.Tensor]
LossFn = Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class StepSizes:
    """alpha: inner (adaptation) step; beta: local step; delta: HF's difference step,
    divided by ||g|| when `normalized_delta` (so the perturbation has length delta)."""

    alpha: float
    beta: float
    delta: float = 1e-3
    normalized_delta: bool = False


def sgd(params: Params, direction: Params, lr: float) -> Params:
    """w - lr * direction, leaf by leaf."""
    return {k: params[k] - lr * direction[k] for k in params}


def axpy(params: Params, direction: Params, scale: float) -> Params:
    """w + scale * direction, leaf by leaf."""
    return sgd(params, direction, -scale)


def adapt(loss: LossFn, params: Params, batch: Batch, alpha: float) -> Params:
    """One SGD step of size alpha: the personalisation step of evaluation, and w~ of (8)."""
    return sgd(params, grad(loss)(params, *batch), alpha)


Rule = Callable[[LossFn, Params, Batch, Batch, Batch, StepSizes], tuple[Params, torch.Tensor]]


def fedavg(loss: LossFn, w: Params, d: Batch, d1: Batch, d2: Batch,
           s: StepSizes) -> tuple[Params, torch.Tensor]:
    """FedAvg: the plain stochastic gradient on D (D' and D'' unused)."""
    return grad_and_value(loss)(w, *d)


def _outer_gradient(loss: LossFn, w: Params, d: Batch, d1: Batch,
                    s: StepSizes) -> tuple[Params, torch.Tensor]:
    """g = grad f(w~; D') with w~ = w - alpha grad f(w; D); also f(w; D)."""
    inner, value = grad_and_value(loss)(w, *d)
    return grad(loss)(sgd(w, inner, s.alpha), *d1), value


def perfedavg_fo(loss: LossFn, w: Params, d: Batch, d1: Batch, d2: Batch,
                 s: StepSizes) -> tuple[Params, torch.Tensor]:
    """Per-FedAvg (FO), Section 5 (i): drop the Hessian term, direction = g."""
    return _outer_gradient(loss, w, d, d1, s)


def perfedavg_hf(loss: LossFn, w: Params, d: Batch, d1: Batch, d2: Batch,
                 s: StepSizes) -> tuple[Params, torch.Tensor]:
    """Per-FedAvg (HF), Section 5 (ii) and Appendix H: g - alpha * d with the
    central difference d = (grad f(w + delta g; D'') - grad f(w - delta g; D'')) / (2 delta),
    delta as :func:`difference_step` chooses it.
    """
    g, value = _outer_gradient(loss, w, d, d1, s)
    step = difference_step(g, s)
    plus = grad(loss)(axpy(w, g, step), *d2)
    minus = grad(loss)(axpy(w, g, -step), *d2)
    scale = s.alpha / (2 * step)
    return {k: g[k] - scale * (plus[k] - minus[k]) for k in g}, value


def difference_step(g: Params, s: StepSizes) -> float | torch.Tensor:
    """HF's delta: fixed (the paper's text), or delta / ||g||, so w moves by a fixed
    length delta whatever the gradient's size (HF-MAML analyses scale it so; a fixed
    delta times a large g is a large, inaccurate perturbation). ||g|| = 0 is guarded
    by the smallest positive float: g = 0 then makes the difference 0, not NaN.
    A tensor, not a Python float, so the rule stays traceable under vmap."""
    if not s.normalized_delta:
        return s.delta
    norm = torch.sqrt(sum((v * v).sum() for v in g.values()))
    return s.delta / torch.clamp(norm, min=torch.finfo(norm.dtype).tiny)


def hessian_vector_product(loss: LossFn, w: Params, batch: Batch, v: Params) -> Params:
    """H(w; batch) v exactly, by forward-over-reverse autodiff."""
    return jvp(lambda p: grad(loss)(p, *batch), (w,), (v,))[1]


def perfedavg(loss: LossFn, w: Params, d: Batch, d1: Batch, d2: Batch,
              s: StepSizes) -> tuple[Params, torch.Tensor]:
    """Per-FedAvg, Algorithm 1 and eq. (8): (I - alpha H(w; D'')) g, Hessian at w."""
    g, value = _outer_gradient(loss, w, d, d1, s)
    hv = hessian_vector_product(loss, w, d2, g)
    return {k: g[k] - s.alpha * hv[k] for k in g}, value


RULES: dict[str, Rule] = {
    "fedavg": fedavg,
    "perfedavg": perfedavg,
    "perfedavg-fo": perfedavg_fo,
    "perfedavg-hf": perfedavg_hf,
}


def local_update(rule: Rule, loss: LossFn, w: Params, x: torch.Tensor, y: torch.Tensor,
                 s: StepSizes) -> tuple[Params, torch.Tensor]:
    """tau local steps of eq. (7) from w; step t uses D = (x[t, 0], y[t, 0]),
    D' = (x[t, 1], y[t, 1]), D'' = (x[t, 2], y[t, 2]), so x is [tau, 3, B, ...].

    Returns the final iterate w_{k+1,tau} and the mean of f(w; D) over the
    steps. Free of Python control flow on values, so `torch.func.vmap` runs it
    for many users at once (see :func:`local_update_many`).
    """
    losses = []
    for t in range(x.shape[0]):
        direction, value = rule(loss, w, (x[t, 0], y[t, 0]), (x[t, 1], y[t, 1]),
                                (x[t, 2], y[t, 2]), s)
        w = sgd(w, direction, s.beta)
        losses.append(value)
    return w, torch.stack(losses).mean()


def local_update_many(rule: Rule, loss: LossFn, w: Params, x: torch.Tensor, y: torch.Tensor,
                      s: StepSizes) -> tuple[Params, torch.Tensor]:
    """:func:`local_update` for U users at once from the same w: x is [U, tau, 3, B, ...];
    returns parameters stacked along a leading user axis and U mean losses."""
    return vmap(lambda xu, yu: local_update(rule, loss, w, xu, yu, s))(x, y)
