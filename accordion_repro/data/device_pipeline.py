"""The official CIFAR augmentation as tensor operations on whole batches, on the rank's device.

The PIL pipeline (data/images.py) decodes, crops, flips and normalises one image at a time in
the rank's own process (or in loader workers): on a GPU that feeds far fewer images per second
than the model consumes. Here the training split is held as one uint8 tensor on the device and
each batch is gathered by index and augmented in a few tensor operations.

What it reproduces is read from the dataset's own PIL transform (RandomCrop with padding,
RandomHorizontalFlip, RandomRotation, Normalize, in their order), so the two pipelines cannot
drift apart; anything else in the transform is refused by name. The sampler is the same
DistributedSampler (same order per rank and epoch, the official no-reshuffle switch included);
only the random draws differ: each batch draws its crop offsets, flips and angles from torch's
global CPU generator (the one a checkpoint saves and restores), the same distributions as the
per-image PIL draws. tests/test_data.py compares the two.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Subset

from ..errors import ConfigError
from ..transfer import host_to_device


def raw_arrays(dataset) -> tuple[np.ndarray, np.ndarray, object]:
    """(uint8 NHWC images, int64 labels, PIL transform) of a CIFAR-style dataset or a Subset."""
    indices = None
    while isinstance(dataset, Subset):
        chosen = np.asarray(dataset.indices)
        indices = chosen if indices is None else chosen[indices]
        dataset = dataset.dataset
    if not hasattr(dataset, "data") or not hasattr(dataset, "targets"):
        raise ConfigError("dataset.pipeline", f"device needs images held as one array; "
                                              f"{type(dataset).__name__} has none")
    images, labels = np.asarray(dataset.data), np.asarray(dataset.targets, dtype=np.int64)
    if indices is not None:
        images, labels = images[indices], labels[indices]
    return images, labels, dataset.transform


@dataclass(frozen=True)
class Step:
    """One transform of the official pipeline, as parameters for a batch."""

    kind: str            # "crop", "flip", "rotate", "normalize", "to_float"
    value: tuple = ()


def steps_of(transform) -> list[Step]:
    """The official transform as Steps, in its order; anything else refused by name."""
    from torchvision import transforms  # here: importing torchvision costs seconds per process

    listed = transform.transforms if isinstance(transform, transforms.Compose) else [transform]
    steps = []
    for t in listed:
        if isinstance(t, transforms.RandomCrop):
            if t.padding_mode != "constant" or t.fill != 0 or t.pad_if_needed:
                raise ConfigError("dataset.pipeline", "device reproduces RandomCrop with zero "
                                                      "padding only")
            pad = t.padding if isinstance(t.padding, int) else t.padding[0]
            steps.append(Step("crop", (int(t.size[0]), int(pad))))
        elif isinstance(t, transforms.RandomHorizontalFlip):
            steps.append(Step("flip", (float(t.p),)))
        elif isinstance(t, transforms.RandomRotation):
            steps.append(Step("rotate", tuple(float(d) for d in t.degrees)))
        elif isinstance(t, transforms.ToTensor):
            steps.append(Step("to_float"))
        elif isinstance(t, transforms.Normalize):
            steps.append(Step("normalize", (tuple(t.mean), tuple(t.std))))
        else:
            raise ConfigError("dataset.pipeline", f"device cannot reproduce the transform "
                                                  f"{type(t).__name__}; use dataset.pipeline=pil")
    return steps


class DeviceImages:
    """One split on the device; `batch(indices)` is what the PIL pipeline's loader yields."""

    def __init__(self, dataset, device: torch.device):
        images, labels, transform = raw_arrays(dataset)
        self.images = torch.from_numpy(images).to(device).permute(0, 3, 1, 2).contiguous()
        self.labels = torch.from_numpy(labels).to(device)
        self.steps = steps_of(transform) if transform is not None else []
        self.device = device

    def __len__(self) -> int:
        return len(self.labels)

    def batch(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        index = host_to_device(indices, self.device)
        x = self.images[index]
        for step in self.steps:
            x = getattr(self, f"_{step.kind}")(x, *step.value)
        return x, self.labels[index]

    def batches(self, order: list[int], batch_size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order_t = torch.as_tensor(order, dtype=torch.long)
        for start in range(0, len(order_t), batch_size):
            yield self.batch(order_t[start:start + batch_size])

    # ---- the transforms, on a batch (N, C, H, W) ------------------------------------------
    def _crop(self, x: torch.Tensor, size: int, pad: int) -> torch.Tensor:
        n, c, h, w = x.shape
        padded = F.pad(x, (pad, pad, pad, pad)) if pad else x
        offsets = host_to_device(torch.randint(0, h + 2 * pad - size + 1, (n, 2)), x.device)
        span = torch.arange(size, device=x.device)
        rows = (offsets[:, 0:1] + span)[:, None, :, None]
        cols = (offsets[:, 1:2] + span)[:, None, None, :]
        return padded[torch.arange(n, device=x.device)[:, None, None, None],
                      torch.arange(c, device=x.device)[None, :, None, None], rows, cols]

    def _flip(self, x: torch.Tensor, p: float) -> torch.Tensor:
        flip = host_to_device(torch.rand(len(x)) < p, x.device)[:, None, None, None]
        return torch.where(flip, x.flip(-1), x)

    def _rotate(self, x: torch.Tensor, low: float, high: float) -> torch.Tensor:
        """Nearest-neighbour rotation about the centre with zero fill, as PIL's default."""
        angles = host_to_device(torch.empty(len(x)).uniform_(low, high), x.device) * (math.pi / 180)
        cos, sin = torch.cos(angles), torch.sin(angles)
        zero = torch.zeros_like(cos)
        theta = torch.stack([torch.stack([cos, -sin, zero], 1), torch.stack([sin, cos, zero], 1)], 1)
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x.float(), grid, mode="nearest", padding_mode="zeros",
                             align_corners=False).to(x.dtype)

    def _to_float(self, x: torch.Tensor) -> torch.Tensor:
        return x.float().div_(255)

    def _normalize(self, x: torch.Tensor, mean, std) -> torch.Tensor:
        mean_t = host_to_device(torch.tensor(mean, dtype=x.dtype), x.device)[None, :, None, None]
        std_t = host_to_device(torch.tensor(std, dtype=x.dtype), x.device)[None, :, None, None]
        return (x - mean_t) / std_t
