"""Rules across keys: values each allowed on its own that do not fit together (a
partition for another kind of data set, a model that needs images, more users sampled
than there are).

They read the components the configuration names (its data set, model and
algorithm), which the rules ask about their needs rather than listing them: an
algorithm's own rules are its `validate`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from perfed_ray.errors import ConfigError
from perfed_ray.registry import REGISTRIES

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig


def check(cfg: RunConfig) -> None:
    """Raise ConfigError for values that are each allowed but do not fit together."""
    if cfg.partition in ("paper", "paper-diff") and cfg.n_users < 2:
        raise ConfigError(
            f"n_users = {cfg.n_users} is too small for partition "
            f"{cfg.partition!r}: it needs at least 2 users (two groups)"
        )
    data = REGISTRIES["dataset"].load(cfg.dataset)
    generated = data.load is None
    if (generated or data.folder) != (cfg.partition == "natural"):
        raise ConfigError(
            f"partition = {cfg.partition!r} does not fit dataset = "
            f"{cfg.dataset!r}: generated data sets (synthetic, synthetic-iid) and users' "
            f"own files (leaf) bring their own users and need partition: natural; the "
            f"other data sets need paper, paper-diff, iid, dirichlet or labels"
        )
    if data.folder and not cfg.data_folder:
        raise ConfigError(
            f"dataset {cfg.dataset} reads the users' own files: set data_folder to their "
            f"folder (absolute, or relative to data_root)"
        )
    if (generated or data.folder) and cfg.input_scale != "unit":
        raise ConfigError(
            f"input_scale = {cfg.input_scale!r} applies to image pixels; dataset "
            f"{cfg.dataset} has real-valued features: use input_scale: unit"
        )
    if cfg.augment != "none" and (generated or data.folder):
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
    method.validate(method.HParams.of(cfg))
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
    for tracker in cfg.trackers:
        REGISTRIES["report_to"].load(tracker).check_installed(tracker)
    for key in ("devices", "availability"):  # their tables are read and checked here
        model = REGISTRIES[key].load(getattr(cfg, key))
        model.validate(model.HParams.of(cfg))
    if cfg.privacy != "none":
        mechanism = REGISTRIES["privacy"].load(cfg.privacy)
        mechanism.validate(mechanism.HParams.of(cfg), method.fixed_server)
        strategies = REGISTRIES["strategy"]
        if strategies.load(cfg.strategy).weight is not strategies.load("uniform").weight:
            raise ConfigError(
                f"strategy = {cfg.strategy!r} weighs users by its own weight(), which "
                f"privacy = {cfg.privacy} cannot bound (it assumes each user counts once): "
                f"keep Strategy.weight under privacy"
            )
    REGISTRIES["strategy"].load(cfg.strategy).validate(cfg)
