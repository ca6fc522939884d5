"""Shared pieces of the image datasets: the official CIFAR transforms and an in-memory dataset.

Every image dataset (torchvision CIFAR, npz files, synthetic stand-ins) goes through the same
PIL -> augmentation -> ToTensor -> Normalize pipeline as the official code, so a model sees
inputs of the same distribution whichever source supplies the pixels.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms

from ..errors import ConfigError
from ..options import Options

# Official normalisation (facts section 5). CIFAR-10's is given in 0..255 units in the code.
CIFAR10_MEAN = tuple(v / 255.0 for v in (125.3, 123.0, 113.9))
CIFAR10_STD = tuple(v / 255.0 for v in (63.0, 62.1, 66.7))
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


def channel_stats(cfg, key: str, default: Sequence[float]) -> tuple[float, float, float]:
    """Read a per-channel mean or std from the config, checking it has three entries."""
    value = cfg.get(key, None)
    if value is None:
        return tuple(default)
    values = tuple(float(v) for v in value)
    if len(values) != 3:
        raise ConfigError(f"dataset.{key}", f"needs 3 per-channel values, got {len(values)}")
    if key == "std" and min(values) <= 0:
        raise ConfigError("dataset.std", f"every entry must be positive, got {values}")
    return values


def transforms_from_config(cfg, default_mean, default_std, default_rotation: float = 0.0):
    """(train, test) transforms: RandomCrop(32, 4) + flip (+ rotation) only when augmenting."""
    rotation = Options("dataset", cfg).number("rotation_degrees", closed="low",
                                              default=default_rotation)
    finish = [transforms.ToTensor(), transforms.Normalize(channel_stats(cfg, "mean", default_mean),
                                                          channel_stats(cfg, "std", default_std))]
    augmentation = []
    if cfg.get("augment", True):
        augmentation = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
        if rotation:
            augmentation.append(transforms.RandomRotation(rotation))
    return transforms.Compose(augmentation + finish), transforms.Compose(finish)


class ArrayImageDataset(Dataset):
    """Images held as one uint8 (N, 32, 32, 3) array, served like torchvision's CIFAR."""

    def __init__(self, images: np.ndarray, labels, transform=None):
        self.data = images
        self.targets = [int(y) for y in labels]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        image = Image.fromarray(self.data[index])
        if self.transform is not None:
            image = self.transform(image)
        return image, self.targets[index]
