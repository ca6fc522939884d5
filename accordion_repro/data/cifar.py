"""CIFAR-10 / CIFAR-100 through torchvision's python-pickle readers, with the official transforms.

torchvision verifies the md5 of every official file. `verify_checksums: false` swaps in a
subclass whose file lists carry no checksum, so the files must still exist and be in the real
pickle format (our tests write small ones), but their content is not compared to the release.
"""

from __future__ import annotations

import os

from ..errors import DatasetMissingError
from .bundle import DataBundle, make_bundle
from .images import image_transforms
from .settings import CifarSettings

_SOURCES = {
    "cifar10": dict(cls="CIFAR10", num_classes=10, label="CIFAR-10"),
    "cifar100": dict(cls="CIFAR100", num_classes=100, label="CIFAR-100"),
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


def check(settings: CifarSettings) -> None:
    if settings.download:
        return
    source = _SOURCES[settings.name]
    cls = _reader(source)
    folder = os.path.join(settings.root, cls.base_folder)
    expected = [name for name, _ in cls.train_list + cls.test_list] + [cls.meta["filename"]]
    missing = [f for f in expected if not os.path.isfile(os.path.join(folder, f))]
    if missing:
        partial = f" (missing {', '.join(missing)})" if len(missing) < len(expected) else ""
        raise DatasetMissingError(
            f"{source['label']} not found: expected {', '.join(expected)} in "
            f"{os.path.abspath(folder)}{partial}; {_HOW_TO_GET}")


def build(settings: CifarSettings, seed: int) -> DataBundle:
    check(settings)
    source = _SOURCES[settings.name]
    cls, root = _reader(source), settings.root
    reader = cls if settings.verify_checksums else _without_checksums(cls)
    train_tf, test_tf = image_transforms(settings)
    try:
        train = reader(root, train=True, transform=train_tf, download=settings.download)
        test = reader(root, train=False, transform=test_tf, download=False)
    except RuntimeError:  # torchvision's "not found or corrupted" after an md5 check
        raise DatasetMissingError(
            f"{source['label']} files in {os.path.abspath(os.path.join(root, cls.base_folder))} "
            f"fail torchvision's md5 check; {_HOW_TO_GET}, or set dataset.verify_checksums=false "
            f"for a non-official copy") from None
    return make_bundle(settings, train, test, seed=seed, num_classes=source["num_classes"])


def _reader(source: dict) -> type:
    """torchvision's reader class, imported only when a CIFAR dataset is read: importing
    torchvision costs seconds, which every launcher, refused job and spawned rank paid before."""
    import torchvision.datasets

    return getattr(torchvision.datasets, source["cls"])
