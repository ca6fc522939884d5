"""Shared pieces of the image datasets: the official CIFAR transforms and an in-memory dataset.

Every image dataset (torchvision CIFAR, npz files, synthetic stand-ins) goes through the same
PIL -> augmentation -> ToTensor -> Normalize pipeline as the official code, so a model sees
inputs of the same distribution whichever source supplies the pixels.
"""

from __future__ import annotations

import numpy as np
from PIL import Image
from torch.utils.data import Dataset

from .settings import ImageSettings


def image_transforms(settings: ImageSettings):
    """(train, test) transforms: RandomCrop(32, 4) + flip (+ rotation) only when augmenting."""
    from torchvision import transforms  # here: importing torchvision costs seconds per process

    finish = [transforms.ToTensor(), transforms.Normalize(settings.mean, settings.std)]
    augmentation = []
    if settings.augment:
        augmentation = [transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip()]
        if settings.rotation_degrees:
            augmentation.append(transforms.RandomRotation(settings.rotation_degrees))
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
