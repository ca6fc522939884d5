"""Image datasets from .npz files: raw uint8 arrays or JPEG byte streams, one file or several.

A file holds either `x_train`/`x_test` (N, 32, 32, 3) uint8 arrays, or the JPEG variant
`train_jpeg`/`train_offsets` and `test_jpeg`/`test_offsets` (image i is the byte range
offsets[i]:offsets[i+1]), with labels in `y_train`/`y_test` (or `*_fine` for CIFAR-100 files).

Several files are joined: train parts are concatenated; test parts are concatenated but an
image whose `test_index` (its index in the original test set, -1 when unknown) was already
seen in an earlier file is dropped, so overlapping samples of one test set are counted once.

JPEGs are decoded once per file and machine: the decoded arrays go to an on-disk cache
(decode_cache.py; `dataset.cache_dir` or $ACCORDION_CACHE_DIR moves it) that the launcher fills
before any rank starts, and are kept per file for the life of the process.
"""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image

from ..errors import ConfigError, DatasetMissingError
from .bundle import DataBundle, make_bundle
from .decode_cache import cached_decode
from .images import ArrayImageDataset, image_transforms
from .settings import NpzSettings

_DECODED: dict[tuple, dict[str, np.ndarray]] = {}


def check(settings: NpzSettings) -> None:
    for path in settings.path:
        if not os.path.isfile(path):
            raise DatasetMissingError(
                f"npz dataset file not found: {os.path.abspath(path)} (dataset.path); put it "
                f"there, or point paths.data_dir (or dataset.path) at the folder that has it: "
                f"an .npz with x_train/y_train/x_test/y_test or train_jpeg/train_offsets; the "
                f"whole CIFAR-10 as JPEGs is built by scripts/build_cifar10_jpeg_npz.py from "
                f"its public source (docs/data.md)")


def decode_jpegs(blob: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Decode a concatenated JPEG byte stream into a uint8 (N, H, W, 3) array."""
    data = blob.tobytes()
    images = []
    for i in range(len(offsets) - 1):
        try:
            images.append(np.asarray(Image.open(io.BytesIO(data[offsets[i]:offsets[i + 1]]))
                                     .convert("RGB")))
        except Exception as exc:
            raise ConfigError("dataset.path", f"JPEG {i} (bytes {offsets[i]}:{offsets[i + 1]}) "
                                              f"cannot be decoded ({exc})") from None
    return np.stack(images) if images else np.zeros((0, 32, 32, 3), np.uint8)


def _split(arrays, split: str, path: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(images, labels, original test indices or -1) of one split of one file."""
    if f"x_{split}" in arrays:
        images = arrays[f"x_{split}"]
    elif f"{split}_jpeg" in arrays and f"{split}_offsets" in arrays:
        images = decode_jpegs(arrays[f"{split}_jpeg"], arrays[f"{split}_offsets"])
    else:
        raise ConfigError("dataset.path", f"{path} has neither x_{split} nor "
                                          f"{split}_jpeg/{split}_offsets")
    label_key = next((k for k in (f"y_{split}", f"y_{split}_fine") if k in arrays), None)
    if label_key is None:
        raise ConfigError("dataset.path", f"{path} has no y_{split} labels")
    labels = np.asarray(arrays[label_key], dtype=np.int64)
    if images.dtype != np.uint8 or images.ndim != 4 or images.shape[1:] != (32, 32, 3):
        raise ConfigError("dataset.path", f"{path}: {split} images must be uint8 (N, 32, 32, 3),"
                                          f" got {images.dtype} {images.shape}")
    if len(labels) != len(images):
        raise ConfigError("dataset.path",
                          f"{path}: {len(images)} {split} images but {len(labels)} labels")
    index_key = f"{split}_index"
    original = (np.asarray(arrays[index_key], dtype=np.int64) if index_key in arrays
                else np.full(len(images), -1, np.int64))
    return images, labels, original


def _read_npz(path: str, read):
    """read(opened npz); ConfigError naming dataset.path when the file is not a readable npz."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            return read(npz)
    except Exception as exc:  # BadZipFile, truncated members, pickled objects, ...
        raise ConfigError("dataset.path", f"{path} cannot be read as an .npz "
                                          f"({type(exc).__name__}: {exc})") from None


def _decode_file(path: str) -> dict[str, np.ndarray]:
    arrays = _read_npz(path, lambda npz: {name: npz[name] for name in npz.files})
    loaded = {}
    for split in ("train", "test"):
        images, labels, original = _split(arrays, split, path)
        loaded.update({f"x_{split}": images, f"y_{split}": labels, f"{split}_index": original})
    return loaded


def _has_jpegs(path: str) -> bool:
    return _read_npz(path, lambda npz: any(name.endswith("_jpeg") for name in npz.files))


def load_file(path: str, cache_dir: str | None = None) -> dict[str, np.ndarray]:
    """Both splits of one file, decoded; JPEG files through the on-disk decode cache."""
    stat = os.stat(path)
    key = (os.path.realpath(path), stat.st_size, stat.st_mtime_ns, cache_dir)
    if key not in _DECODED:
        _DECODED[key] = (cached_decode(path, lambda: _decode_file(path), cache_dir)
                         if _has_jpegs(path) else _decode_file(path))
    return _DECODED[key]


def prepare(settings: NpzSettings) -> None:
    """Before the ranks start: read (and decode into the cache) every file and check its
    contents, so a damaged or mis-shaped file is one error line, not a traceback per rank.
    The launching process keeps none of the arrays: the ranks load them from the cache."""
    _load_checked(settings)
    _DECODED.clear()


def join_files(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate train parts; concatenate test parts, keeping each original test index once."""
    seen: set[int] = set()
    keep = []
    for part in parts:
        original = part["test_index"].tolist()
        keep.append(np.array([i < 0 or i not in seen for i in original], dtype=bool))
        seen.update(i for i in original if i >= 0)
    joined = {key: np.concatenate([p[key] for p in parts]) for key in ("x_train", "y_train")}
    return joined | {key: np.concatenate([p[key][k] for p, k in zip(parts, keep)])
                     for key in ("x_test", "y_test")}


def _load_checked(settings: NpzSettings) -> tuple[dict[str, np.ndarray], int]:
    check(settings)
    paths, num_classes = list(settings.path), settings.num_classes
    joined = join_files([load_file(p, settings.cache_dir) for p in paths])
    for split in ("train", "test"):
        labels = joined[f"y_{split}"]
        if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
            raise ConfigError("dataset.num_classes",
                              f"the {split} split of {paths} has labels in [{labels.min()}, "
                              f"{labels.max()}] but num_classes is {num_classes}")
    return joined, num_classes


def build(settings: NpzSettings, seed: int) -> DataBundle:
    joined, num_classes = _load_checked(settings)
    train_tf, test_tf = image_transforms(settings)
    train = ArrayImageDataset(joined["x_train"], joined["y_train"], train_tf)
    test = ArrayImageDataset(joined["x_test"], joined["y_test"], test_tf)
    files = ", ".join(os.path.basename(p) for p in settings.path)
    return make_bundle(settings, train, test, name=f"npz[{files}]", seed=seed,
                       num_classes=num_classes)
