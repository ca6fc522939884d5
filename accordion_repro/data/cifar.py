"""CIFAR-10 / CIFAR-100 through torchvision's python-pickle readers, with the official transforms.

torchvision verifies the md5 of every official file. `verify_checksums: false` swaps in a
subclass whose file lists carry no checksum, so the files must still exist and be in the real
pickle format (our tests write small ones), but their content is not compared to the release.
"""

from __future__ import annotations

import os

from torchvision.datasets import CIFAR10, CIFAR100

from ..errors import DatasetMissingError
from .bundle import DataBundle, make_bundle
from .images import CIFAR10_MEAN, CIFAR10_STD, CIFAR100_MEAN, CIFAR100_STD, transforms_from_config

_SOURCES = {
    "cifar10": dict(cls=CIFAR10, num_classes=10, mean=CIFAR10_MEAN, std=CIFAR10_STD,
                    rotation=0.0, label="CIFAR-10"),
    "cifar100": dict(cls=CIFAR100, num_classes=100, mean=CIFAR100_MEAN, std=CIFAR100_STD,
                     rotation=15.0, label="CIFAR-100"),
}

_HOW_TO_GET = ("set dataset.download=true or place the python-version archive there "
               "(https://www.cs.toronto.edu/~kriz/cifar.html)")


def _without_checksums(cls):
    """The same reader with every md5 dropped: torchvision then only checks that files exist."""
    return type(f"Unverified{cls.__name__}", (cls,), {
        "train_list": [[name, None] for name, _ in cls.train_list],
        "test_list": [[name, None] for name, _ in cls.test_list],
        "meta": {**cls.meta, "md5": None},
    })


def check(cfg) -> None:
    if cfg.get("download", False):
        return
    source = _SOURCES[cfg["name"]]
    cls = source["cls"]
    folder = os.path.join(str(cfg.get("root", "data")), cls.base_folder)
    expected = [name for name, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    missing = [f for f in expected if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        partial = f" (missing {', '.join(missing)})" if len(missing) < len(expected) else ""
        raise DatasetMissingError(
            f"{source['label']} not found: expected {', '.join(expected)} in "
            f"{os.path.abspath(folder)}{partial}; {_HOW_TO_GET}")


def build(cfg, seed: int) -> DataBundle:
    check(cfg)
    source = _SOURCES[cfg["name"]]
    cls, root = source["cls"], str(cfg.get("root", "data"))
    reader = cls if cfg.get("verify_checksums", True) else _without_checksums(cls)
    train_tf, test_tf = transforms_from_config(cfg, source["mean"], source["std"],
                                               source["rotation"])
    try:
        train = reader(root, train=True, transform=train_tf,
                       download=bool(cfg.get("download", False)))
        test = reader(root, train=False, transform=test_tf, download=False)
    except RuntimeError:  # torchvision's "not found or corrupted" after an md5 check
        raise DatasetMissingError(
            f"{source['label']} files in {os.path.abspath(os.path.join(root, cls.base_folder))} "
            f"fail torchvision's md5 check; {_HOW_TO_GET}, or set dataset.verify_checksums=false "
            f"for a non-official copy") from None
    return make_bundle(cfg, cfg["name"], train, test, seed=seed,
                       num_classes=source["num_classes"])
