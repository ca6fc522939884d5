"""Dataset names -> their builders; the entry points the engine, config.py and train.py call."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError
from . import cifar, npz, synthetic, wikitext
from .bundle import DataBundle, validate_subset


def _nothing(cfg) -> None:
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


def _dataset(cfg: Mapping):
    name = cfg.get("name", None)
    if name not in _DATASETS:
        raise ConfigError("dataset.name",
                          f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    validate_subset(cfg.get("subset", None))
    return _DATASETS[name]


def check_dataset(cfg: Mapping) -> None:
    """Fail fast, before any rank starts, on a bad name, subset or missing files."""
    check, _, _ = _dataset(cfg)
    check(cfg)


def prepare_dataset(cfg: Mapping) -> None:
    """Do the dataset's one-off work (decode caches) in the launching process."""
    _, prepare, _ = _dataset(cfg)
    prepare(cfg)


def build_data(cfg: Mapping, seed: int) -> DataBundle:
    """Load (or generate) the dataset a `dataset` config node describes."""
    _, _, build = _dataset(cfg)
    return build(cfg, seed)
