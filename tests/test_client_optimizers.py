"""Client optimisers against torch.optim, step by step, and the methods that use them."""

from __future__ import annotations

import pytest
import torch

from perfed_ray.algorithms import client_update
from perfed_ray.config import from_mapping
from perfed_ray.engines.functional import FunctionalOps
from perfed_ray.models import build_model, params_of
from perfed_ray.registry import ALGORITHMS, CLIENT_OPTIMIZERS

OPTIMISERS = [
    ("sgd", {}, torch.optim.SGD, {}),
    ("sgd", {"momentum": 0.5, "weight_decay": 1e-2}, torch.optim.SGD, {}),
    ("sgd", {"momentum": 0.9, "nesterov": True}, torch.optim.SGD, {}),
    ("adam", {}, torch.optim.Adam, {}),
    ("adam", {"beta1": 0.5, "beta2": 0.9, "eps": 1e-6, "weight_decay": 1e-3}, torch.optim.Adam, {}),
]


def _torch_kwargs(name: str, section: dict) -> dict:
    if name == "sgd":
        return section
    renamed = {k: v for k, v in section.items() if k not in ("beta1", "beta2")}
    return {**renamed, "betas": (section.get("beta1", 0.9), section.get("beta2", 0.999))}


@pytest.mark.parametrize(("name", "section", "reference", "_"), OPTIMISERS)
def test_each_rule_is_torch_optims_step_for_step(name, section, reference, _):
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 10).double()
    ops = FunctionalOps(model)
    params = {k: v.detach().clone() for k, v in params_of(model).items()}
    batches = [
        (torch.randn(8, 16, dtype=torch.float64), torch.randint(0, 10, (8,))) for _ in range(4)
    ]
    cfg = from_mapping({"client_optimizer": name, name: section})
    leaves = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    theirs = reference(list(leaves.values()), lr=0.05, **_torch_kwargs(name, section))
    _same_steps(CLIENT_OPTIMIZERS.load(name)(cfg), theirs, ops, params, leaves, batches)


def _same_steps(ours, theirs, ops, params: dict, leaves: dict, batches: list) -> None:
    """Our rule from `params` and torch's optimiser over `leaves` (the same values), step
    for step on `batches` at lr 0.05, end equal."""
    mine, state = params, ours.init(params)
    for batch in batches:
        mine, state = ours.step(mine, ops.grad(mine, batch), state, 0.05)
        theirs.zero_grad()
        grads = ops.grad(dict(leaves), batch)
        for k, p in leaves.items():
            p.grad = grads[k].detach()
        theirs.step()
    for k in params:
        # float64, but not bit-exact: the two sides' gradients are summed in whatever order
        # the threads take, and Adam divides their last bits by sqrt(v) (4.8e-12 seen in
        # CI). A wrong rule is far off: Adam's beta1 at 0.91 for 0.9 moves a weight 4.2e-3.
        torch.testing.assert_close(mine[k], leaves[k].detach(), rtol=1e-9, atol=1e-10)


def test_sgd_can_decay_weights_only_as_fedreps_parameter_groups_do():
    torch.manual_seed(0)
    model = build_model("cnn", (3, 32, 32), 10).double()
    ops = FunctionalOps(model)
    params = {k: v.detach().clone() for k, v in params_of(model).items()}
    batches = [
        (torch.randn(4, 3 * 32 * 32, dtype=torch.float64), torch.randint(0, 10, (4,)))
        for _ in range(3)
    ]
    section = {"momentum": 0.5, "weight_decay": 0.1, "decay_biases": False}
    ours = CLIENT_OPTIMIZERS.load("sgd")(from_mapping({"sgd": section}))
    leaves = {k: torch.nn.Parameter(v.clone()) for k, v in params.items()}
    weights = [p for k, p in leaves.items() if not k.endswith("bias")]
    biases = [p for k, p in leaves.items() if k.endswith("bias")]
    assert weights and biases
    theirs = torch.optim.SGD(  # FedRep's models/Update.py: two groups, biases undecayed
        [{"params": weights, "weight_decay": 0.1}, {"params": biases, "weight_decay": 0.0}],
        lr=0.05,
        momentum=0.5,
    )
    _same_steps(ours, theirs, ops, params, leaves, batches)


def test_fedavg_with_momentum_is_momentum_sgd_and_plain_sgd_keeps_no_state():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 4, 4), 10).double()
    ops = FunctionalOps(model)
    w = {k: v.detach() for k, v in params_of(model).items()}
    steps = [
        [(torch.randn(8, 16, dtype=torch.float64), torch.randint(0, 10, (8,)))] for _ in range(3)
    ]
    plain = ALGORITHMS.load("fedavg")(from_mapping({"algorithm": "fedavg"}))
    assert plain.client_init(ops, w, None)["opt"] == {}
    heavy = ALGORITHMS.load("fedavg")(
        from_mapping({"algorithm": "fedavg", "beta": 0.1, "sgd": {"momentum": 0.5}})
    )
    got = client_update(heavy, ops, w, steps, None)[0]
    expected, buffer = w, {k: torch.zeros_like(v) for k, v in w.items()}
    for (batch,) in steps:
        g = ops.grad(expected, batch)
        buffer = {k: 0.5 * buffer[k] + g[k] for k in w}
        expected = {k: expected[k] - 0.1 * buffer[k] for k in w}
    for k in w:
        torch.testing.assert_close(got[k], expected[k])


def test_a_step_written_over_its_gradient_has_the_same_numbers_and_new_memory_otherwise():
    """sgd(w, d, lr, into=d) writes the result over d with sgd's own numbers; it declines
    (new memory) where writing could change a value another tensor holds: leaves sharing
    memory, a tensor step size, `torch.func`'s transforms."""
    from perfed_ray.algorithms.tree import sgd

    gen = torch.Generator().manual_seed(0)
    w = {"a": torch.randn(300, 40, generator=gen), "b": torch.randn(40, generator=gen)}
    d = {k: torch.randn(v.shape, generator=gen) for k, v in w.items()}
    expected = sgd(w, d, 0.37)
    into = {k: v.clone() for k, v in d.items()}
    got = sgd(w, into, 0.37, into=into)
    for k in w:
        assert torch.equal(got[k], expected[k]) and got[k].data_ptr() == into[k].data_ptr()
    shared = torch.randn(40, generator=gen)
    aliased = {"a": d["a"].clone(), "b": shared, "c": shared}
    three = {**w, "c": w["b"]}
    assert sgd(three, aliased, 0.37, into=aliased)["b"].data_ptr() != shared.data_ptr()
    lr = torch.tensor(0.37)
    assert sgd(w, into, lr, into=into)["a"].data_ptr() != into["a"].data_ptr()
    rows = torch.func.vmap(lambda wa, da: sgd({"a": wa}, {"a": da}, 0.37, into={"a": da})["a"])
    torch.testing.assert_close(rows(w["a"], d["a"]), expected["a"])


@pytest.mark.parametrize(
    "values",
    [{}, {"sgd.weight_decay": 0.1}, {"sgd.weight_decay": 0.1, "sgd.decay_biases": False}],
)
def test_sgds_consuming_step_is_its_step(values):
    """The step that may write over the handed-over gradient gives step's numbers, and
    step itself leaves the caller's gradient as it was."""
    cfg = from_mapping(values)
    rule = CLIENT_OPTIMIZERS.load(cfg.client_optimizer)(cfg)
    gen = torch.Generator().manual_seed(1)
    w = {"x.weight": torch.randn(20, 5, generator=gen), "x.bias": torch.randn(20, generator=gen)}
    g = {k: torch.randn(v.shape, generator=gen) for k, v in w.items()}
    kept = {k: v.clone() for k, v in g.items()}
    expected, _ = rule.step(w, g, {}, 0.2)
    assert all(torch.equal(g[k], kept[k]) for k in g)
    got, _ = rule.consuming_step(w, g, {}, 0.2)
    assert all(torch.equal(got[k], expected[k]) for k in w)
