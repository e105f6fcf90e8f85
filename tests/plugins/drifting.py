"""A plug-in that declares a fixed server but whose server's model moves (FedAvg's): the
run must stop with a clear error rather than train later rounds from a stale model."""

from perfed_ray.algorithms.fedavg import FedAvg


class Drifting(FedAvg):
    fixed_server = True
