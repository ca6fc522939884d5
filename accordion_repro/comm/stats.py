"""Per-step communication accounting shared by every reducer."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class CommStats:
    """What one worker communicated in one step.

    `floats_sent` follows the paper's convention (facts section 8) so totals are comparable
    with the released logs; `bytes_sent` is what really went into collectives here (0 when the
    run has no process group), so the two can legitimately differ (Top-K indices are int32,
    the all-gather output is not counted, a single worker sends nothing). The all-gathers'
    share is kept apart because a ring all-gather and a ring all-reduce of the same buffer
    cost differently (the network cost model needs each).
    """

    floats_sent: int = 0
    bytes_sent: int = 0
    collectives: int = 0
    allgather_bytes: int = 0  # of bytes_sent, what went into all-gathers
    allgathers: int = 0       # of collectives, how many were all-gathers
    # compressible layers sent uncompressed because their level cannot compress them (a
    # PowerSGD rank >= min(n, m), a Top-K fraction that keeps every entry), summed over steps
    uncompressed_layers: int = 0
    # FSDP path only: the bytes FSDP's own reduce-scatter would have sent in the same steps
    # (its flat input), the baseline bytes_sent compares with; 0 on the DDP and trainer paths
    fsdp_reduce_scatter_bytes: int = 0

    def __add__(self, other: "CommStats") -> "CommStats":
        return CommStats(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))
