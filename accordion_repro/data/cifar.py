"""CIFAR-10 / CIFAR-100 through torchvision's python-pickle readers, with the official transforms.

torchvision verifies the md5 of every official file. `verify_checksums: false` swaps in a
subclass whose file lists carry no checksum, so the files must still exist and be in the real
pickle format (our tests write small ones), but their content is not compared to the release.
"""

from __future__ import annotations

import os

from torchvision.datasets import CIFAR10, CIFAR100

from ..errors import DatasetMissingError
from .bundle import DataBundle
from .images import (CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD, image_bundle,
                     transforms_from_config)

_SOURCES = {
    "cifar10": dict(cls=CIFAR10, num_classes=10, mean=CIFAR10_MEAN, std=CIFAR10_STD,
                    rotation=0.0, label="CIFAR-10"),
    "cifar100": dict(cls=CIFAR100, num_classes=100, mean=CIFAR100_MEAN, std=CIFAR100_STD,
                     rotation=15.0, label="CIFAR-100"),
}

_HOW_TO_GET = ("set dataset.download=true or place the python-version archive there "
               "(https://www.cs.toronto.edu/~kriz/cifar.html)")


def _expected_files(cls) -> list[str]:
    return [name for name, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]


def _without_checksums(cls):
    """The same reader with every md5 dropped: torchvision then only checks that files exist."""
    return type(f"Unverified{cls.__name__}", (cls,), {
        "train_list": [[name, None] for name, _ in cls.train_list],
        "test_list": [[name, None] for name, _ in cls.test_list],
        "meta": {**cls.meta, "md5": None},
    })


def check(cfg) -> None:
    source = _SOURCES[cfg["name"]]
    if cfg.get("download", False):
        return
    folder = os.path.join(str(cfg.get("root", "data")), source["cls"].base_folder)
    missing = [f for f in _expected_files(source["cls"])
               if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        expected = _expected_files(source["cls"])
        partial = f" (missing {', '.join(missing)})" if len(missing) < len(expected) else ""
        raise DatasetMissingError(
            f"{source['label']} not found: expected {', '.join(expected)} in "
            f"{os.path.abspath(folder)}{partial}; {_HOW_TO_GET}")


def build(cfg, seed: int) -> DataBundle:
    name = cfg["name"]
    source = _SOURCES[name]
    check(cfg)
    reader = source["cls"] if cfg.get("verify_checksums", True) else \
        _without_checksums(source["cls"])
    root = str(cfg.get("root", "data"))
    download = bool(cfg.get("download", False))
    train_tf, test_tf = transforms_from_config(cfg, source["mean"], source["std"],
                                               source["rotation"])
    try:
        train = reader(root, train=True, transform=train_tf, download=download)
        test = reader(root, train=False, transform=test_tf, download=False)
    except RuntimeError:  # torchvision's "not found or corrupted" after an md5 check
        folder = os.path.abspath(os.path.join(root, source["cls"].base_folder))
        raise DatasetMissingError(
            f"{source['label']} files in {folder} fail torchvision's md5 check; "
            f"{_HOW_TO_GET}, or set dataset.verify_checksums=false for a non-official copy"
        ) from None
    augment = "augment on" if cfg.get("augment", True) else "augment off"
    return image_bundle(name, train, test, num_classes=source["num_classes"],
                        subset=cfg.get("subset", None), seed=seed, notes=augment)
