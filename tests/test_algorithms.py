"""The built-in algorithms against autodiff ground truth (Section 5, Appendix H)."""

from __future__ import annotations

import pytest
import torch
from torch.func import grad

from perfed_ray.algorithms import client_update, sgd
from perfed_ray.config import from_mapping
from perfed_ray.engines.functional import FunctionalOps
from perfed_ray.models import build_model, params_of
from perfed_ray.registry import ALGORITHMS


@pytest.fixture
def problem():
    """A random MLP (double precision, so differences are not lost in rounding) and batches."""
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 10).double()
    params = {k: v.double() for k, v in params_of(model).items()}
    batches = [
        (torch.randn(40, 16, dtype=torch.float64), torch.randint(0, 10, (40,))) for _ in range(3)
    ]
    return FunctionalOps(model), params, batches


def _algorithm(name: str, **values):
    return ALGORITHMS.load(name)(from_mapping({"algorithm": name, **values}))


def _distance(a, b) -> float:
    return float(torch.sqrt(sum(((a[k] - b[k]) ** 2).sum() for k in a)))


def _norm(a) -> float:
    return float(torch.sqrt(sum((v**2).sum() for v in a.values())))


def _direction(name, ops, w, batches, **values):
    return _algorithm(name, **values).direction(ops, w, batches)[0]


def test_hf_direction_tends_to_exact_as_delta_shrinks(problem):
    ops, w, batches = problem
    exact = _direction("perfedavg", ops, w, batches, alpha=0.5, beta=0.1)
    errors = [
        _distance(
            _direction("perfedavg-hf", ops, w, batches, alpha=0.5, beta=0.1, delta=delta), exact
        )
        / _norm(exact)
        for delta in (1e-1, 1e-2, 1e-3)
    ]
    # ELU's second derivative jumps at 0, so the error shrinks at least like delta
    # (like delta^2 where no unit sits near its kink).
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < errors[0] / 100
    assert errors[2] < 1e-6


def test_normalized_hf_is_fixed_hf_with_delta_over_the_gradient_norm(problem):
    ops, w, batches = problem
    g = _direction("perfedavg-fo", ops, w, batches, alpha=0.5)
    got = _direction("perfedavg-hf", ops, w, batches, alpha=0.5, delta=1e-2, hf_delta="normalized")
    expected = _direction("perfedavg-hf", ops, w, batches, alpha=0.5, delta=1e-2 / _norm(g))
    for k in w:
        torch.testing.assert_close(got[k], expected[k])


def test_normalized_hf_tends_to_exact_as_the_perturbation_shrinks(problem):
    ops, w, batches = problem
    exact = _direction("perfedavg", ops, w, batches, alpha=0.5)
    errors = [
        _distance(
            _direction(
                "perfedavg-hf", ops, w, batches, alpha=0.5, delta=delta, hf_delta="normalized"
            ),
            exact,
        )
        / _norm(exact)
        for delta in (1e-1, 1e-3)
    ]
    assert errors[1] < errors[0] / 10 and errors[1] < 1e-6


def test_normalized_hf_with_a_zero_gradient_is_zero_not_nan():
    """A flat loss has g = 0: the guarded step keeps the difference 0 / finite."""

    class Flat(FunctionalOps):
        def _loss(self, params, x, y):
            return (params["v"] * 0).sum() + x.sum()

    w = {"v": torch.ones(3, dtype=torch.float64)}
    batch = (torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.long))
    direction = _direction(
        "perfedavg-hf",
        Flat(torch.nn.Linear(3, 1)),
        w,
        [batch] * 3,
        alpha=0.5,
        hf_delta="normalized",
    )
    torch.testing.assert_close(direction["v"], torch.zeros(3, dtype=torch.float64))


def test_hessian_vector_product_matches_reverse_over_reverse(problem):
    """Our forward-over-reverse HVP against PyTorch's double-backward one."""
    ops, w, (d, _, _) = problem
    v = {k: torch.randn_like(x) for k, x in w.items()}
    names = list(w)

    def flat_loss(*tensors):
        return ops.loss(dict(zip(names, tensors, strict=True)), d)

    _, expected = torch.autograd.functional.hvp(
        flat_loss, tuple(w[k] for k in names), tuple(v[k] for k in names)
    )
    got = ops.hvp(w, d, v)
    for k, e in zip(names, expected, strict=True):
        torch.testing.assert_close(got[k], e)


def test_exact_direction_is_the_gradient_of_the_meta_function(problem):
    """With D'' = D, (I - alpha H(w; D)) grad f(w~; D') = grad_w f(w - alpha grad f(w; D); D')."""
    ops, w, (d, d1, _) = problem
    alpha = 0.3

    def meta(params):
        return ops.loss(sgd(params, ops.grad(params, d), alpha), d1)

    expected = grad(meta)(w)
    got = _direction("perfedavg", ops, w, [d, d1, d], alpha=alpha)
    for k in w:
        torch.testing.assert_close(got[k], expected[k])


@pytest.mark.parametrize("name", ["perfedavg", "perfedavg-fo", "perfedavg-hf"])
def test_alpha_zero_reduces_to_sgd_on_d_prime(problem, name):
    ops, w, batches = problem
    new, _, _ = client_update(_algorithm(name, alpha=0.0, beta=0.1), ops, w, [batches], None)
    expected = sgd(w, ops.grad(w, batches[1]), 0.1)
    for k in w:
        torch.testing.assert_close(new[k], expected[k])


def test_fedavg_is_sgd_on_d_and_client_update_takes_tau_steps(problem):
    ops, w, (d, d1, d2) = problem
    fedavg = _algorithm("fedavg", beta=0.1)
    new, mean_loss, state = client_update(fedavg, ops, w, [(d, d1, d2), (d1, d, d2)], None)
    step1 = sgd(w, ops.grad(w, d), 0.1)
    step2 = sgd(step1, ops.grad(step1, d1), 0.1)
    for k in w:
        torch.testing.assert_close(new[k], step2[k])
    torch.testing.assert_close(mean_loss, (ops.loss(w, d) + ops.loss(step1, d1)) / 2)
    assert state is None  # FedAvg keeps no per-user state


def test_personalisation_is_one_sgd_step_of_size_alpha(problem):
    ops, w, (d, _, _) = problem
    adapted = _algorithm("perfedavg-hf", alpha=0.25).personalise(ops, w, None, [d])
    g = ops.grad(w, d)
    for k in w:
        torch.testing.assert_close(adapted[k], w[k] - 0.25 * g[k])
    assert ops.loss(adapted, d) < ops.loss(w, d)


def test_ditto_is_fedavg_globally_and_local_training_personally_without_its_pull(problem):
    """Ditto with lambda = 0: its global copy moves as FedAvg's, its personal model as a
    user training alone (both on the same D); with lambda > 0 the personal model's steps
    are written out, v <- v - beta (grad f(v; D) + lambda (v - w^t)), w^t the round's
    start (eq. 2), and pull it towards the global model."""
    ops, w, (d, d1, d2) = problem
    steps = [(d, d1, d2), (d1, d2, d)]
    own = {k: v + 0.1 for k, v in w.items()}
    ditto = _algorithm("ditto", beta=0.1, ditto={"lambda": 0.0})
    new_w, _, new_v = client_update(ditto, ops, w, steps, own)
    fedavg, _, _ = client_update(_algorithm("fedavg", beta=0.1), ops, w, steps, None)
    alone, _, _ = client_update(_algorithm("local", beta=0.1), ops, w, steps, own)
    for k in w:
        torch.testing.assert_close(new_w[k], fedavg[k])
        torch.testing.assert_close(new_v[k], alone[k])
    _, _, pulled = client_update(
        _algorithm("ditto", beta=0.1, ditto={"lambda": 1.0}), ops, w, steps, own
    )
    v = _proximal_steps(ops, own, w, (d, d1), beta=0.1, pull=1.0)
    for k in w:
        torch.testing.assert_close(pulled[k], v[k])
    assert _distance(pulled, w) < _distance(new_v, w)


def _proximal_steps(ops, start, anchor, batches, beta, pull):
    """SGD written out on f + pull/2 |x - anchor|^2 (Ditto's personal steps, FedProx's
    local ones): x <- x - beta (grad f(x; D) + pull (x - anchor)), one batch a step."""
    x = start
    for batch in batches:
        g = ops.grad(x, batch)
        x = {k: x[k] - beta * (g[k] + pull * (x[k] - anchor[k])) for k in x}
    return x


def test_pfedme_moves_w_towards_theta_and_the_server_mixes_by_beta(problem):
    ops, w, (d, d1, d2) = problem
    pfedme = _algorithm("pfedme", beta=0.005, pfedme={"steps": 3, "beta": 0.5})
    state = pfedme.client_init(ops, w, None)
    theta = w
    for _ in range(3):  # the K personal steps, written out
        g = ops.grad(theta, d)
        theta = {k: theta[k] - 0.09 * (g[k] + 15 * (theta[k] - w[k]) + 0.001 * theta[k]) for k in w}
    after, _ = pfedme.client_step(ops, state, (d, d1, d2))
    for k in w:
        torch.testing.assert_close(after["theta"][k], theta[k])
        torch.testing.assert_close(after["w"][k], w[k] - 0.005 * 15 * (w[k] - theta[k]))
    mixed = pfedme.server_update(w, {k: v + 2.0 for k, v in w.items()})
    for k in w:
        torch.testing.assert_close(mixed[k], w[k] + 1.0)


def test_fedrep_trains_the_head_then_the_body_and_personalises_the_head(problem):
    """tau = 3, one body step: two SGD steps on the head with the body fixed, then one on
    the body with the head fixed; the user keeps its head, and personalisation moves
    the head alone."""
    ops, w, (d, d1, d2) = problem
    head = {k: w[k] + 0.1 for k in ("net.4.weight", "net.4.bias")}  # the MLP's last layer
    fedrep = _algorithm("fedrep", beta=0.1, alpha=0.2, tau=3, fedrep={"body_steps": 1})
    model, _, kept = client_update(fedrep, ops, w, [(d,), (d1,), (d2,)], head)
    expected = {k: head.get(k, v) for k, v in w.items()}
    for batch, part in ((d, head), (d1, head), (d2, [k for k in w if k not in head])):
        g = ops.grad(expected, batch)
        expected = {k: v - 0.1 * g[k] if k in part else v for k, v in expected.items()}
    for k in w:
        torch.testing.assert_close(model[k], expected[k])
    assert set(kept) == set(head)
    for k in head:
        torch.testing.assert_close(kept[k], expected[k])
    adapted = fedrep.personalise(ops, expected, kept, [d])
    g = ops.grad(expected, d)
    for k in w:
        torch.testing.assert_close(
            adapted[k], expected[k] - 0.2 * g[k] if k in head else expected[k]
        )


def test_a_part_gradient_is_the_full_gradients_part_and_differentiates_nothing_else(problem):
    """FedRep's head step, one user at a time: the head's gradient equals the full
    gradient's head, the rest are zeros, and autodiff never reaches the body (a body
    that cannot be differentiated does not stop it)."""
    from perfed_ray.algorithms.base import grad_and_loss_of

    ops, w, (d, _, _) = problem
    head = ["net.4.weight", "net.4.bias"]
    full, loss = ops.grad_and_loss(w, d)
    part, part_loss = grad_and_loss_of(ops, w, d, head)
    torch.testing.assert_close(part_loss, loss)
    assert list(part) == list(w)
    for k in w:
        torch.testing.assert_close(part[k], full[k] if k in head else torch.zeros_like(w[k]))

    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(x):
            return x.clone()

        @staticmethod
        def setup_context(ctx, inputs, output):
            pass

        @staticmethod
        def backward(ctx, g):
            raise AssertionError("the body was differentiated")

    class Blocked(FunctionalOps):
        def loss(self, params, batch):
            return super().loss(
                {k: v if k in head else NoBackward.apply(v) for k, v in params.items()}, batch
            )

    blocked = Blocked(ops.model)
    torch.testing.assert_close(
        grad_and_loss_of(blocked, w, d, head)[0]["net.4.bias"], full["net.4.bias"]
    )
    with pytest.raises(AssertionError, match="differentiated"):
        torch.func.grad(lambda p: blocked.loss(p, d))(w)


def test_a_flag_is_concrete_for_one_plain_user_only():
    from perfed_ray.algorithms.base import concrete

    assert concrete(torch.tensor(True)) is True
    assert concrete(torch.tensor(0) >= 1) is False
    assert concrete(torch.tensor([True, False])) is None
    seen = []
    torch.func.vmap(lambda t: seen.append(concrete(t)) or t)(torch.ones(3))
    assert seen == [None]


def test_fedavg_ft_trains_as_fedavg_and_fine_tunes_on_each_of_its_batches(problem):
    ops, w, (d, d1, d2) = problem
    ft = _algorithm("fedavg-ft", alpha=0.2, **{"fedavg-ft.finetune_steps": 3})
    assert ft.personalise_batches == 3
    steps = [(d, d1, d2), (d1, d2, d)]
    trained = client_update(ft, ops, w, steps, None)[0]
    plain = client_update(_algorithm("fedavg"), ops, w, steps, None)[0]
    tuned = ft.personalise(ops, trained, None, [d, d1, d2])
    expected = trained
    for batch in (d, d1, d2):
        expected = sgd(expected, ops.grad(expected, batch), 0.2)
    for k in w:
        torch.testing.assert_close(trained[k], plain[k])
        torch.testing.assert_close(tuned[k], expected[k])


def test_fedrep_rejects_more_body_steps_than_tau():
    from perfed_ray.errors import ConfigError

    with pytest.raises(ConfigError, match=r"fedrep\.body_steps = 5 exceeds tau = 4"):
        _algorithm("fedrep", tau=4, fedrep={"body_steps": 5})


def test_fedprox_is_sgd_on_the_proximal_objective_and_fedavg_without_its_pull(problem):
    """Two steps written out: w <- w - beta (grad f(w; D) + mu (w - w^t)), w^t the
    round's start; with mu = 0, FedAvg's steps; the user keeps no state."""
    ops, w0, (d, d1, d2) = problem
    steps = [(d, d1, d2), (d1, d2, d)]
    fedprox = _algorithm("fedprox", beta=0.1, fedprox={"mu": 0.5})
    model, _, state = client_update(fedprox, ops, w0, steps, None)
    w = _proximal_steps(ops, w0, w0, (d, d1), beta=0.1, pull=0.5)
    for k in w0:
        torch.testing.assert_close(model[k], w[k])
    assert state is None and fedprox.personal_model(ops, w0, None) is w0
    free, _, _ = client_update(
        _algorithm("fedprox", beta=0.1, fedprox={"mu": 0.0}), ops, w0, steps, None
    )
    fedavg, _, _ = client_update(_algorithm("fedavg", beta=0.1), ops, w0, steps, None)
    for k in w0:
        torch.testing.assert_close(free[k], fedavg[k])


def test_apfl_steps_w_v_and_alpha_from_the_previous_iterates(problem):
    """Two local steps written out (Algorithm 1 with the adaptive alpha): w by SGD on
    f(w), v by alpha grad f(vbar), alpha by <v - w, grad f(vbar)> clipped to [0, 1], all
    from the old values; the personal model is alpha v + (1 - alpha) w."""
    ops, w0, (d, d1, d2) = problem
    v0 = {k: x + 0.05 for k, x in w0.items()}
    apfl = _algorithm("apfl", beta=0.1, apfl={"alpha": 0.3, "alpha_lr": 0.2})
    start = {"v": v0, "alpha": torch.tensor(0.3, dtype=torch.float64)}
    model, _, state = client_update(apfl, ops, w0, [(d, d1, d2), (d1, d2, d)], start)
    w, v, a = w0, v0, 0.3
    for batch in (d, d1):
        g_w = ops.grad(w, batch)
        g = ops.grad({k: a * v[k] + (1 - a) * w[k] for k in w}, batch)
        slope = sum(float(((v[k] - w[k]) * g[k]).sum()) for k in w)
        w, v, a = (
            {k: w[k] - 0.1 * g_w[k] for k in w},
            {k: v[k] - 0.1 * a * g[k] for k in w},
            min(max(a - 0.2 * slope, 0.0), 1.0),
        )
    for k in w0:
        torch.testing.assert_close(model[k], w[k])
        torch.testing.assert_close(state["v"][k], v[k])
    assert float(state["alpha"]) == pytest.approx(a, rel=1e-9)
    assert 0.0 < a < 1.0 and a != 0.3  # it moved, unclipped
    mixed = apfl.personal_model(ops, w0, state)
    for k in w0:
        torch.testing.assert_close(mixed[k], a * v[k] + (1 - a) * w0[k])


def test_apfl_alpha_gradient_is_the_derivative_of_the_mixtures_loss(problem):
    """<v - w, grad f(vbar)> = d/d alpha f(alpha v + (1 - alpha) w), by autodiff; a large
    step clips alpha into [0, 1]; without `adaptive`, alpha stays."""
    ops, w, (d, _, _) = problem
    v = {k: x + 0.05 * torch.randn_like(x) for k, x in w.items()}
    alpha = torch.tensor(0.4, dtype=torch.float64)

    def mixture_loss(a):
        return ops.loss({k: a * v[k] + (1 - a) * w[k] for k in w}, d)

    slope = grad(mixture_loss)(alpha)
    g = ops.grad({k: alpha * v[k] + (1 - alpha) * w[k] for k in w}, d)
    torch.testing.assert_close(ops.inner({k: v[k] - w[k] for k in w}, g), slope)
    state = {"w": w, "v": v, "alpha": alpha}
    stepped, _ = _algorithm("apfl", apfl={"alpha_lr": 1e6}).client_step(ops, state, [d])
    assert float(stepped["alpha"]) == (0.0 if slope > 0 else 1.0)
    fixed, _ = _algorithm("apfl", apfl={"adaptive": False}).client_step(ops, state, [d])
    assert fixed["alpha"] is alpha
