"""Dataset names -> their builders; the two entry points the engine and train.py call."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError
from . import cifar, npz, synthetic, wikitext
from .bundle import DataBundle, validate_subset


def _no_files(cfg) -> None:
    """Synthetic data is generated, so there is nothing on disk to find."""


# Work worth doing once per machine before the ranks start (e.g. decoding JPEGs into a cache).
_PREPARERS = {"npz": npz.prepare}

_BUILDERS = {
    "cifar10": (cifar.check, cifar.build),
    "cifar100": (cifar.check, cifar.build),
    "npz": (npz.check, npz.build),
    "synthetic_cifar10": (_no_files, synthetic.build_images),
    "synthetic_cifar100": (_no_files, synthetic.build_images),
    "wikitext2": (wikitext.check, wikitext.build),
    "synthetic_text": (_no_files, synthetic.build_text),
}
DATASET_NAMES: tuple[str, ...] = tuple(_BUILDERS)


def _builders(cfg: Mapping):
    name = cfg.get("name", None)
    if name not in _BUILDERS:
        raise ConfigError("dataset.name",
                          f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    validate_subset(cfg.get("subset", None))
    return _BUILDERS[name]


def check_dataset(cfg: Mapping) -> None:
    """Fail fast, before any rank starts, on a bad name, subset or missing files."""
    check, _ = _builders(cfg)
    check(cfg)


def prepare_dataset(cfg: Mapping) -> None:
    """Do the dataset's one-off work (decode caches) in the launching process."""
    _builders(cfg)
    _PREPARERS.get(cfg.get("name"), _no_files)(cfg)


def build_data(cfg: Mapping, seed: int) -> DataBundle:
    """Load (or generate) the dataset a `dataset` config node describes."""
    _, build = _builders(cfg)
    return build(cfg, seed)
