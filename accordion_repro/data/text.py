"""The bundle for token-stream datasets: a subset of text is a prefix of the training stream."""

from __future__ import annotations

import torch

from .bundle import DataBundle, describe_subset, subset_size


def text_bundle(name: str, train: torch.Tensor, test: torch.Tensor, *, vocab_size: int, subset,
                notes: str = "") -> DataBundle:
    total = len(train)
    kept = subset_size(subset, total)
    train = train[:kept]
    detail = f", {notes}" if notes else ""
    description = (f"{name}: {len(train)} train / {len(test)} eval tokens, vocabulary "
                   f"{vocab_size} ({describe_subset(subset, kept, total)}{detail})")
    return DataBundle(kind="text", train=train, test=test, num_classes=None,
                      vocab_size=vocab_size, description=description)
