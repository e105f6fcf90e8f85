"""Run configuration: one flat, validated record of every choice a run makes.

The defaults are the paper's (Fallah et al. 2020, Section 5) and
`PROTOCOL.md`'s. Every field is stored with every result row, so the
schema here is also the column contract of the Parquet tables.
Validation happens before anything expensive starts (data loading, Ray), and
each problem is reported as a :class:`ConfigError` naming the key and what is
allowed, so the CLI can exit with status 2 and one clear line.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from perfed_ray import yamlfile
from perfed_ray.errors import ConfigError, did_you_mean
from perfed_ray.registry import REGISTRIES, SECTIONED, is_dotted
from perfed_ray.settings import KINDS, Setting

DATA_TRANSPORTS = ("object_store", "data_root")
ADAPT_ON = ("train", "test")
INPUT_SCALES = ("unit", "standardize", "standardize-pixel", "imagenet", "raw")
AUGMENTATIONS = ("none", "crop-flip")
HF_DELTAS = ("fixed", "normalized")
AGGREGATIONS = ("mean", "samples")
TRAINED_USERS = ("sampled", "all")
SAMPLINGS = ("uniform", "samples")
MAX_USERS = 10**8  # the driver holds arrays of every user's id: 10^8 is about a GB
MAX_BATCH = 10**6  # samples of one batch, a memory bound on the actors, not a data bound


def _opt(default: Any, help: str, **facts: Any) -> Any:
    """A core configuration field, declared by a :class:`Setting` (whose type is the
    field's annotation)."""
    return field(default=default, metadata={"setting": Setting(default, help, **facts)})


@dataclass(frozen=True)
class RunConfig:
    """Every configuration value of one run (flat, so it maps to YAML and to columns)."""

    dataset: str = _opt(
        "mnist",
        "data set (synthetic: FedProx's Synthetic(alpha, beta); leaf: users' own files "
        "in data_folder)",
        registry=True,
    )
    data_root: str | None = _opt(
        None,
        "folder holding the data sets; `auto` means $PERFED_DATA, else ~/.cache/perfed-ray/data",
        auto=True,
    )
    data_folder: str = _opt(
        "",
        "folder of the users' own files for dataset leaf (LEAF's train/ and test/ of "
        ".json, or one .npz per user), absolute or relative to data_root",
    )
    download: bool = _opt(True, "download the data set through torchvision when it is missing")
    data_transport: str = _opt(
        "object_store",
        "how actors get the data: one read-only copy in Ray's object "
        "store, or each actor reads the data root itself",
        choices=DATA_TRANSPORTS,
    )
    partition: str = _opt(
        "paper",
        "how the data are split among users (`natural`: the data set's own users, for "
        "synthetic and leaf)",
        registry=True,
    )
    paper_a: int | None = _opt(
        None,
        "`a` of the paper split (images per class unit); auto: 196 for MNIST, "
        "68 for CIFAR-10, 40 for gaussian",
        low=1,
        auto=True,
    )
    input_scale: str = _opt(
        "unit",
        "how pixels become inputs: unit [0, 1] (docs/PROTOCOL.md), standardize (per-channel "
        "mean and standard deviation of the whole training set, the same for every user), "
        "standardize-pixel (the same per pixel), imagenet (RGB standardised by ImageNet's "
        "channel means and deviations, as FedRep's CIFAR code does), raw (0-255)",
        choices=INPUT_SCALES,
    )
    augment: str = _opt(
        "none",
        "training-time augmentation of image batches: none, or crop-flip (a random crop "
        "of the image's size from it padded by 4 black pixels, then a random left-right "
        "flip, as FedRep's and LG-FedAvg's CIFAR code do); test images are never augmented",
        choices=AUGMENTATIONS,
    )
    synthetic_alpha: float = _opt(
        1.0, "alpha of Synthetic(alpha, beta): how much users' models differ", low=0
    )
    synthetic_beta: float = _opt(
        1.0, "beta of Synthetic(alpha, beta): how much users' inputs differ", low=0
    )
    dirichlet_alpha: float = _opt(
        0.5, "concentration of the `dirichlet` partition", low=0, low_open=True
    )
    labels_per_user: int = _opt(
        2, "classes per user of the `labels` partition, shards per user of `shards`", low=1
    )
    n_users: int = _opt(
        50,
        "number of users n (the driver keeps a few numbers per user, so at most 10^8)",
        low=1,
        high=MAX_USERS,
    )
    fraction: float = _opt(
        0.2, "fraction r of users sampled per round", low=0, high=1, low_open=True
    )
    tau: int = _opt(10, "local steps per round (unless local_epochs)", low=1)
    local_epochs: int | None = _opt(
        None,
        "local work in epochs instead of tau steps: each user passes over its own training "
        "shard this many times in batches of batch_size, so users of different sizes take "
        "different numbers of steps; off: tau steps",
        low=1,
        auto=True,
        word="off",
    )
    rounds: int = _opt(1000, "communication rounds K", low=1)
    alpha: float = _opt(0.01, "step size of the inner (adaptation) step", low=0)
    beta: float = _opt(0.001, "local (outer) step size", low=0, low_open=True)
    batch_size: int = _opt(
        40,
        "size of each batch D, D', D'' (a small user's batch is filled up to it from "
        "its own samples, so at most 10^6)",
        low=1,
        high=MAX_BATCH,
    )
    delta: float = _opt(0.001, "finite-difference step of Per-FedAvg (HF)", low=0, low_open=True)
    hf_delta: str = _opt(
        "fixed",
        "Per-FedAvg (HF)'s difference step: fixed (`delta`) or normalized "
        "(`delta / ‖g‖`: the perturbation of w has length `delta`)",
        choices=HF_DELTAS,
    )
    algorithm: str = _opt(
        "perfedavg-hf",
        "federated algorithm (see perfed_ray/algorithms; a user's own as package.module:Class)",
        registry=True,
    )
    model: str = _opt(
        "mlp",
        "model: the paper's MLP (80, 60, ELU), a small CNN, FedRep's authors' CIFAR CNN "
        "(lenet), pfl-research's CIFAR-10 CNN with dropout (simple_cnn) or multinomial "
        "logistic regression (logreg)",
        registry=True,
    )
    seed: int = _opt(0, "seed of everything random in the run", low=0)
    eval_every: int = _opt(20, "evaluate users every this many rounds (and at the end)", low=1)
    eval_from: int = _opt(
        0,
        "intermediate evaluations start at this round (round 0 and the end are always "
        "scored): a long run read at its last rounds only, as FedRep's authors average "
        "their last 10",
        low=0,
    )
    eval_users: float | None = _opt(
        None,
        "users scored at the intermediate evaluations: all, a number of users (an integer "
        ">= 1), or a fraction of them (below 1), drawn afresh from each evaluation's own "
        "stream; the final evaluation scores everyone unless sample_final_eval",
        low=0,
        low_open=True,
        auto=True,
        word="all",
    )
    shard_cache_mb: float | None = _opt(
        512.0,
        "megabytes of users' shards an actor keeps made (most recently used first); "
        "others are made again from their indices or seed when next needed. all: keep "
        "every shard once made. Results do not depend on it",
        low=0,
        low_open=True,
        auto=True,
        word="all",
    )
    sample_final_eval: bool = _opt(False, "the final evaluation, too, scores only eval_users users")
    final_eval_draws: int = _opt(
        10, "independent adaptation batches drawn at the final evaluation", low=1
    )
    personalise_steps: int = _opt(
        1,
        "personalisation steps at evaluation: scores after 0, 1, ..., k steps (acc_steps, "
        "loss_steps); acc_after is after k (docs/PROTOCOL.md: 1)",
        low=1,
    )
    unseen_users: float = _opt(
        0.0,
        "share of users (drawn from the seed) never sampled for training and evaluated "
        "like the others, marked `unseen` in evals: the paper's new users",
        low=0,
        high=0.9,
    )
    validation: float = _opt(
        0.0,
        "share of each user's training samples (drawn from the seed) held out from "
        "training and scored instead of its test shard: step sizes chosen on it (`perfed-ray "
        "sweep`'s search) never see test data; 0 scores the test shard",
        low=0,
        high=0.5,
    )
    adapt_on: str = _opt(
        "train",
        "shard the evaluation's adaptation batch comes from (`test` leaks "
        "labels: the paper's FedAvg baseline text; report it separately)",
        choices=ADAPT_ON,
    )
    users_per_actor: int | None = _opt(
        None,
        "users hosted by each Ray actor; auto: one actor per user while the cluster "
        "runs every user's actor at once, else as many actors as it runs at once, users "
        "spread evenly over them",
        low=1,
        auto=True,
    )
    engine: str | None = _opt(
        None,
        "how an actor runs its users' local work: sequential (one after another), "
        "vmap (torch.func.vmap, any model), fused (stacked parameters and batched matrix "
        "products, for models that declare fused_layers()), grouped (users as groups of "
        "grouped convolutions, for models that declare grouped_layers()); auto: fused "
        "where the model allows, else the fastest measured on the actors' device (cached "
        "in ~/.cache/perfed-ray/engines.json, or $PERFED_ENGINE_CACHE)",
        registry=True,
        auto=True,
    )
    balance_rounds: bool | None = _opt(
        None,
        "spread each round's users evenly (by their local steps) over the actors, "
        "moving as few from their hosts as that takes (a per-user state goes with its "
        "user and back), so no actor waits for a busier one; auto: on with two or more "
        "actors",
        auto=True,
    )
    compile: bool | None = _opt(
        None,
        "torch.compile the fused engine's local step (about 10-20 s per actor the "
        "first time, kernels cached for the next runs); auto: on when each actor has more "
        "than 200,000 user-steps to run",
        auto=True,
    )
    trained_users: str = _opt(
        "sampled",
        "who trains in a round: the sampled users (Algorithm 1), or every user while only "
        "the sampled ones are aggregated (pFedMe's and local training's authors' code)",
        choices=TRAINED_USERS,
    )
    sampling: str = _opt(
        "uniform",
        "how a round's users are drawn: uniformly, or in proportion to their training "
        "samples (Ditto's and FedProx's authors' code); without replacement either way",
        choices=SAMPLINGS,
    )
    client_optimizer: str = _opt(
        "sgd",
        "the optimiser of the local steps of methods that use one (its settings in its "
        "own section, e.g. sgd: {momentum: 0.5}); Per-FedAvg's steps are the paper's SGD",
        registry=True,
    )
    server_optimizer: str = _opt(
        "mean",
        "how the server moves its model towards the users' aggregate: mean (Algorithm 1: "
        "the aggregate itself), or an optimiser on the pseudo-gradient (FedAvgM, FedAdam ...)",
        registry=True,
    )
    strategy: str = _opt(
        "uniform",
        "the server's policy: which users a round samples and which are "
        "evaluated (uniform: Algorithm 1's, without replacement)",
        registry=True,
    )
    aggregation: str = _opt(
        "mean",
        "how users' models are combined: their plain mean (Algorithm 1) or their "
        "mean weighted by training samples",
        choices=AGGREGATIONS,
    )
    num_cpus_per_actor: float | None = _opt(
        None,
        "CPUs each actor asks Ray for; auto: the cluster's CPUs shared among the actors, at most 1",
        low=0,
        low_open=True,
        auto=True,
    )
    num_gpus_per_actor: float | None = _opt(
        None,
        "GPUs each actor asks Ray for (fractions allowed); auto: the cluster's GPUs "
        "shared among the actors, at most 1, or 0 without GPUs (at most 4 actors a GPU)",
        low=0,
        auto=True,
    )
    checkpoint_every: int = _opt(
        20,
        "write a checkpoint (global model, round, result file counts) every this many "
        "rounds and at the end; `--resume` continues from the last one",
        low=1,
    )
    actor_retries: int = _opt(
        3,
        "times one actor may die in one round (and be replaced, its users' work re-run; "
        "with per-user state, every actor rolled back to the last checkpoint) before the "
        "run stops",
        low=0,
    )
    dropout: float = _opt(
        0.0,
        "chance that a sampled user drops out of a round (does not report); simulates "
        "partial participation, recorded in `events`",
        low=0,
        high=1,
    )
    stragglers: float = _opt(
        0.0,
        "chance that a sampled user that did not drop out reports after the round's "
        "deadline and is cut; recorded in `events`",
        low=0,
        high=1,
    )
    tag: str = _opt("", "free-form label stored with the results")
    settings: tuple[tuple[str, Any], ...] = ()  # components' settings: (dotted key, value)

    @property
    def unseen_count(self) -> int:
        """How many users are never trained (`unseen_users`)."""
        return round(self.unseen_users * self.n_users)

    @property
    def users_per_evaluation(self) -> int:
        """How many users an intermediate evaluation scores (`eval_users`)."""
        if self.eval_users is None:
            return self.n_users
        if self.eval_users >= 1:
            return int(self.eval_users)
        return max(1, round(self.eval_users * self.n_users))

    @property
    def steps_vary(self) -> bool:
        """Whether a round's users take their own numbers of local steps: with
        `local_epochs` each passes over its own shard, with `tau` all take tau. Where
        they vary, engines are handed each user's count and mask the steps past it."""
        return self.local_epochs is not None

    @property
    def users_per_round(self) -> int:
        """m = round(r n), the number of users sampled each round (r n >= 1 is checked)."""
        return round(self.fraction * self.n_users)

    def section(self, name: str) -> dict[str, Any]:
        """The settings of the component whose section is `name` (its defaults where
        the configuration left them), e.g. ``cfg.section("fedrep")["head_epochs"]``."""
        prefix = name + "."
        return {k[len(prefix) :]: v for k, v in self.settings if k.startswith(prefix)}

    def settings_of(self, key: str) -> dict[str, Any]:
        """The settings of the component that core key `key` names (``algorithm``)."""
        return self.section(section_name(getattr(self, key)))

    def to_dict(self) -> dict[str, Any]:
        """Every value as a flat mapping: core keys, then components' settings under
        dotted keys (``fedrep.head_epochs``), as YAML and the Parquet columns have them."""
        core = {name: getattr(self, name) for name in FIELDS}
        return core | dict(self.settings)

    def replace(self, **changes: Any) -> RunConfig:
        return from_mapping({**self.to_dict(), **changes})


def _core(f: dataclasses.Field) -> Setting:
    """A core field's Setting, typed by the field's annotation (`int | None` -> int)."""
    kind = KINDS[str(f.type).split("|")[0].strip()]
    return dataclasses.replace(f.metadata["setting"], kind=kind)


FIELDS: dict[str, dataclasses.Field] = {
    f.name: f for f in dataclasses.fields(RunConfig) if "setting" in f.metadata
}
CORE: dict[str, Setting] = {name: _core(f) for name, f in FIELDS.items()}


def section_name(value: str) -> str:
    """The section of the component a configuration names: its registered name, or for
    a dotted path ``pkg.mod:Reptile`` the class name in lower case (``reptile``)."""
    return value.rpartition(":")[2].lower() if is_dotted(value) else value


def declared(registry_key: str, name: str) -> dict[str, Setting]:
    """The settings a component declares (none for most)."""
    return dict(getattr(REGISTRIES[registry_key].load(name), "settings", None) or {})


def _registered_sections() -> dict[str, tuple[str, str]]:
    """section -> (registry key, name) for every registered component that has
    settings: where a section or a legacy key given in a file is looked up."""
    out = {}
    for key in SECTIONED:
        for name in REGISTRIES[key].names():
            if declared(key, name):
                out[section_name(name)] = (key, name)
    return out


def spec(key: str, sections: Mapping[str, tuple[str, str]] | None = None) -> Setting:
    """The Setting of a core key or of a dotted component key; KeyError if none."""
    if key in CORE:
        return CORE[key]
    section, _, name = key.partition(".")
    registry_key, component = (sections or _registered_sections())[section]
    return declared(registry_key, component)[name]


def component_settings(cfg: RunConfig) -> dict[str, Setting]:
    """The settings declared by the components `cfg` names (its algorithm and
    optimisers, a user's own included), by dotted key (``fedrep.body_steps``)."""
    return {
        f"{section_name(getattr(cfg, key))}.{name}": s
        for key in SECTIONED
        for name, s in declared(key, getattr(cfg, key)).items()
    }


def _legacy(sections: Mapping[str, tuple[str, str]]) -> dict[str, str]:
    return {
        s.legacy: f"{section}.{name}"
        for section, (key, component) in sections.items()
        for name, s in declared(key, component).items()
        if s.legacy
    }


def registered_settings() -> dict[str, tuple[str, str, Setting]]:
    """Every built-in or installed component's settings: dotted key -> (the registry key
    that picks the component, its name, the Setting)."""
    return {
        f"{section}.{name}": (key, component, s)
        for section, (key, component) in _registered_sections().items()
        for name, s in declared(key, component).items()
    }


def legacy_keys() -> dict[str, str]:
    """The flat keys older versions used for components' settings -> their dotted keys."""
    return _legacy(_registered_sections())


def base_type(key: str) -> type:
    """The type of a key's values (core or a component's)."""
    return spec(key).type


def flatten(values: Mapping[str, Any]) -> dict[str, Any]:
    """Sections given as nested mappings (``fedrep: {head_epochs: 10}``) as dotted keys;
    a core key's value is never a mapping."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        key = str(key)
        if isinstance(value, Mapping) and key not in CORE:
            flat.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            flat[key] = value
    return flat


def _unknown(key: str, known: Iterable[str]) -> ConfigError:
    return ConfigError(
        f"unknown configuration key {key!r}{did_you_mean(key, known)}; see `perfed-ray keys` "
        f"for the allowed keys"
    )


def from_mapping(values: Mapping[str, Any]) -> RunConfig:
    """Build a validated config from a mapping (a YAML file, overrides): core keys, and
    components' settings as sections or dotted keys. The settings of the components the
    run uses are kept, with their defaults filled in; a section of another registered
    component is checked and dropped (a sweep's base file may serve several methods)."""
    flat = flatten(values)
    core = {k: v for k, v in flat.items() if k in CORE}
    cfg = RunConfig(**{k: CORE[k].coerce(k, v) for k, v in core.items()})
    rest = {k: v for k, v in flat.items() if k not in CORE}
    sections = _registered_sections() if rest else {}
    chosen = {section_name(getattr(cfg, key)): (key, getattr(cfg, key)) for key in SECTIONED}
    sections |= chosen
    legacy = _legacy(sections)
    given: dict[str, Any] = {}
    for key, value in rest.items():
        key = legacy.get(key, key)
        section, dot, name = key.partition(".")
        if not dot or section not in sections:
            dotted = [f"{s}.{n}" for s, (k, c) in sections.items() for n in declared(k, c)]
            raise _unknown(key, [*CORE, *dotted])
        owner = declared(*sections[section])
        if name not in owner:
            raise _unknown(key, [f"{section}.{n}" for n in owner])
        given[key] = owner[name].coerce(key, value)
    settings = {k: given.get(k, s.default) for k, s in component_settings(cfg).items()}
    cfg = dataclasses.replace(cfg, settings=tuple(sorted(settings.items())))
    _check_combination(cfg)
    return cfg


def _check_combination(cfg: RunConfig) -> None:
    """Rules that involve more than one key."""
    if cfg.partition in ("paper", "paper-diff") and cfg.n_users < 2:
        raise ConfigError(
            f"n_users = {cfg.n_users} is too small for partition "
            f"{cfg.partition!r}: it needs at least 2 users (two groups)"
        )
    spec = REGISTRIES["dataset"].load(cfg.dataset)
    generated = spec.load is None
    if (generated or spec.folder) != (cfg.partition == "natural"):
        raise ConfigError(
            f"partition = {cfg.partition!r} does not fit dataset = "
            f"{cfg.dataset!r}: generated data sets (synthetic, synthetic-iid) and users' "
            f"own files (leaf) bring their own users and need partition: natural; the "
            f"other data sets need paper, paper-diff, iid, dirichlet or labels"
        )
    if spec.folder and not cfg.data_folder:
        raise ConfigError(
            f"dataset {cfg.dataset} reads the users' own files: set data_folder to their "
            f"folder (absolute, or relative to data_root)"
        )
    if (generated or spec.folder) and cfg.input_scale != "unit":
        raise ConfigError(
            f"input_scale = {cfg.input_scale!r} applies to image pixels; dataset "
            f"{cfg.dataset} has real-valued features: use input_scale: unit"
        )
    if cfg.augment != "none" and (generated or spec.folder):
        raise ConfigError(
            f"augment = {cfg.augment!r} applies to images; dataset {cfg.dataset} has "
            f"real-valued features: use augment: none"
        )
    if cfg.augment != "none" and cfg.input_scale == "standardize-pixel":
        raise ConfigError(
            f"augment = {cfg.augment!r} pads images with black pixels, which "
            f"input_scale = standardize-pixel gives no one value: use unit or standardize"
        )
    if generated and getattr(REGISTRIES["model"].load(cfg.model), "images", False):
        raise ConfigError(
            f"model = {cfg.model} needs images; dataset {cfg.dataset} has 60 plain "
            f"features: use model: mlp or logreg"
        )
    method = REGISTRIES["algorithm"].load(cfg.algorithm)
    method.validate(cfg)
    if cfg.local_epochs is not None and not method.epochs:
        raise ConfigError(
            f"local_epochs = {cfg.local_epochs} does not apply to algorithm = "
            f"{cfg.algorithm!r}: it runs tau local steps of fresh batches, as its paper does; "
            f"drop local_epochs and set tau"
        )
    if cfg.fraction * cfg.n_users < 1:
        raise ConfigError(
            f"fraction * n_users = {cfg.fraction} * {cfg.n_users} = "
            f"{cfg.fraction * cfg.n_users:g} samples no user per round: raise "
            f"fraction to at least {1 / cfg.n_users:g} or n_users"
        )
    if cfg.users_per_actor is not None and cfg.users_per_actor > cfg.n_users:
        raise ConfigError(
            f"users_per_actor = {cfg.users_per_actor} is larger than "
            f"n_users = {cfg.n_users}: use at most n_users"
        )
    if cfg.users_per_round > cfg.n_users - cfg.unseen_count:
        raise ConfigError(
            f"unseen_users = {cfg.unseen_users:g} leaves {cfg.n_users - cfg.unseen_count} "
            f"users to train, fewer than the {cfg.users_per_round} a round samples: lower "
            f"unseen_users or fraction"
        )
    sampled = cfg.eval_users
    if sampled is not None and sampled >= 1 and (sampled != int(sampled) or sampled > cfg.n_users):
        raise ConfigError(
            f"eval_users = {sampled:g} is not allowed: all, a whole number of users up to "
            f"n_users = {cfg.n_users}, or a fraction below 1"
        )


def parse_overrides(pairs: Iterable[str]) -> dict[str, Any]:
    """Parse `--set key=value` pairs; values are read as YAML scalars."""
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {pair!r} is not of the form key=value")
        try:
            out[key.strip()] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip()] = raw
    return out


def load(path: str | Path | None, overrides: Iterable[str] = ()) -> RunConfig:
    """Read a YAML file (or nothing: all defaults) and apply `--set` overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        path = Path(path)
        loaded = yamlfile.read(path, "configuration file")
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(
                f"configuration file {str(path)!r} must be a mapping of key: value lines "
                f"(a component's settings in a section: fedrep: {{head_epochs: 10}})"
            )
        values.update(loaded)
    values.update(parse_overrides(overrides))
    return from_mapping(values)


def reference() -> list[tuple[str, str, str, str]]:
    """(key, default, allowed, meaning) for every key: the core keys, then every
    registered component's own settings under its section (``fedrep.head_epochs``): the
    README's table and `keys`."""
    rows = [(k, s.shown_default(), s.describe(k), s.help) for k, s in CORE.items()]
    for section, (key, name) in _registered_sections().items():
        for setting, s in declared(key, name).items():
            dotted = f"{section}.{setting}"
            rows.append((dotted, s.shown_default(), s.describe(dotted), f"{key} {name}: {s.help}"))
    return rows


def reference_text(markdown: bool = False) -> str:
    """The configuration reference as a Markdown table (the README's) or plain text."""
    if markdown:
        lines = ["| key | default | allowed | meaning |", "| --- | --- | --- | --- |"]
        lines += [f"| `{k}` | `{d}` | {a} | {m} |" for k, d, a, m in reference()]
    else:
        lines = [f"{k:20} default {d:14} {a}\n{'':20} {m}" for k, d, a, m in reference()]
    return "\n".join(lines)
