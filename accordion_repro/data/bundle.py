"""The one object every dataset builder returns, and the subset rule they all share.

Keeping the subset rule here means images and text cannot drift apart on what `subset: 0.1`
or `subset: 500` means, and every rank computes the same subset from the same seed.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any

import torch

from ..errors import ConfigError


@dataclass
class DataBundle:
    kind: str                      # "image" or "text"
    train: Any                     # image: map-style Dataset of (CHW float tensor, int label)
    test: Any                      # text: 1-D LongTensor of token ids (the eval split)
    num_classes: int | None        # image
    vocab_size: int | None         # text
    description: str               # one line for logs: name, sizes, subset


def validate_subset(subset) -> None:
    """Reject a subset value that can never be valid, before any file is read."""
    if subset is None:
        return
    if isinstance(subset, bool) or not isinstance(subset, numbers.Real):
        raise ConfigError("dataset.subset",
                          f"{subset!r} is neither null, a fraction in (0, 1] nor a count")
    if isinstance(subset, numbers.Integral):
        if subset < 1:
            raise ConfigError("dataset.subset", f"count {subset} must be at least 1")
        return
    if not 0.0 < float(subset) <= 1.0:
        raise ConfigError("dataset.subset",
                          f"fraction {subset} must lie in (0, 1]; write a count as an integer")


def subset_size(subset, total: int) -> int:
    """How many training examples (or tokens) a subset value keeps out of `total`."""
    validate_subset(subset)
    if subset is None:
        return total
    if isinstance(subset, numbers.Integral):
        if subset > total:
            raise ConfigError("dataset.subset",
                              f"count {subset} exceeds the {total} training examples available")
        return int(subset)
    return max(1, int(round(float(subset) * total)))


def seeded_subset_indices(total: int, keep: int, seed: int) -> torch.Tensor:
    """A random but seed-determined choice of `keep` indices, identical on every rank.

    Sorted so that the subset preserves the original order, which keeps the sampler's
    shuffled order a function of the seed alone.
    """
    if keep >= total:
        return torch.arange(total)
    generator = torch.Generator().manual_seed(int(seed))
    return torch.randperm(total, generator=generator)[:keep].sort().values


def describe_subset(subset, kept: int, total: int) -> str:
    if subset is None or kept == total:
        return "full"
    return f"subset {subset} -> {kept} of {total}"
