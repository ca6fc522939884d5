"""Global batch sizes of the batch-size schedules and the LR scaling that goes with them."""

from __future__ import annotations

import math

from ..errors import ConfigError
from ..options import is_int

LR_SCALINGS = ("linear", "sqrt", "none")


def check_global_batch(value, key: str, world_size: int) -> int:
    """A global batch must split evenly into one per-worker batch per rank."""
    if not is_int(value) or value < 1:
        raise ConfigError(key, f"a global batch must be an integer >= 1, got {value!r}")
    if value % world_size != 0:
        raise ConfigError(key, f"global batch {value} does not divide across {world_size} "
                               f"workers (per-worker batch {value / world_size:g})")
    return int(value)


def check_batch_order(low: int, high: int, *, low_key: str, high_key: str) -> None:
    if high < low:
        raise ConfigError(high_key, f"B_high = {high} is smaller than {low_key} = {low}; the "
                                    "batch outside critical regimes must be at least as large")


def lr_scale_for(batch: int, batch_low: int, rule: str) -> float:
    """LR multiplier at global batch `batch`, relative to the LR scheduled for B_low."""
    if rule == "linear":
        return batch / batch_low
    if rule == "sqrt":
        return math.sqrt(batch / batch_low)
    if rule == "none":
        return 1.0
    raise ValueError(f"unknown lr scaling {rule!r}; choose one of {LR_SCALINGS}")
