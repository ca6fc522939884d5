"""Datasets and loaders behind the contract of docs/architecture.md (plain classes, no Hydra)."""

from .bundle import DataBundle
from .device_pipeline import DeviceImages
from .loaders import batchify, bptt_windows, epoch_sampler, image_loader
from .registry import DATASET_NAMES, build_data, check_dataset, dataset_settings, prepare_dataset
from .settings import CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD, PIPELINES

__all__ = ["DataBundle", "DATASET_NAMES", "build_data", "check_dataset", "prepare_dataset", "image_loader",
           "epoch_sampler", "DeviceImages", "PIPELINES", "dataset_settings",
           "batchify", "bptt_windows", "CIFAR10_MEAN", "CIFAR10_STD", "CIFAR100_MEAN",
           "CIFAR100_STD"]
