"""Federated learning rules as pure functions (torch.func): no Ray, no I/O."""

from perfed_ray.algorithms.rules import (
    RULES,
    Batch,
    LossFn,
    Params,
    Rule,
    StepSizes,
    adapt,
    hessian_vector_product,
    local_update,
    local_update_many,
)

__all__ = ["RULES", "Batch", "LossFn", "Params", "Rule", "StepSizes", "adapt",
           "hessian_vector_product", "local_update", "local_update_many"]
