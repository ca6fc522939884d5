"""Shared pieces of the image datasets: the official CIFAR transforms and an in-memory dataset.

Every image dataset (torchvision CIFAR, npz files, synthetic stand-ins) goes through the same
PIL -> augmentation -> ToTensor -> Normalize pipeline as the official code, so a model sees
inputs of the same distribution whichever source supplies the pixels.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset, Subset
from torchvision import transforms

from ..errors import ConfigError
from .bundle import DataBundle, describe_subset, seeded_subset_indices, subset_size

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


def image_transforms(mean, std, *, augment: bool, rotation_degrees: float = 0.0):
    """(train, test) transforms: RandomCrop(32, 4) + flip (+ rotation) only when augmenting."""
    finish = [transforms.ToTensor(), transforms.Normalize(mean, std)]
    augmentation = []
    if augment:
        augmentation = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
        if rotation_degrees:
            augmentation.append(transforms.RandomRotation(rotation_degrees))
    return transforms.Compose(augmentation + finish), transforms.Compose(finish)


def transforms_from_config(cfg, default_mean, default_std, default_rotation: float = 0.0):
    rotation = float(cfg.get("rotation_degrees", default_rotation) or 0.0)
    if rotation < 0:
        raise ConfigError("dataset.rotation_degrees", f"must be >= 0, got {rotation}")
    return image_transforms(channel_stats(cfg, "mean", default_mean),
                            channel_stats(cfg, "std", default_std),
                            augment=bool(cfg.get("augment", True)),
                            rotation_degrees=rotation)


class ArrayImageDataset(Dataset):
    """Images held as one uint8 (N, 32, 32, 3) array, served like torchvision's CIFAR."""

    def __init__(self, images: np.ndarray, labels, transform=None):
        if images.ndim != 4 or images.shape[3] != 3 or images.dtype != np.uint8:
            raise ValueError(f"expected uint8 images of shape (N, H, W, 3), got "
                             f"{images.dtype} {images.shape}")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
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


def image_bundle(name: str, train: Dataset, test: Dataset, *, num_classes: int, subset,
                 seed: int, notes: str = "") -> DataBundle:
    """Apply the seeded training subset and write the one-line description."""
    total = len(train)
    kept = subset_size(subset, total)
    if kept < total:
        train = Subset(train, seeded_subset_indices(total, kept, seed).tolist())
    detail = f", {notes}" if notes else ""
    description = (f"{name}: {len(train)} train / {len(test)} test images, {num_classes} "
                   f"classes ({describe_subset(subset, kept, total)}{detail})")
    return DataBundle(kind="image", train=train, test=test, num_classes=num_classes,
                      vocab_size=None, description=description)


def check_labels(labels: torch.Tensor | np.ndarray, num_classes: int, source: str) -> None:
    labels = np.asarray(labels)
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise ConfigError("dataset.num_classes",
                          f"{source} has labels in [{labels.min()}, {labels.max()}] but "
                          f"num_classes is {num_classes}")
