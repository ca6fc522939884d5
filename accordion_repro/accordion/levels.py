"""Which levels a compressor takes, and which of two levels compresses more.

accordion/ knows no compressor object; it only needs the kind of a level to reject a schedule
that cannot work (a Top-K ratio given to PowerSGD, rank 1 inside critical regimes and rank 2
outside them) before any rank starts. The kinds mirror comm's `level_kind`.
"""

from __future__ import annotations

from ..errors import ConfigError
from .options import is_int, is_real

# compressor name -> what one level is: a PowerSGD rank or a Top-K kept fraction
_LEVEL_KINDS = {"none": None, "powersgd": "rank", "topk": "ratio"}


def level_kind(compressor: str) -> str | None:
    if compressor not in _LEVEL_KINDS:
        known = ", ".join(sorted(_LEVEL_KINDS))
        raise ConfigError("compressor.name", f"unknown compressor {compressor!r} ({known})")
    return _LEVEL_KINDS[compressor]


def require_compressor(schedule: str, compressor: str) -> str:
    """Schedules that change the compression level need a compressor that has levels."""
    kind = level_kind(compressor)
    if kind is None:
        raise ConfigError("schedule.name",
                          f"schedule {schedule!r} changes the compression level, but compressor "
                          f"{compressor!r} has no levels; use compressor=powersgd or topk, or a "
                          "schedule that keeps compression fixed (static, batch_accordion)")
    return kind


def check_level(kind: str, value, key: str) -> int | float:
    """A rank is an int >= 1; a Top-K ratio a number in (0, 1] (returned as float)."""
    if kind == "rank":
        if not is_int(value) or value < 1:
            raise ConfigError(key, f"a PowerSGD rank must be an integer >= 1, got {value!r}")
        return int(value)
    if not is_real(value) or not 0.0 < float(value) <= 1.0:
        raise ConfigError(key, f"a Top-K ratio must be a number in (0, 1], got {value!r}")
    return float(value)


def check_compresses_more(high, low, *, high_key: str, low_key: str) -> None:
    """`high` (outside critical regimes) may not send more than `low` (inside them).

    For both kinds a larger number sends more: a higher rank, a larger kept fraction.
    """
    if high > low:
        raise ConfigError(high_key, f"{high!r} compresses less than {low_key} = {low!r}; the "
                                    "high-compression level must send no more than the low one")
