"""FedAvg-FT: FedAvg, then each user fine-tunes the global model on its own training
data, the personalisation baseline of Wang et al. ("Federated Evaluation of On-device
Personalization", 2019) and Jiang et al. ("Improving Federated Learning
Personalization via Model Agnostic Meta Learning", 2019), FL-bench's "FedAvg-FT".

Training is FedAvg's exactly (same batches for one seed). One personalisation step
is `fedavg-ft.finetune_steps` SGD steps of size alpha, each on a fresh batch of the user's
training shard; with `finetune_steps: 1` the method is the paper's "FedAvg + update".

Under differential privacy (`privacy: central | local`) a user shares what FedAvg's
does, its whole model's update, clipped and noised; its fine-tuning steps at evaluation
stay with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from perfed_ray.algorithms.base import AlgorithmHParams
from perfed_ray.algorithms.fedavg import FedAvg
from perfed_ray.config.settings import Setting

if TYPE_CHECKING:
    from perfed_ray.config.schema import RunConfig


class FedAvgFT(FedAvg):
    """FedAvg's training, and so FedAvg's task on the simulated clock (one batch a
    step); its fine-tuning belongs to evaluation, which the clock does not time."""

    settings: ClassVar[dict[str, Setting]] = {
        "finetune_steps": Setting(
            10,
            "SGD steps (size alpha) in one personalisation step",
            low=1,
            legacy="finetune_steps",
        ),
    }

    def __init__(self, hparams: AlgorithmHParams | RunConfig) -> None:
        super().__init__(hparams)
        self.personalise_batches = self.settings["finetune_steps"]
