"""Which levels a schedule may use, and which of two levels compresses more.

accordion/ knows no compressor object: it gets the kind of level the compressor takes (int
ranks, float kept fractions, or None) from comm/ through ScheduleContext, and rejects a schedule
that cannot work (a Top-K ratio given to PowerSGD, rank 1 inside critical regimes and rank 2
outside them) before any rank starts.
"""

from __future__ import annotations

from ..comm.config import check_level
from ..errors import ConfigError


def require_levels(schedule: str, compressor: str, kind: type | None) -> type:
    """Schedules that change the compression level need a compressor that has levels."""
    if kind is None:
        raise ConfigError("schedule.name",
                          f"schedule {schedule!r} changes the compression level, but compressor "
                          f"{compressor!r} has no levels; use compressor=powersgd or topk, or a "
                          "schedule that keeps compression fixed (static, batch_accordion)")
    return kind


def check_compresses_more(high, low, *, high_key: str, low_key: str) -> None:
    """`high` (outside critical regimes) may not send more than `low` (inside them).

    For both kinds a larger number sends more: a higher rank, a larger kept fraction.
    """
    if high > low:
        raise ConfigError(high_key, f"{high!r} compresses less than {low_key} = {low!r}; the "
                                    "high-compression level must send no more than the low one")


__all__ = ["check_level", "check_compresses_more", "require_levels"]
