"""One registry per concept: algorithms, models, data sets, partitioners, engines, strategies,
client and server optimisers, privacy mechanisms, users' devices and availability,
trackers.

A configuration names a component by a registered name (``perfedavg-hf``), by a
dotted path to a user's own (``mypkg.methods:Reptile``), or by a name another
installed package registers under the concept's entry-point group
(``[project.entry-points."perfed_ray.algorithms"] reptile = "mypkg.methods:Reptile"``).
Built-in entries are stored as ``module:attribute`` strings and imported only when
used, so validating a configuration lists and checks names without importing torch;
configuration validation, ``perfed-ray keys`` and the docs all read these registries,
and nothing else lists the names.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import re
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from perfed_ray.errors import ConfigError, did_you_mean

_DOTTED = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_dotted(name: str) -> bool:
    """``package.module:Attribute``: a user's component, not a registered name."""
    return bool(_DOTTED.match(name))


_FOUND: dict[tuple, dict[str, dict[str, str]]] = {}  # where packages are -> group -> names


def _where_packages_are() -> tuple:
    """The import path and each folder's modification time: installing or removing a
    package adds or removes a ``*.dist-info`` folder in one of them, which changes it."""
    times = []
    for entry in sys.path:
        try:
            times.append(os.stat(entry or ".").st_mtime_ns)
        except OSError:
            times.append(None)
    return tuple(sys.path), tuple(times)


def entry_points(group: str) -> dict[str, str]:
    """Installed packages' registrations under `group`, name -> "module:attribute".
    Reading them scans every installed package's metadata (milliseconds, and a
    configuration with method settings asks three registries), so they are kept until
    the import path or a folder on it changes."""
    key = _where_packages_are()
    if key not in _FOUND:
        _FOUND.clear()
        _FOUND[key] = {}
    found = _FOUND[key]
    if group not in found:
        found[group] = {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}
    return found[group]


def import_object(path: str) -> Any:
    """The object a ``module:attribute`` path names; ConfigError with the reason if not.
    The current directory is searched too, as `python -m` would (the `perfed-ray`
    command's own folder is on the path instead)."""
    module_name, _, attribute = path.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(
            f"cannot import {module_name!r} for {path!r} ({err}): is it on "
            f"PYTHONPATH, or installed?"
        ) from None
    except SyntaxError as err:  # the user's module itself is broken: show where
        raise ConfigError(
            f"cannot import {module_name!r} for {path!r}: {err.msg} at "
            f"{err.filename}, line {err.lineno}"
        ) from None
    except Exception as err:  # raised while the module ran: its innermost line
        frame = traceback.extract_tb(err.__traceback__)[-1]
        raise ConfigError(
            f"cannot import {module_name!r} for {path!r}: {type(err).__name__}: {err} at "
            f"{frame.filename}, line {frame.lineno}"
        ) from None
    for part in attribute.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{path!r}: module {module_name!r} has no {attribute!r}") from None
    return obj


@dataclass
class Registry:
    """Components of one concept by name; `group` is the entry-point group that other
    packages register theirs under; `base`, the class a user's component must subclass
    (or be an instance of, for `instance`), checked when a configuration names it;
    `guide`, the docs page that says how to write one, which that check's error names."""

    concept: str
    key: str  # the configuration key that names one
    builtins: Mapping[str, str]  # name -> "module:attribute"
    group: str = ""
    base: str = ""  # "module:Class"
    instance: bool = False
    guide: str = ""  # a path in the repository: docs/guide/....md
    # The section every component of the concept keeps its settings in, where they
    # share one (`privacy.epsilon` whichever mechanism `privacy` names); by default
    # each component's own (`fedrep.head_epochs`).
    section: str = ""
    _loaded: dict[str, Any] = field(default_factory=dict, repr=False)

    def _entry_points(self) -> dict[str, str]:
        if not self.group:
            return {}
        return entry_points(self.group)

    def names(self) -> list[str]:
        """Every registered name: built-in ones first, then installed packages'."""
        return [*self.builtins, *(n for n in self._entry_points() if n not in self.builtins)]

    def path(self, name: str) -> str:
        """The ``module:attribute`` a name stands for; ConfigError naming the choices."""
        if is_dotted(name):
            return name
        paths = {**self._entry_points(), **self.builtins}
        if name not in paths:
            raise ConfigError(
                f"{self.key} = {name!r} is not allowed{did_you_mean(name, paths)}: one of "
                f"{', '.join(self.names())}, or a dotted path "
                f"package.module:Name to your own {self.concept}"
            )
        return paths[name]

    def check(self, name: str) -> None:
        """Raise ConfigError unless `name` is registered or a dotted path that imports
        to a component of the right kind; built-in names are trusted without importing
        them."""
        if name in self.builtins:
            return
        obj = self.load(name)
        if not self.base:
            return
        base = import_object(self.base)
        fits = (
            isinstance(obj, base)
            if self.instance
            else isinstance(obj, type) and issubclass(obj, base)
        )
        if not fits:
            kind = "an instance" if self.instance else "a subclass"
            see = f": see {self.guide}" if self.guide else ""
            raise ConfigError(
                f"{self.key} = {name!r} names {obj!r}, which is not {kind} of "
                f"{self.base.replace(':', '.')}{see}"
            )

    def load(self, name: str) -> Any:
        """The component itself (imported on first use)."""
        if name not in self._loaded:
            self._loaded[name] = import_object(self.path(name))
        return self._loaded[name]

    def provide(self, name: str, obj: Any) -> None:
        """Answer `name` with an object resolved elsewhere (the driver's, in an actor)."""
        self._loaded[name] = obj

    def describe(self) -> str:
        return f"one of {', '.join(self.names())}, or package.module:Name"


ALGORITHMS = Registry(
    "algorithm",
    "algorithm",
    {
        "fedavg": "perfed_ray.algorithms.fedavg:FedAvg",
        "perfedavg": "perfed_ray.algorithms.perfedavg:PerFedAvg",
        "perfedavg-fo": "perfed_ray.algorithms.perfedavg:PerFedAvgFO",
        "perfedavg-hf": "perfed_ray.algorithms.perfedavg:PerFedAvgHF",
        "local": "perfed_ray.algorithms.local:Local",
        "ditto": "perfed_ray.algorithms.ditto:Ditto",
        "pfedme": "perfed_ray.algorithms.pfedme:PFedMe",
        "fedrep": "perfed_ray.algorithms.fedrep:FedRep",
        "fedavg-ft": "perfed_ray.algorithms.fedavg_ft:FedAvgFT",
        "fedprox": "perfed_ray.algorithms.fedprox:FedProx",
        "apfl": "perfed_ray.algorithms.apfl:APFL",
    },
    group="perfed_ray.algorithms",
    base="perfed_ray.algorithms.base:Algorithm",
    guide="docs/guide/adding-a-method.md",
)

MODELS = Registry(
    "model",
    "model",
    {
        "mlp": "perfed_ray.models:MLP",
        "cnn": "perfed_ray.models:CNN",
        "logreg": "perfed_ray.models:LogReg",
        "lenet": "perfed_ray.models:LeNet",
        "simple_cnn": "perfed_ray.models:SimpleCNN",
    },
    group="perfed_ray.models",
    base="torch.nn:Module",
    guide="docs/guide/adding-a-model.md",
)

DATASETS = Registry(
    "data set",
    "dataset",
    {
        "mnist": "perfed_ray.data.datasets:MNIST",
        "cifar10": "perfed_ray.data.datasets:CIFAR10",
        "gaussian": "perfed_ray.data.datasets:GAUSSIAN",
        "synthetic": "perfed_ray.data.synthetic:SYNTHETIC",
        "synthetic-iid": "perfed_ray.data.synthetic:SYNTHETIC_IID",
        "leaf": "perfed_ray.data.userfiles:LEAF",
    },
    group="perfed_ray.datasets",
    base="perfed_ray.data.datasets:Dataset",
    instance=True,
)

PARTITIONERS = Registry(
    "partitioner",
    "partition",
    {
        "paper": "perfed_ray.data.partition:paper",
        "paper-diff": "perfed_ray.data.partition:paper_diff",
        "iid": "perfed_ray.data.partition:iid",
        "dirichlet": "perfed_ray.data.partition:dirichlet",
        "labels": "perfed_ray.data.partition:labels",
        "shards": "perfed_ray.data.partition:shards",
        "natural": "perfed_ray.data.partition:natural",
    },
    group="perfed_ray.partitioners",
)

ENGINES = Registry(
    "engine",
    "engine",
    {
        "sequential": "perfed_ray.engines.sequential:Sequential",
        "vmap": "perfed_ray.engines.vmap:Vmap",
        "fused": "perfed_ray.engines.fused:Fused",
        "grouped": "perfed_ray.engines.grouped:Grouped",
    },
    base="perfed_ray.engines.base:Engine",
)

STRATEGIES = Registry(
    "strategy",
    "strategy",
    {
        "uniform": "perfed_ray.strategy:Strategy",
        "fedbuff": "perfed_ray.asynchronous:FedBuff",
        "fedasync": "perfed_ray.asynchronous:FedAsync",
    },
    group="perfed_ray.strategies",
    base="perfed_ray.strategy:Strategy",
    guide="docs/guide/adding-a-strategy.md",
)

CLIENT_OPTIMIZERS = Registry(
    "client optimiser",
    "client_optimizer",
    {
        "sgd": "perfed_ray.optimizers.client:SGD",
        "adam": "perfed_ray.optimizers.client:Adam",
    },
    group="perfed_ray.client_optimizers",
    base="perfed_ray.optimizers.client:ClientOptimizer",
    guide="docs/guide/methods.md",
)

SERVER_OPTIMIZERS = Registry(
    "server optimiser",
    "server_optimizer",
    {
        "mean": "perfed_ray.optimizers.server:Mean",
        "fedavgm": "perfed_ray.optimizers.server:FedAvgM",
        "fedadam": "perfed_ray.optimizers.server:FedAdam",
        "fedyogi": "perfed_ray.optimizers.server:FedYogi",
        "fedadagrad": "perfed_ray.optimizers.server:FedAdagrad",
    },
    group="perfed_ray.server_optimizers",
    base="perfed_ray.optimizers.server:ServerOptimizer",
    guide="docs/guide/adding-a-strategy.md",
)

PRIVACY = Registry(
    "privacy mechanism",
    "privacy",
    {
        "none": "perfed_ray.privacy.mechanisms:NoPrivacy",
        "central": "perfed_ray.privacy.mechanisms:CentralGaussian",
        "local": "perfed_ray.privacy.mechanisms:LocalGaussian",
    },
    group="perfed_ray.privacy",
    base="perfed_ray.privacy.mechanisms:NoPrivacy",
    guide="docs/guide/privacy.md",
    section="privacy",
)

TRACKERS = Registry(
    "tracker",
    "report_to",
    {
        "tensorboard": "perfed_ray.tracking.tensorboard:TensorBoard",
        "mlflow": "perfed_ray.tracking.mlflow:MLflow",
        "wandb": "perfed_ray.tracking.wandb:WandB",
    },
    group="perfed_ray.trackers",
    base="perfed_ray.tracking.base:Tracker",
    guide="docs/guide/tracking.md",
)

DEVICES = Registry(
    "device model",
    "devices",
    {
        "equal": "perfed_ray.population.devices:EqualDevices",
        "lognormal": "perfed_ray.population.devices:LognormalDevices",
        "table": "perfed_ray.population.devices:TableDevices",
    },
    group="perfed_ray.devices",
    base="perfed_ray.population.devices:Devices",
    guide="docs/guide/simulated-time.md",
    section="devices",
)

AVAILABILITY = Registry(
    "availability model",
    "availability",
    {
        "always": "perfed_ray.population.availability:Availability",
        "diurnal": "perfed_ray.population.availability:Diurnal",
        "table": "perfed_ray.population.availability:TableAvailability",
    },
    group="perfed_ray.availability",
    base="perfed_ray.population.availability:Availability",
    guide="docs/guide/simulated-time.md",
    section="availability",
)

REGISTRIES = {
    r.key: r
    for r in (
        ALGORITHMS,
        MODELS,
        DATASETS,
        PARTITIONERS,
        ENGINES,
        STRATEGIES,
        CLIENT_OPTIMIZERS,
        SERVER_OPTIMIZERS,
        PRIVACY,
        TRACKERS,
        DEVICES,
        AVAILABILITY,
    )
}
# Configuration keys whose components declare settings, each in a section of its own
# name (`fedrep: {head_epochs: 10}`) or of its registry's (`privacy.epsilon`): see
# perfed_ray.config.settings.
SECTIONED = (
    "algorithm",
    "client_optimizer",
    "server_optimizer",
    "privacy",
    "devices",
    "availability",
    "strategy",
)
