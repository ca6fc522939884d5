"""CIFAR-10 / CIFAR-100 in the release's python-pickle format, with the official transforms.

torchvision verifies the md5 of every official file. `verify_checksums: false` swaps in a
subclass whose file lists carry no checksum, so the files must still exist and be in the real
pickle format (our tests write small ones), but their content is not compared to the release.

A pickle can run code as it loads, so a batch is never read with pickle.load (which
torchvision's reader uses): SafeUnpickler admits only what the format holds (dicts, lists,
bytes, str, int and numpy arrays of numeric dtype) whatever the checksum setting, and anything
else (a crafted `__reduce__` calling os.system) is refused in one line naming the file, before
it runs. prepare() reads and checks every file once in the launching process, so a damaged
file is one line before any rank starts, not a traceback per rank.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from ..errors import ConfigError, DatasetMissingError
from .bundle import DataBundle, make_bundle
from .images import image_transforms
from .settings import CifarSettings

_SOURCES = {
    "cifar10": dict(cls="CIFAR10", num_classes=10, label="CIFAR-10"),
    "cifar100": dict(cls="CIFAR100", num_classes=100, label="CIFAR-100"),
}

_HOW_TO_GET = ("set dataset.download=true or place the python-version archive there "
               "(https://www.cs.toronto.edu/~kriz/cifar.html)")


# What numpy's own pickling of an array refers to (numpy 1 and 2 name its module differently),
# and how protocol 2 writes bytes from Python 3 (_codecs.encode of a latin-1 str; a codec is
# looked up only among the `encodings` package's modules).
_NUMPY_GLOBALS = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                  ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class SafeUnpickler(pickle.Unpickler):
    """pickle.Unpickler that resolves no global but numpy's array reconstruction."""

    def find_class(self, module: str, name: str):
        if (module, name) in _NUMPY_GLOBALS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it refers to {module}.{name}, which a CIFAR batch never "
                                     f"holds")


def _numeric(value) -> bool:
    if isinstance(value, np.ndarray):
        return value.dtype.kind in "biuf"
    if isinstance(value, dict):
        return all(isinstance(k, (str, bytes)) and _numeric(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_numeric(v) for v in value)
    return isinstance(value, (bytes, str, int, float)) and not isinstance(value, bool)


def read_batch(path: str, label_key: str | None) -> dict:
    """One file of the release (a batch, or the meta file when `label_key` is None), checked:
    ConfigError naming dataset.root and the file for anything the format does not hold."""
    def refuse(what: str) -> ConfigError:
        return ConfigError("dataset.root", f"{path} {what}: not a CIFAR file of the release "
                                           f"(damaged or crafted; a pickle that names other "
                                           f"code could run it, so it is not read); {_HOW_TO_GET}")
    try:
        with open(path, "rb") as f:
            entry = SafeUnpickler(f, encoding="latin1").load()
    except pickle.UnpicklingError as exc:
        raise refuse(f"cannot be read safely ({exc})") from None
    except Exception as exc:  # truncated, not a pickle at all, ...
        raise refuse(f"cannot be read ({type(exc).__name__}: {exc})") from None
    if not isinstance(entry, dict) or not _numeric(entry):
        raise refuse("holds something other than dicts, lists, bytes, str, numbers and numeric "
                     "arrays")
    if label_key is None:
        return entry
    data, labels = entry.get("data"), entry.get(label_key)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 \
            or data.shape[1] != 3 * 32 * 32:
        raise refuse(f"has no uint8 'data' of shape (N, 3072)")
    if not isinstance(labels, list) or len(labels) != len(data) \
            or not all(isinstance(v, int) for v in labels):
        raise refuse(f"has no '{label_key}' list of one int per image")
    return entry


def _safe(cls):
    """The reader `cls` (torchvision's, or its checksum-free subclass) reading its files with
    read_batch instead of pickle.load; everything else (download, md5 check, transforms,
    __getitem__) is torchvision's."""
    from torchvision.datasets import VisionDataset

    def __init__(self, root, train=True, transform=None, download=False):
        VisionDataset.__init__(self, root, transform=transform)
        self.train = train
        if download:
            self.download()
        if not self._check_integrity():
            raise RuntimeError("Dataset not found or corrupted.")
        folder = os.path.join(self.root, self.base_folder)
        label_key = "labels" if self.meta["key"] == "label_names" else "fine_labels"
        entries = [read_batch(os.path.join(folder, name), label_key)
                   for name, _ in (self.train_list if train else self.test_list)]
        self.data = np.vstack([e["data"] for e in entries]).reshape(-1, 3, 32, 32)
        self.data = self.data.transpose((0, 2, 3, 1))
        self.targets = [label for e in entries for label in e[label_key]]
        meta = read_batch(os.path.join(folder, self.meta["filename"]), None)
        self.classes = meta[self.meta["key"]]
        self.class_to_idx = {name: index for index, name in enumerate(self.classes)}

    return type(f"Safe{cls.__name__}", (cls,), {"__init__": __init__})


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
    reader = _safe(cls if settings.verify_checksums else _without_checksums(cls))
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


def prepare(settings: CifarSettings) -> None:
    """Before the ranks start: every file checked against its md5 (unless
    verify_checksums=false), then read safely and checked (read_batch), so that a missing,
    damaged or crafted file is one line naming it, before any rank starts."""
    from torchvision.datasets.utils import check_integrity

    source = _SOURCES[settings.name]
    cls = _reader(source)
    if settings.download:
        _safe(cls)(settings.root, train=True, download=True)
    folder = os.path.join(settings.root, cls.base_folder)
    label_key = "labels" if cls.meta["key"] == "label_names" else "fine_labels"
    files = [(name, md5, label_key) for name, md5 in cls.train_list + cls.test_list]
    for name, md5, key in [*files, (cls.meta["filename"], cls.meta["md5"], None)]:
        path = os.path.join(folder, name)
        if settings.verify_checksums and not check_integrity(path, md5):
            raise DatasetMissingError(
                f"{source['label']} file {os.path.abspath(path)} fails its md5 check; "
                f"{_HOW_TO_GET}, or set dataset.verify_checksums=false for a non-official copy")
        read_batch(path, key)


def _reader(source: dict) -> type:
    """torchvision's reader class, imported only when a CIFAR dataset is read: importing
    torchvision costs seconds, which every launcher, refused job and spawned rank paid before."""
    import torchvision.datasets

    return getattr(torchvision.datasets, source["cls"])
