"""perfed-ray: a Ray simulator for personalised federated learning (Per-FedAvg, FedAvg)."""

__version__ = "0.1.0"
