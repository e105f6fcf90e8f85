"""Components declare their own settings: sections of the configuration, validated
like the core keys, stored as columns, listed by `perfed-ray keys`, sweepable."""

from __future__ import annotations

import dataclasses

import pytest

from perfed_ray.algorithms import Algorithm
from perfed_ray.config import ConfigError, from_mapping, load, reference, revise
from perfed_ray.optimizers.server import FedAdam
from perfed_ray.registry import ALGORITHMS
from perfed_ray.strategy import Strategy


def test_a_section_a_dotted_key_and_a_set_override_are_the_same_setting(tmp_path):
    nested = from_mapping({"algorithm": "ditto", "ditto": {"lambda": 0.3}})
    dotted = from_mapping({"algorithm": "ditto", "ditto.lambda": 0.3})
    file = tmp_path / "c.yaml"
    file.write_text("algorithm: ditto\nditto:\n  lambda: 0.7\n")
    overridden = load(file, ["ditto.lambda=0.3"])
    assert nested == dotted == overridden
    assert nested.settings_of("algorithm") == {"lambda": 0.3, "personal_start": "global"}
    assert nested.to_dict()["ditto.lambda"] == 0.3
    assert ALGORITHMS.load("ditto")(nested).lam == 0.3


def test_the_chosen_components_settings_are_filled_in_and_others_dropped():
    cfg = from_mapping({"algorithm": "fedavg", "ditto": {"lambda": 0.3}})
    assert "ditto.lambda" not in cfg.to_dict()
    assert cfg.to_dict()["sgd.momentum"] == 0.0  # the client optimiser's own
    pfedme = from_mapping({"algorithm": "pfedme"}).to_dict()
    assert pfedme["pfedme.lambda"] == 15.0 and pfedme["pfedme.steps"] == 5


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"algorithm": "ditto", "ditto.lamda": 1}, "'ditto.lamda' (did you mean 'ditto.lambda'?)"),
        ({"algorithm": "pfedme", "pfedme": {"steps": 0}}, "pfedme.steps = 0 is out of range"),
        ({"algorithm": "ditto", "ditto.lambda": "big"}, "ditto.lambda = 'big' is not allowed"),
        (
            {"algorithm": "fedrep", "fedrep.head_start": "w0"},
            "fedrep.head_start = 'w0' is not allowed: one of global, initial",
        ),
        ({"dito": {"lambda": 1}}, "unknown configuration key 'dito.lambda'"),
        ({"sgd.momentum": 1.5}, "sgd.momentum = 1.5 is out of range: a number in [0, 1]"),
    ],
)
def test_a_bad_setting_is_one_line_naming_it(values, message):
    with pytest.raises(ConfigError) as err:
        from_mapping(values)
    assert message in str(err.value)


def test_older_flat_keys_still_load_as_the_methods_settings():
    cfg = from_mapping({"algorithm": "pfedme", "pfedme_lr": 0.1, "ditto_lambda": 2.0})
    assert cfg.settings_of("algorithm")["personal_lr"] == 0.1
    assert "ditto.lambda" not in cfg.to_dict()  # another method's: checked, then dropped
    assert from_mapping(cfg.to_dict()) == cfg


def test_keys_lists_each_methods_settings_under_its_name():
    rows = {key: meaning for key, _, _, meaning in reference()}
    assert rows["fedrep.body_steps"].startswith("algorithm fedrep: ")
    assert rows["pfedme.personal_lr"].startswith("algorithm pfedme: ")
    assert rows["sgd.momentum"].startswith("client_optimizer sgd: ")
    assert "ditto_lambda" not in rows


def test_committed_results_read_their_flat_method_columns_as_settings():
    from pathlib import Path

    from perfed_ray.analysis import read_runs

    runs = read_runs(Path(__file__).resolve().parents[1] / "experiments/results/comparison")
    pfedme = runs[runs["algorithm"] == "pfedme"]
    assert set(pfedme["pfedme.personal_lr"]) == {0.09, 0.01, 0.1}
    assert runs.loc[runs["algorithm"] == "ditto", "ditto.lambda"].eq(1.0).all()
    assert runs.loc[runs["algorithm"] != "ditto", "ditto.lambda"].isna().all()
    assert "pfedme_lr" not in runs
    # Settings declared after these runs read back as their defaults, for their method only.
    fedrep = runs["algorithm"] == "fedrep"
    assert runs.loc[fedrep, "fedrep.head_start"].eq("global").all()
    assert runs.loc[~fedrep, "fedrep.head_start"].isna().all()
    in_steps = (runs["client_optimizer"] == "sgd") & runs["local_epochs"].isna()
    assert runs.loc[in_steps, "sgd.momentum"].eq(0.0).all()  # the protocol's plain SGD


def test_committed_comparison_cells_count_as_done():
    """The comparison script finds its committed runs (a setting added later must not
    make them look unrun)."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "experiments"))
    from comparison import CONFIGS, METHODS, grid
    from table1 import state

    from perfed_ray.analysis import read_runs

    runs = read_runs(root / "experiments/results/comparison")
    cells = grid(CONFIGS, 3, METHODS, (), {"mnist-tau10"})
    assert [state(cell, runs)[0] for cell in cells] == ["done"] * len(cells)


def test_a_sweep_varies_a_methods_setting_like_any_key(tmp_path):
    import yaml

    from perfed_ray.sweep import spec

    doc = {
        "config": {"dataset": "gaussian", "algorithm": "pfedme", "pfedme": {"steps": 2}},
        "grid": {"pfedme.lambda": [1.0, 5.0], "sgd": {"momentum": [0.0, 0.5]}},
        "sample": {"samples": 2, "uniform": {"pfedme.personal_lr": [0.01, 0.1]}},
    }
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(doc))
    sweep = spec.load(path)
    assert len(sweep.trials) == 8
    assert set(sweep.varied) == {"pfedme.lambda", "sgd.momentum", "pfedme.personal_lr"}
    assert {t.settings_of("algorithm")["steps"] for t in sweep.trials} == {2}
    assert {t.settings_of("algorithm")["lambda"] for t in sweep.trials} == {1.0, 5.0}
    doc["grid"] = {"pfedme.lamda": [1.0]}
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"did you mean 'pfedme\.lambda'"):
        spec.load(path)


def test_an_auto_setting_is_a_column_of_its_declared_type():
    """`apfl.alpha_lr: beta` is stored as None: a null in a float column."""
    import pyarrow as pa

    from perfed_ray.results.writer import config_schema

    cfg = from_mapping({"algorithm": "apfl"})
    assert cfg.to_dict()["apfl.alpha_lr"] is None
    assert from_mapping({"algorithm": "apfl", "apfl.alpha_lr": "beta"}) == cfg
    assert config_schema(cfg).field("apfl.alpha_lr").type == pa.float64()


def test_a_component_receives_its_own_settings_and_the_core_keys_it_names():
    cfg = from_mapping(
        {"algorithm": "fedrep", "tau": 7, "fedrep": {"body_steps": 2}, "sgd": {"momentum": 0.5}}
    )
    fedrep = ALGORITHMS.load("fedrep")
    hparams = fedrep.HParams.of(cfg)
    assert (hparams.tau, hparams.local_epochs, hparams.beta) == (7, None, cfg.beta)
    assert hparams.section == cfg.settings_of("algorithm")
    assert hparams.optimizer.momentum == 0.5  # the client optimiser, made from its section
    method = fedrep(hparams)
    assert method.head_steps == 5 and method.hparams is hparams
    from_run = fedrep(cfg)  # the run's configuration is read for the same record
    assert from_run.hparams == dataclasses.replace(hparams, optimizer=from_run.optimizer)

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Seeded(Algorithm.HParams):  # a user's method that reads one more core key
        seed: int

    assert Seeded.of(revise(cfg, seed=16)).seed == 16
    assert not hasattr(Seeded.of(cfg), "n_users")


def test_the_strategy_and_server_optimiser_receive_their_own_settings():
    cfg = from_mapping(
        {
            "algorithm": "pfedme",
            "n_users": 10,
            "fraction": 0.3,
            "unseen_users": 0.2,
            "eval_users": 0.25,
            "server_optimizer": "fedadam",
            "fedadam": {"lr": 0.05},
        }
    )
    hparams = Strategy.HParams.of(cfg)
    # the counts the run derives, rounded as its checks round them: round(2.5) is 2
    counts = (hparams.users_per_round, hparams.unseen_count, hparams.users_per_evaluation)
    assert counts == (3, 2, 2)
    assert type(hparams.method) is ALGORITHMS.load("pfedme")  # made for it from the run
    optimizer = hparams.optimizer
    assert type(optimizer) is FedAdam
    assert optimizer.hparams.section == cfg.settings_of("server_optimizer")
    assert optimizer.options["lr"] == 0.05 and optimizer.options["beta2"] == 0.99  # default
    assert not hasattr(hparams, "batch_size") and not hasattr(hparams, "tau")
    strategy = Strategy(hparams)
    assert strategy.algorithm is hparams.method and strategy.optimizer is optimizer
    assert strategy.sample(3) == Strategy(cfg).sample(3)  # the run read for the same record

    class Sized(Strategy):  # a user's strategy that reads one more core key
        @dataclasses.dataclass(frozen=True, kw_only=True)
        class HParams(Strategy.HParams):
            batch_size: int

    assert Sized(revise(cfg, batch_size=16)).hparams.batch_size == 16
