"""What a schedule tells the engine, and the compact form of per-layer levels for metrics."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Plan:
    """What holds from the next epoch on (or from epoch 0 for the initial plan)."""

    levels: list | None         # per compressible layer (rank: int, ratio: float); None = default
    global_batch: int | None    # None = the trainer's own global batch
    lr_scale: float = 1.0       # multiplies the scheduled LR

    def to_dict(self) -> dict:
        """Plain, JSON- and broadcast-ready form (lists copied, so the plan cannot be aliased)."""
        return {"levels": None if self.levels is None else list(self.levels),
                "global_batch": self.global_batch, "lr_scale": float(self.lr_scale)}

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        levels = data["levels"]
        return cls(levels=None if levels is None else list(levels),
                   global_batch=data["global_batch"], lr_scale=float(data["lr_scale"]))


def level_key(level) -> str:
    """How one level is spelled as a JSON key: 2 -> "2", 0.99 -> "0.99", None -> "none"."""
    return "none" if level is None else str(level)


def compact_levels(levels: Sequence) -> dict[str, int]:
    """How many layers sit at each level, most communication first: {"2": 20, "1": 1}."""
    counts = Counter(levels)
    ordered = sorted(counts, key=lambda lv: (lv is None, -(lv if lv is not None else 0)))
    return {level_key(lv): counts[lv] for lv in ordered}
