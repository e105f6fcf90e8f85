"""Training-time augmentation of image batches (`augment`), as the field's CIFAR code
does it.

FedRep's code (and LG-FedAvg's, from which it comes) reads every CIFAR training image
through torchvision's `RandomCrop(32, padding=4)` then `RandomHorizontalFlip()`: the
image is padded with 4 black pixels on each side, a 32 x 32 window is cut out at a
uniformly drawn offset (0 to 8 in each direction), and the result is mirrored left to
right with probability 1/2; test images are not touched. `augment: crop-flip` does the
same to each training batch a user draws (a round's local steps and the
personalisation steps of an evaluation), after the batch has been gathered, on the
actor's device, with draws from the user's own stream for that round
(:class:`~perfed_ray.seeding.Stream`), so a user's augmented batches are the same
whichever actor trains it and whichever engine runs. The shards hold model inputs
(pixels already scaled by `input_scale`), so the padding is the input a black pixel
becomes: 0 under `unit`, -mean / std under `standardize`.

Where this differs from torchvision: the draws come from our streams, not from
torch's global generator, so they are not the same numbers; the crop and the flip are
one gather (the flip reverses the window's columns), which is what cropping and then
flipping computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from perfed_ray.data.scaling import InputScaling

PADDING = 4  # RandomCrop(32, padding=4), as FedRep's and LG-FedAvg's CIFAR transforms


@dataclass(frozen=True)
class CropFlip:
    """Random crop of a black-padded image and a random horizontal flip."""

    input_shape: tuple[int, int, int]  # (C, H, W) of the flat features
    black: tuple[float, ...]  # the model input of a black pixel, per channel
    padding: int = PADDING

    def draws(self, n: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """For n images: the window's top and left offsets in the padded image, and
        whether each is flipped."""
        top = torch.randint(0, 2 * self.padding + 1, (n,), generator=gen)
        left = torch.randint(0, 2 * self.padding + 1, (n,), generator=gen)
        flip = torch.rand(n, generator=gen) < 0.5
        return top, left, flip

    def apply(
        self, x: torch.Tensor, top: torch.Tensor, left: torch.Tensor, flip: torch.Tensor
    ) -> torch.Tensor:
        """x [..., C*H*W] (n images in all) -> the same shape, each image cropped at
        (top, left) of its padded self and, where `flip`, mirrored."""
        c, h, w = self.input_shape
        p, lead = self.padding, x.shape[:-1]
        images = x.reshape(-1, c, h, w)
        n, device = len(images), x.device
        fill = torch.tensor(self.black, dtype=x.dtype, device=device)
        padded = fill.view(1, c, 1, 1).expand(n, c, h + 2 * p, w + 2 * p).clone()
        padded[:, :, p : p + h, p : p + w] = images
        columns = torch.arange(w, device=device)
        columns = torch.where(flip.to(device)[:, None], w - 1 - columns, columns)
        rows = top.to(device)[:, None] + torch.arange(h, device=device)
        columns = columns + left.to(device)[:, None]
        out = padded[
            torch.arange(n, device=device)[:, None, None, None],
            torch.arange(c, device=device)[None, :, None, None],
            rows[:, None, :, None],
            columns[:, None, None, :],
        ]
        return out.reshape(*lead, c * h * w)

    def __call__(self, x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        n = x[..., 0].numel()
        return self.apply(x, *self.draws(n, gen))


def augmentation(
    how: str, input_shape: tuple[int, int, int], scaling: InputScaling | None
) -> CropFlip | None:
    """The augmentation `augment` names for images of `input_shape` scaled by
    `scaling` (None: none). The configuration's checks keep crop-flip to pixel data
    scaled per channel, where a black pixel has one input value per channel."""
    if how == "none":
        return None
    channels = input_shape[0]
    if scaling is None or len(scaling.offset) != channels:
        raise ValueError(f"augment = {how!r} needs images scaled per channel")
    black = scaling.apply(np.zeros((1, int(np.prod(input_shape))), np.uint8), torch.device("cpu"))
    return CropFlip(input_shape, tuple(black.view(channels, -1)[:, 0].tolist()))
