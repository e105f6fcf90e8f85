"""The execution seam: every engine runs every algorithm to the sequential engine's
numbers, stateless and stateful, compiled or not.

The comparisons run in float64. In float32 the engines' different kernels (and one
engine's kernels on CPUs of other vector widths: ATEN_CPU_CAPABILITY) round
differently, and a discrete event can turn that rounding into a large difference: in
Per-FedAvg (HF) with simple_cnn's dropout, a first-layer unit whose pre-activation was
4.8e-7 came out -3.9e-7 on one kernel, its ReLU switched off inside the central
difference at w - delta g, and the whole 3x3x3 filter's update moved by 0.097 (the
gradient's change times alpha / (2 delta)). In float64 the same rounding is 2^29 times
smaller, such a tie is that much less likely, and the engines agree to about 1e-14,
so torch's float64 tolerances (1e-7) hold on any CPU and still see any real
difference (a step's size, lr x gradient, is 1e-4 and more)."""

from __future__ import annotations

import hashlib
import math
import sys
from pathlib import Path

import pytest
import torch

from perfed_ray.algorithms.tree import tree_map
from perfed_ray.config import from_mapping
from perfed_ray.engines import make_engine
from perfed_ray.engines.functional import FunctionalOps, plain
from perfed_ray.engines.stacked import chain_of, elu
from perfed_ray.masks import round_masks, sites
from perfed_ray.models import build_model, params_of
from perfed_ray.registry import ALGORITHMS, ENGINES

sys.path.insert(0, str(Path(__file__).parent / "plugins"))

METHODS = [
    ("fedavg", {}),
    ("perfedavg-fo", {}),
    ("perfedavg-hf", {}),
    ("perfedavg", {}),
    ("perfedavg-hf", {"hf_delta": "normalized"}),
    ("momentum:PersistentMomentum", {}),
    ("local", {}),
    ("ditto", {}),
    ("pfedme", {"pfedme.steps": 2}),
    ("fedrep", {"tau": 3}),
    ("fedavg-ft", {}),
    ("fedprox", {"fedprox.mu": 0.5}),
    ("apfl", {}),
    ("apfl", {"apfl.alpha_lr": 0.01}),  # alpha stays inside [0, 1] for every user
    ("apfl", {"apfl.adaptive": False}),
    ("ditto", {"sgd.momentum": 0.5, "sgd.weight_decay": 0.01}),
    ("fedrep", {"tau": 3, "sgd.momentum": 0.5, "sgd.nesterov": True}),
]


def _work(users: int, tau: int = 3, seed: int = 0, shape=(1, 28, 28), batch: int = 40):
    """Random inputs in float64 (the module's docstring says why) and labels."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(users, tau, 3, batch, math.prod(shape), generator=gen, dtype=torch.float64)
    y = torch.randint(0, 10, (users, tau, 3, batch), generator=gen)
    return x, y


def _run(
    name, values, engine, x, y, compile=False, steps=None, shape=(1, 28, 28), masks=None, **ops
):
    """The engine's round, its model in the inputs' dtype; `autograd=False`: the
    sequential engine's ops by `torch.func` alone (the reference its plain-autograd path
    is tested against); `layout`: its images' on a CPU. The engine named is the one that
    runs: a model it could not run would fall back to vmap, and a comparison with the
    sequential engine would then test vmap under the other's name."""
    cfg = from_mapping({"algorithm": name, "alpha": 0.05, "beta": 0.1, **values})
    model = build_model(cfg.model, shape, 10, seed=0).to(x.dtype)
    if "layout" in ops:
        model.cpu_layout = ops["layout"]
    algorithm = ALGORITHMS.load(name)(cfg)
    server = params_of(model)
    first = algorithm.init_user_state(server)
    states = (
        None
        if first is None
        else tree_map(lambda v: torch.stack([v + 0.01 * u for u in range(len(x))]), first)
    )
    made = make_engine(engine, algorithm, model, compile)
    assert type(made) is ENGINES.load(engine), f"{engine} fell back to {type(made).__name__}"
    if not ops.get("autograd", True):
        made.functional = FunctionalOps(model, autograd=False)
    return made.run(server, x, y, states, steps, masks)


_EXPECTED: dict[str, tuple] = {}


def _digest(*parts) -> str:
    """A key for tensors, dicts of them and plain values: equal inputs, equal keys."""
    digest = hashlib.sha256()

    def add(part) -> None:
        if isinstance(part, torch.Tensor):
            digest.update(repr((part.dtype, tuple(part.shape))).encode())
            digest.update(part.contiguous().numpy().tobytes())
        elif isinstance(part, dict):
            for key in sorted(part):
                digest.update(repr(key).encode())
                add(part[key])
        else:
            digest.update(repr(part).encode())

    for part in parts:
        add(part)
    return digest.hexdigest()


def _expected(name, values, x, y, **work):
    """:func:`_run` on the sequential engine, the reference each engine is compared with:
    made once for all the engines compared on the same method and inputs."""
    key = _digest(name, values, x, y, work)
    if key not in _EXPECTED:
        _EXPECTED[key] = _run(name, values, "sequential", x, y, **work)
    return _EXPECTED[key]


def _assert_close(got, expected):
    """Losses, models and states equal to torch's tolerances for their dtype (float64's
    here: the module's docstring)."""
    models, losses, states = got
    assert losses.dtype == torch.float64
    torch.testing.assert_close(losses, expected[1])
    for k in expected[0]:
        torch.testing.assert_close(models[k], expected[0][k])
    assert (states is None) == (expected[2] is None)
    if states is not None:
        for k in expected[2]:
            torch.testing.assert_close(states[k], expected[2][k])


@pytest.mark.parametrize(("name", "values"), METHODS)
@pytest.mark.parametrize("engine", ["vmap", "fused"])
def test_engines_match_sequential(name, values, engine):
    x, y = _work(users=5)
    _assert_close(_run(name, values, engine, x, y), _expected(name, values, x, y))


IMAGE = (3, 8, 8)  # small images: the maths of a 32 x 32 one, in a tenth of the time


@pytest.mark.parametrize(("name", "values"), METHODS)
def test_grouped_convolutions_match_sequential(name, values):
    """Users as the groups of grouped convolutions (the CNN), every method."""
    x, y = _work(users=3, tau=2, shape=IMAGE, batch=4)
    values = {"model": "cnn", **values}
    _assert_close(
        _run(name, values, "grouped", x, y, shape=IMAGE),
        _run(name, values, "sequential", x, y, shape=IMAGE),
    )


@pytest.mark.parametrize("name", ["fedavg", "perfedavg-hf"])
def test_grouped_runs_lenet(name):
    """FedRep's authors' CNN: ReLU, no padding, three linear layers."""
    shape = (3, 16, 16)  # LeNet's smallest
    x, y = _work(users=2, tau=2, shape=shape, batch=2)
    values = {"model": "lenet"}
    _assert_close(
        _run(name, values, "grouped", x, y, shape=shape),
        _run(name, values, "sequential", x, y, shape=shape),
    )


@pytest.mark.parametrize(
    ("name", "values"), [("fedavg", {}), ("fedprox", {"fedprox.mu": 0.5, "sgd.momentum": 0.5})]
)
def test_grouped_runs_blocks_of_users_with_different_numbers_of_steps(name, values):
    """More users than a block, of different sizes (`local_epochs`), masked as in the
    fused engine whose blocks it shares."""
    from perfed_ray.engines.fused import BLOCK

    x, y = _work(users=BLOCK + 1, tau=3, shape=IMAGE, batch=2)
    x, y = x[:, :, :1], y[:, :, :1]
    steps = torch.arange(len(x)) % 3 + 1
    values = {"model": "cnn", "local_epochs": 2, **values}
    _assert_close(
        _run(name, values, "grouped", x, y, shape=IMAGE, steps=steps),
        _run(name, values, "sequential", x, y, shape=IMAGE, steps=steps),
    )


@pytest.mark.parametrize("name", ["perfedavg-hf", "pfedme", "fedrep", "fedprox", "apfl"])
def test_logistic_regression_is_a_chain_the_fused_engine_runs(name):
    logreg = build_model("logreg", (1, 28, 28), 10)
    assert len(chain_of(logreg)) == 1
    x, y = _work(users=4)
    values = {"model": "logreg", "tau": 3}
    _assert_close(_run(name, values, "fused", x, y), _run(name, values, "sequential", x, y))


def test_fused_runs_more_users_than_a_block_in_blocks():
    from perfed_ray.engines.fused import BLOCK

    x, y = _work(users=BLOCK + 3, tau=2)
    _assert_close(
        _run("perfedavg-hf", {}, "fused", x, y), _run("perfedavg-hf", {}, "sequential", x, y)
    )


def test_fused_blocks_are_small_on_a_cpu_and_bounded_by_bytes_elsewhere():
    """On an accelerator (`meta` stands in: CI has no GPU) one block takes as many
    users as GPU_BLOCK_BYTES of stacked weights hold, never fewer than a CPU's."""
    from perfed_ray.engines.fused import BLOCK, GPU_BLOCK_BYTES, block_size

    assert block_size([torch.zeros(1000)]) == BLOCK
    assert block_size([torch.empty(1000, device="meta")]) == GPU_BLOCK_BYTES // 4000
    assert block_size([torch.empty(2**28, device="meta")]) == BLOCK


@pytest.mark.slow
def test_compiled_fused_matches_sequential_for_several_block_sizes(tmp_path, monkeypatch):
    import torch._inductor.config

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    # Compiled here, not in the pool of a process a core that inductor would start for it
    # (whose start costs more than it saves on CI's 2 cores): the same kernels.
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)
    for users in (3, 5):
        x, y = _work(users=users, tau=2, seed=users)
        _assert_close(
            _run("fedavg", {}, "fused", x, y, compile=True), _run("fedavg", {}, "sequential", x, y)
        )


def test_inner_is_one_number_per_user_on_both_ops():
    from perfed_ray.engines.functional import FunctionalOps
    from perfed_ray.engines.stacked import StackedOps

    model = build_model("mlp", (1, 28, 28), 10, seed=0)
    gen = torch.Generator().manual_seed(0)
    a, b = (
        {k: torch.randn(3, *v.shape, generator=gen) for k, v in params_of(model).items()}
        for _ in range(2)
    )
    got = StackedOps(chain_of(model)).inner(a, b)
    assert got.shape == (3,)
    for u in range(3):
        one = FunctionalOps(model).inner(
            {k: v[u] for k, v in a.items()}, {k: v[u] for k, v in b.items()}
        )
        by_hand = sum(float((a[k][u] * b[k][u]).sum()) for k in a)
        torch.testing.assert_close(got[u], one)
        assert float(one) == pytest.approx(by_hand, rel=1e-5)


@pytest.mark.parametrize("engine", ["vmap", "fused"])
def test_adam_runs_on_every_engine_to_its_rounding(engine):
    """Adam divides by the root of its second moment, so rounding differences in a
    near-zero gradient grow by 1 / (sqrt(v) + eps): in float32 the engines agreed to
    1e-4 only; in float64 to torch's tolerances."""
    x, y = _work(users=3)
    values = {"client_optimizer": "adam", "beta": 0.001}
    _assert_close(_run("fedavg", values, engine, x, y), _expected("fedavg", values, x, y))


def test_fast_elu_is_elu():
    z = torch.linspace(-20, 20, 10001)
    torch.testing.assert_close(elu(z), torch.nn.functional.elu(z), rtol=0, atol=2e-7)


def test_models_that_are_no_linear_chain_fall_back_to_vmap(capsys):
    cnn = build_model("cnn", (3, 32, 32), 10)
    assert chain_of(cnn) is None and chain_of(build_model("mlp", (1, 28, 28), 10))
    cfg = from_mapping({"model": "cnn", "dataset": "cifar10"})
    engine = make_engine("fused", ALGORITHMS.load("fedavg")(cfg), cnn, False)
    assert type(engine).__name__ == "Vmap"
    assert "engine fused falls back to vmap" in capsys.readouterr().err
    mlp = build_model("mlp", (1, 28, 28), 10)
    assert (
        type(make_engine("grouped", ALGORITHMS.load("fedavg")(cfg), mlp, False)).__name__ == "Vmap"
    )
    assert "declares no usable grouped_layers(); engine grouped" in capsys.readouterr().err


def test_lenet_is_fedreps_cifar_cnn_and_its_head_is_the_last_layer():
    """The authors' CNNCifar: conv 3->64, 64->64 (5x5), fc 1600->120->64->10; 307,842
    parameters, FedRep's head (fc3) the last Linear."""
    from perfed_ray.algorithms.fedrep import head_keys

    params = params_of(build_model("lenet", (3, 32, 32), 10))
    shapes = [tuple(v.shape) for v in params.values()]
    assert shapes[::2] == [(64, 3, 5, 5), (64, 64, 5, 5), (120, 1600), (64, 120), (10, 64)]
    assert sum(v.numel() for v in params.values()) == 307_842
    assert head_keys(params) == list(params)[-2:]
    assert build_model("lenet", (3, 32, 32), 10)(torch.zeros(2, 3 * 32 * 32)).shape == (2, 10)


EPOCH_METHODS = [
    ("fedavg", {}),
    ("local", {}),
    ("ditto", {"sgd.momentum": 0.5}),
    ("fedprox", {"fedprox.mu": 0.5}),
    ("apfl", {}),
    ("pfedme", {"pfedme.steps": 2}),
    (
        "fedrep",
        {"local_epochs": 3, "fedrep": {"head_epochs": 2, "body_epochs": 1}, "sgd.momentum": 0.5},
    ),
]


@pytest.mark.parametrize("engine", ["vmap", "fused"])
@pytest.mark.parametrize(("name", "values"), EPOCH_METHODS)
def test_users_with_different_numbers_of_steps_match_sequential(name, values, engine):
    """local_epochs: users of different sizes take different numbers of steps; the
    batched engines mask the steps a user does not take and equal the sequential
    engine, which runs each user's own steps alone."""
    x, y = _work(users=4, tau=6)
    x, y = x[:, :, :1], y[:, :, :1]
    steps = torch.tensor([2, 6, 5, 3])
    values = {"local_epochs": 2, **values}
    got = _run(name, values, engine, x, y, steps=steps)
    _assert_close(got, _expected(name, values, x, y, steps=steps))
    alone = _expected(name, values, x[:1, :2], y[:1, :2], steps=steps[:1])
    torch.testing.assert_close(got[1][:1], alone[1])  # not the padding


SMALL = (3, 16, 16)  # LeNet's smallest images


CNN_METHODS = [*METHODS, ("fedavg", {"sgd.weight_decay": 0.01, "sgd.decay_biases": False})]


def _masks(model: str, x: torch.Tensor):
    """Keyed dropout masks for a round of x's users (None for a model without dropout)."""
    found = sites(build_model(model, SMALL, 10), x.shape[-1:])
    users, tau, per_step, batch = x.shape[:4]
    return round_masks(0, list(range(users)), (1,), [tau] * users, (per_step, batch), found)


@pytest.mark.parametrize("model", ["simple_cnn", "cnn", "lenet"])
@pytest.mark.parametrize(("name", "values"), CNN_METHODS)
def test_the_sequential_engines_plain_autograd_is_torch_funcs_maths(model, name, values):
    """The sequential engine's one user's step by ordinary autograd, its SGD step
    written over the fresh gradient, gives torch.func's numbers (the reference: the
    ops with `autograd` off), every method that runs on the CNNs, simple_cnn's dropout
    masks applied; images in one layout (NCHW: torch.func's wrappers keep it)."""
    x, y = _work(users=2, tau=2, shape=SMALL, batch=4)
    values = {"model": model, **values}
    nchw = {"shape": SMALL, "masks": _masks(model, x), "layout": torch.contiguous_format}
    got = _run(name, values, "sequential", x, y, **nchw)
    _assert_close(got, _run(name, values, "sequential", x, y, autograd=False, **nchw))


@pytest.mark.parametrize("model", ["simple_cnn", "cnn", "lenet"])
@pytest.mark.parametrize(("name", "values"), CNN_METHODS)
def test_channels_last_images_give_nchws_numbers(model, name, values):
    """On a CPU the CNNs lay their images out channels-last (`cpu_layout`), which
    oneDNN's convolutions run faster; every method's round equals NCHW's to rounding,
    simple_cnn's dropout masks applied."""
    x, y = _work(users=2, tau=2, shape=SMALL, batch=4)
    values = {"model": model, **values}
    work = {"shape": SMALL, "masks": _masks(model, x)}
    got = _run(name, values, "sequential", x, y, **work)
    _assert_close(
        got, _run(name, values, "sequential", x, y, layout=torch.contiguous_format, **work)
    )


def test_plain_autograd_serves_plain_tensors_and_torch_func_its_transforms():
    """grad and grad_and_loss give torch.func's numbers eagerly, under vmap and inside
    the jvp of a Hessian-vector product, and leave the server's parameters as they were."""
    net = build_model("cnn", SMALL, 10, seed=0).to(torch.float64)
    params = params_of(net)
    before = {k: v.clone() for k, v in params.items()}
    x, y = _work(users=3, tau=1, shape=SMALL, batch=4)
    batch = (x[0, 0, 0], y[0, 0, 0])
    fast, reference = FunctionalOps(net), FunctionalOps(net, autograd=False)
    assert plain(params, batch)
    g, loss = fast.grad_and_loss(params, batch)
    g_ref, loss_ref = reference.grad_and_loss(params, batch)
    torch.testing.assert_close(loss, loss_ref)
    assert not loss.requires_grad and not any(v.requires_grad for v in g.values())
    for k in g_ref:
        torch.testing.assert_close(g[k], g_ref[k])
    v = {k: torch.ones_like(p) for k, p in params.items()}
    hv, hv_ref = fast.hvp(params, batch, v), reference.hvp(params, batch, v)
    for k in hv_ref:
        torch.testing.assert_close(hv[k], hv_ref[k])
    per_user = torch.func.vmap(fast.grad, in_dims=(None, 0))(params, (x[:, 0, 0], y[:, 0, 0]))
    torch.testing.assert_close(per_user["head.2.bias"][0], g_ref["head.2.bias"])
    for k in params:
        assert torch.equal(params[k], before[k])


def test_functional_calls_look_for_tied_weights_only_in_a_model_that_has_them():
    """A layer used twice takes the one tensor it is given in both places; a model with
    no tie skips the search (`tie_weights=False`), with the same logits."""
    layer = torch.nn.Linear(4, 4, bias=False)
    tied = FunctionalOps(torch.nn.Sequential(layer, torch.nn.ReLU(), layer))
    assert tied.tied and not FunctionalOps(build_model("cnn", SMALL, 10)).tied
    x, w = torch.randn(3, 4), 2 * torch.eye(4)
    torch.testing.assert_close(tied.logits({"0.weight": w}, x), torch.relu(x @ w.T) @ w.T)
