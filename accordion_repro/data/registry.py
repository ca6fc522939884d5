"""Dataset names -> their builders; the entry points the engine, config.py and train.py call."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError
from . import cifar, npz, synthetic, wikitext
from .bundle import DataBundle
from .settings import (Cifar100Settings, CifarSettings, DataSettings, NpzSettings,
                       SyntheticImage100Settings, SyntheticImageSettings, SyntheticTextSettings,
                       WikiTextSettings)


def _nothing(settings) -> None:
    """Synthetic data is generated: no files to find, nothing to check or prepare."""


# name -> (its options, check: fail fast on missing files, prepare: work done once in the
# launching process before the ranks start, e.g. reading and checking every file, decoding JPEGs
# into a cache, build)
_DATASETS = {
    "cifar10": (CifarSettings, cifar.check, cifar.prepare, cifar.build),
    "cifar100": (Cifar100Settings, cifar.check, cifar.prepare, cifar.build),
    "npz": (NpzSettings, npz.check, npz.prepare, npz.build),
    "synthetic_cifar10": (SyntheticImageSettings, _nothing, _nothing, synthetic.build_images),
    "synthetic_cifar100": (SyntheticImage100Settings, _nothing, _nothing, synthetic.build_images),
    "wikitext2": (WikiTextSettings, wikitext.check, _nothing, wikitext.build),
    "synthetic_text": (SyntheticTextSettings, _nothing, _nothing, synthetic.build_text),
}
DATASET_NAMES: tuple[str, ...] = tuple(_DATASETS)
SETTINGS: dict[str, type[DataSettings]] = {name: entry[0] for name, entry in _DATASETS.items()}


def dataset_settings(cfg: Mapping) -> DataSettings:
    """The `dataset` node, checked: its name, then every option its dataset takes."""
    name = cfg.get("name", None)
    if name not in _DATASETS:
        raise ConfigError("dataset.name",
                          f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    return SETTINGS[name].from_config(cfg, owner=f"dataset {name!r}")


def _checked(data: DataSettings | Mapping) -> DataSettings:
    """The trainer passes its checked DataSettings (RunSettings.dataset); own code and tests
    may pass the `dataset` node, read here."""
    return data if isinstance(data, DataSettings) else dataset_settings(data)


def check_dataset(data: DataSettings | Mapping) -> None:
    """Fail fast, before any rank starts, on a bad name or option or on missing files."""
    settings = _checked(data)
    _DATASETS[settings.name][1](settings)


def prepare_dataset(data: DataSettings | Mapping) -> None:
    """Do the dataset's one-off work (decode caches) in the launching process."""
    settings = _checked(data)
    _DATASETS[settings.name][2](settings)


def build_data(data: DataSettings | Mapping, seed: int) -> DataBundle:
    """Load (or generate) the dataset its settings (or its `dataset` node) describe."""
    settings = _checked(data)
    return _DATASETS[settings.name][3](settings, seed)
