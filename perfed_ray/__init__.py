"""perfed-ray: a Ray simulator for personalised federated learning (Per-FedAvg, FedAvg,
and methods of your own). `simulate` runs one simulation from Python."""

__version__ = "0.2.0"

from perfed_ray.api import RunResult, simulate

__all__ = ["RunResult", "__version__", "simulate"]
