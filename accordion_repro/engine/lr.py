"""The learning-rate schedule of the official code, per epoch.

The official CIFAR and LSTM code scales the LR linearly from `lr` to `lr * world_size` over the
warm-up epochs and divides it by 10 at each decay. It computes the LR of epoch e+1 at the end of
epoch e from `get_lr(e)` with `epoch > decay` comparisons, so its decays take effect two epochs
late (152 and 252 for decays at 150 and 250) and its warm-up one epoch late. `official_off_by_one`
reproduces that; the default applies each value in the epoch it is scheduled for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from accordion_repro.errors import ConfigError


def decay_epochs(decay_at: Sequence[float | int], total_epochs: int) -> list[int]:
    """Decay epochs as integers: floats below 1 are fractions of the run's length."""
    out = []
    for d in decay_at or []:
        if isinstance(d, float) and 0 < d < 1:
            out.append(int(round(d * total_epochs)))
        elif isinstance(d, (int, float)) and float(d).is_integer() and d >= 1:
            out.append(int(d))
        else:
            raise ConfigError("optim.decay_at", f"entries must be epochs >= 1 or fractions in (0, 1), got {d!r}")
    if out != sorted(out):
        raise ConfigError("optim.decay_at", f"must be increasing, got {list(decay_at)}")
    return out


@dataclass(frozen=True)
class EpochLR:
    """LR of every epoch: base -> peak over warm-up, times decay_factor per passed decay."""

    base_lr: float              # lr * batch_size / reference_batch: the LR of one worker
    peak_factor: float          # world_size: the warm-up ends at base_lr * world_size
    warmup_epochs: float
    decays: tuple[int, ...]
    decay_factor: float
    official_off_by_one: bool = False

    def _warmup_factor(self, epoch: float) -> float:
        if self.warmup_epochs <= 0:
            return self.peak_factor
        progress = min(max(epoch, 0.0) / self.warmup_epochs, 1.0)
        return 1.0 + (self.peak_factor - 1.0) * progress

    def __call__(self, epoch: int) -> float:
        if self.official_off_by_one:
            if epoch == 0:
                return self.base_lr
            prev = epoch - 1  # the official get_lr(prev) runs at the end of epoch prev
            passed = sum(prev > d for d in self.decays)
            return self.base_lr * self._warmup_factor(prev) * self.decay_factor**passed
        passed = sum(epoch >= d for d in self.decays)
        return self.base_lr * self._warmup_factor(epoch) * self.decay_factor**passed


def build_epoch_lr(optim_cfg, *, total_epochs: int, world_size: int, batch_size: int) -> EpochLR:
    return EpochLR(
        base_lr=float(optim_cfg["lr"]) * batch_size / float(optim_cfg["reference_batch"]),
        peak_factor=float(world_size),
        warmup_epochs=float(optim_cfg["warmup_epochs"]),
        decays=tuple(decay_epochs(optim_cfg["decay_at"], total_epochs)),
        decay_factor=float(optim_cfg["decay_factor"]),
        official_off_by_one=bool(optim_cfg["official_off_by_one"]),
    )
