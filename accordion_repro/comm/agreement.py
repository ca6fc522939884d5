"""Check that every rank compresses at the same levels before any compressed collective runs.

Ranks whose levels differ would hand collectives of different sizes to the backend, which fails
deep inside gloo ("Received data size doesn't match expected size"), hangs, or, when the sizes
happen to agree, silently averages unrelated numbers. One tiny all-reduce per step (the largest
and smallest fingerprint of the levels) turns that into a one-line error on every rank.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence

import torch

from .collectives import Communicator


class LevelMismatchError(RuntimeError):
    """Ranks hold different compression levels (each rank raises it, in one line)."""


def fingerprint(compressor: str, levels: Sequence) -> int:
    """The same number on every process for the same levels (Python's hash() is salted)."""
    return zlib.crc32(repr((compressor, [None if lv is None else float(lv) for lv in levels]))
                      .encode())


def describe(levels: Sequence) -> str:
    """'21 layers: 20 at 2, 1 at 1' (most layers first)."""
    counts = Counter(levels).most_common()
    return f"{len(levels)} layers: " + ", ".join(f"{n} at {lv}" for lv, n in counts)


class LevelAgreement:
    """Caches the fingerprint of the levels in force; `check` compares it across ranks."""

    def __init__(self, compressor: str, comm: Communicator, device: torch.device):
        self.compressor, self.comm, self.device = compressor, comm, device
        self._levels: tuple | None = None
        self._fingerprint = 0

    def check(self, levels: Sequence) -> None:
        levels = tuple(levels)
        if levels != self._levels:
            self._levels, self._fingerprint = levels, fingerprint(self.compressor, levels)
        largest, smallest = self.comm.max_and_min(self._fingerprint, self.device)
        if largest != smallest:
            raise LevelMismatchError(
                f"compression levels differ between ranks (rank {self.comm.rank} has "
                f"{describe(levels)}); every rank must apply the same levels: Accordion.end_epoch "
                "broadcasts rank 0's decision, set_levels must be called alike on every rank")
