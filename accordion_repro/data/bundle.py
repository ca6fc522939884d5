"""The one object every dataset builder returns, and the subset rule they all share.

Keeping the subset rule here means images and text cannot drift apart on what `subset: 0.1`
or `subset: 500` means, and every rank computes the same subset from the same seed.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Subset

from ..errors import ConfigError


@dataclass
class DataBundle:
    kind: str                      # "image" or "text"
    train: Any                     # image: map-style Dataset of (CHW float tensor, int label)
    test: Any                      # text: 1-D LongTensor of token ids (the eval split)
    num_classes: int | None        # image
    vocab_size: int | None         # text
    description: str               # one line for logs: name, sizes, subset


def subset_size(subset, total: int) -> int:
    """How many training examples (or tokens) a subset value (checked by data/settings.py)
    keeps out of `total`."""
    if subset is None:
        return total
    if isinstance(subset, numbers.Integral):
        if subset > total:
            raise ConfigError("dataset.subset",
                              f"count {subset} exceeds the {total} training examples available")
        return int(subset)
    return max(1, int(round(float(subset) * total)))


def make_bundle(settings, train, test, *, name: str | None = None, seed: int = 0,
                num_classes: int | None = None, vocab_size: int | None = None,
                notes: str = "") -> DataBundle:
    """Apply `settings.subset` and write the one-line description.

    Images (`num_classes` given) keep a random but seed-determined choice of examples,
    identical on every rank and sorted so that the subset preserves the original order, which
    keeps the sampler's shuffled order a function of the seed alone. Text (`vocab_size`
    given) keeps a prefix of the training stream.
    """
    subset, total = settings.subset, len(train)
    kept = subset_size(subset, total)
    if vocab_size is None:
        if kept < total:
            order = torch.randperm(total, generator=torch.Generator().manual_seed(int(seed)))
            train = Subset(train, order[:kept].sort().values.tolist())
        augment = "augment on" if settings.augment else "augment off"
        notes = f"{notes}, {augment}" if notes else augment
        kind, sizes = "image", f"test images, {num_classes} classes"
    else:
        kind, sizes, train = "text", f"eval tokens, vocabulary {vocab_size}", train[:kept]
    portion = "full" if subset is None or kept == total else f"subset {subset} -> {kept} of {total}"
    detail = f", {notes}" if notes else ""
    return DataBundle(kind, train, test, num_classes, vocab_size,
                      f"{name or settings.name}: {len(train)} train / {len(test)} {sizes} "
                      f"({portion}{detail})")
