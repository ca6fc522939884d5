"""Dataset names -> their builders; the entry points the engine, config.py and train.py call."""

from __future__ import annotations

from collections.abc import Mapping

from . import cifar, npz, synthetic, wikitext
from .bundle import DataBundle
from .settings import dataset_settings


def _nothing(settings) -> None:
    """Synthetic data is generated: no files to find; only npz files have one-off work."""


# name -> (check: fail fast on missing files, prepare: work worth doing once per machine before
# the ranks start, e.g. decoding JPEGs into a cache, build)
_DATASETS = {
    "cifar10": (cifar.check, _nothing, cifar.build),
    "cifar100": (cifar.check, _nothing, cifar.build),
    "npz": (npz.check, npz.prepare, npz.build),
    "synthetic_cifar10": (_nothing, _nothing, synthetic.build_images),
    "synthetic_cifar100": (_nothing, _nothing, synthetic.build_images),
    "wikitext2": (wikitext.check, _nothing, wikitext.build),
    "synthetic_text": (_nothing, _nothing, synthetic.build_text),
}
DATASET_NAMES: tuple[str, ...] = tuple(_DATASETS)


def check_dataset(cfg: Mapping) -> None:
    """Fail fast, before any rank starts, on a bad name or option or on missing files."""
    settings = dataset_settings(cfg)
    _DATASETS[settings.name][0](settings)


def prepare_dataset(cfg: Mapping) -> None:
    """Do the dataset's one-off work (decode caches) in the launching process."""
    settings = dataset_settings(cfg)
    _DATASETS[settings.name][1](settings)


def build_data(cfg: Mapping, seed: int) -> DataBundle:
    """Load (or generate) the dataset a `dataset` config node describes."""
    settings = dataset_settings(cfg)
    return _DATASETS[settings.name][2](settings, seed)
