"""The local update rules against autodiff ground truth (Section 5, Appendix H)."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad

from perfed_ray.algorithms import (
    RULES,
    StepSizes,
    adapt,
    hessian_vector_product,
    local_update,
    local_update_many,
)
from perfed_ray.algorithms.rules import perfedavg, perfedavg_fo, perfedavg_hf, sgd
from perfed_ray.models import build_model, cross_entropy_loss, params_of


@pytest.fixture
def problem():
    """A random MLP (double precision, so differences are not lost in rounding) and batches."""
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 10).double()
    params = {k: v.double() for k, v in params_of(model).items()}
    loss = cross_entropy_loss(model)
    batches = [(torch.randn(40, 16, dtype=torch.float64), torch.randint(0, 10, (40,)))
               for _ in range(3)]
    return loss, params, batches


def _steps(triples):
    """[(D, D', D''), ...] as the [tau, 3, B, ...] tensors local_update takes."""
    x = torch.stack([torch.stack([b[0] for b in t]) for t in triples])
    y = torch.stack([torch.stack([b[1] for b in t]) for t in triples])
    return x, y


def _distance(a, b) -> float:
    return float(torch.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in a)))


def _norm(a) -> float:
    return float(torch.sqrt(sum((v**2).sum() for v in a.values())))


def test_hf_direction_tends_to_exact_as_delta_shrinks(problem):
    loss, w, (d, d1, d2) = problem
    s = StepSizes(alpha=0.5, beta=0.1)
    exact, _ = perfedavg(loss, w, d, d1, d2, s)
    errors = []
    for delta in (1e-1, 1e-2, 1e-3):
        hf, _ = perfedavg_hf(loss, w, d, d1, d2, StepSizes(0.5, 0.1, delta))
        errors.append(_distance(hf, exact) / _norm(exact))
    # ELU's second derivative jumps at 0, so the error shrinks at least like delta
    # (like delta^2 where no unit sits near its kink).
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < errors[0] / 100
    assert errors[2] < 1e-6


def test_normalized_hf_is_fixed_hf_with_delta_over_the_gradient_norm(problem):
    loss, w, (d, d1, d2) = problem
    g, _ = perfedavg_fo(loss, w, d, d1, d2, StepSizes(0.5, 0.1))
    got, _ = perfedavg_hf(loss, w, d, d1, d2, StepSizes(0.5, 0.1, 1e-2, normalized_delta=True))
    expected, _ = perfedavg_hf(loss, w, d, d1, d2, StepSizes(0.5, 0.1, 1e-2 / _norm(g)))
    for k in w:
        torch.testing.assert_close(got[k], expected[k])


def test_normalized_hf_tends_to_exact_as_the_perturbation_shrinks(problem):
    loss, w, (d, d1, d2) = problem
    exact, _ = perfedavg(loss, w, d, d1, d2, StepSizes(0.5, 0.1))
    errors = [_distance(perfedavg_hf(loss, w, d, d1, d2,
                                     StepSizes(0.5, 0.1, delta, normalized_delta=True))[0],
                        exact) / _norm(exact) for delta in (1e-1, 1e-3)]
    assert errors[1] < errors[0] / 10 and errors[1] < 1e-6


def test_normalized_hf_with_a_zero_gradient_is_zero_not_nan():
    """A flat loss has g = 0: the guarded step keeps the difference 0 / finite."""
    w = {"v": torch.ones(3, dtype=torch.float64)}
    batch = (torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.long))

    def flat(params, x, y):
        return (params["v"] * 0).sum() + x.sum()

    direction, _ = perfedavg_hf(flat, w, batch, batch, batch,
                                StepSizes(0.5, 0.1, normalized_delta=True))
    torch.testing.assert_close(direction["v"], torch.zeros(3, dtype=torch.float64))


def test_hessian_vector_product_matches_reverse_over_reverse(problem):
    """Our forward-over-reverse HVP against PyTorch's double-backward one."""
    loss, w, (d, _, _) = problem
    v = {k: torch.randn_like(x) for k, x in w.items()}
    names = list(w)

    def flat_loss(*tensors):
        return loss(dict(zip(names, tensors, strict=True)), *d)

    _, expected = torch.autograd.functional.hvp(
        flat_loss, tuple(w[k] for k in names), tuple(v[k] for k in names))
    got = hessian_vector_product(loss, w, d, v)
    for k, e in zip(names, expected, strict=True):
        torch.testing.assert_close(got[k], e)


def test_exact_direction_is_the_gradient_of_the_meta_function(problem):
    """With D'' = D, (I - alpha H(w; D)) grad f(w~; D') = grad_w f(w - alpha grad f(w; D); D')."""
    loss, w, (d, d1, _) = problem
    alpha = 0.3

    def meta(params):
        return loss(sgd(params, grad(loss)(params, *d), alpha), *d1)

    expected = grad(meta)(w)
    got, _ = perfedavg(loss, w, d, d1, d, StepSizes(alpha, 0.1))
    for k in w:
        torch.testing.assert_close(got[k], expected[k])


@pytest.mark.parametrize("name", ["perfedavg", "perfedavg-fo", "perfedavg-hf"])
def test_alpha_zero_reduces_to_sgd_on_d_prime(problem, name):
    loss, w, (d, d1, d2) = problem
    s = StepSizes(alpha=0.0, beta=0.1)
    new, _ = local_update(RULES[name], loss, w, *_steps([(d, d1, d2)]), s)
    expected = sgd(w, grad(loss)(w, *d1), 0.1)
    for k in w:
        torch.testing.assert_close(new[k], expected[k])


def test_fedavg_is_sgd_on_d_and_local_update_takes_tau_steps(problem):
    loss, w, (d, d1, d2) = problem
    s = StepSizes(alpha=0.01, beta=0.1)
    new, mean_loss = local_update(RULES["fedavg"], loss, w, *_steps([(d, d1, d2), (d1, d, d2)]), s)
    step1 = sgd(w, grad(loss)(w, *d), 0.1)
    step2 = sgd(step1, grad(loss)(step1, *d1), 0.1)
    for k in w:
        torch.testing.assert_close(new[k], step2[k])
    torch.testing.assert_close(mean_loss, (loss(w, *d) + loss(step1, *d1)) / 2)


def test_adapt_is_one_sgd_step(problem):
    loss, w, (d, _, _) = problem
    adapted = adapt(loss, w, d, 0.25)
    g = grad(loss)(w, *d)
    for k in w:
        torch.testing.assert_close(adapted[k], w[k] - 0.25 * g[k])
    assert loss(adapted, *d) < loss(w, *d)


VARIANTS = [(name, False) for name in sorted(RULES)] + [("perfedavg-hf", True)]


@pytest.mark.parametrize(("name", "normalized"), VARIANTS)
def test_vectorised_update_of_many_users_matches_one_at_a_time(problem, name, normalized):
    """Also for HF's delta / ||g||: each user's own ||g||, not one over the batch."""
    loss, w, _ = problem
    s = StepSizes(alpha=0.05, beta=0.1, normalized_delta=normalized)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 3, 3, 40, 16, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (4, 3, 3, 40), generator=gen)
    many, losses = local_update_many(RULES[name], loss, w, x, y, s)
    for u in range(4):
        one, value = local_update(RULES[name], loss, w, x[u], y[u], s)
        torch.testing.assert_close(losses[u], value)
        for k in w:
            torch.testing.assert_close(many[k][u], one[k])
