"""The learning-rate schedule of the official code, per epoch.

The official CIFAR and LSTM code scales the LR linearly from `lr` to `lr * world_size` over the
warm-up epochs and divides it by 10 at each decay. It computes the LR of epoch e+1 at the end of
epoch e from `get_lr(e)`, so its warm-up lands one epoch late and its decays late too.
`official_off_by_one` reproduces that; the default applies each value in the epoch it is
scheduled for.

How late a decay lands depends on the comparison the official `get_lr(e)` makes with it, and the
two official scripts differ, so `optim.official_decay_compare` names it per decay ('>' or '>='):
- CIFAR (`e <= 150`, `150 < e <= 250`, `e > 250`): '>' for both, the decays land two epochs
  late (152 and 252 for 150 and 250). This is the default when the key is absent (sgd.yaml).
- LSTM (`e <= 60`, `60 < e < 80`, else): '>' then '>=', so the decays land at 62 and 81 for 60
  and 80 (conf/optim/lstm.yaml sets [">", ">="]). The setting is read only under the switch.

Decays given as fractions of the run are rounded to the nearest epoch. On a short run two of them
can round to the same epoch (3 epochs: 0.5 and 0.8333 both give epoch 2), which would divide the
LR by 100 at once; the later one moves to the next free epoch instead, or is dropped when that
epoch is past the run, with a warning either way. Epochs given as integers are never moved: two
that collide are a ConfigError.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Sequence

from accordion_repro.engine.settings import OptimSettings
from accordion_repro.errors import ConfigError, ConfigWarning
from accordion_repro.options import require_settings


def _decay_schedule(decay_at: Sequence[float | int], total_epochs: int) -> list[tuple[int, int]]:
    """(index in decay_at, epoch) of every decay kept, with strictly increasing epochs."""
    out: list[tuple[int, int]] = []
    last_asked = None  # the epoch the previous entry asked for, before any move
    for index, d in enumerate(decay_at or []):
        fraction = isinstance(d, float) and 0 < d < 1
        if fraction:
            epoch = int(round(d * total_epochs))
        elif isinstance(d, (int, float)) and float(d).is_integer() and d >= 1:
            epoch = int(d)
        else:
            raise ConfigError("optim.decay_at", f"entries must be epochs >= 1 or fractions in (0, 1), got {d!r}")
        if last_asked is not None and epoch < last_asked:
            raise ConfigError("optim.decay_at", f"must be increasing, got {list(decay_at)}")
        last_asked = epoch
        if out and epoch <= out[-1][1]:
            taken = out[-1][1]
            if not fraction:
                raise ConfigError("optim.decay_at", f"{d!r} collides with the decay at epoch {taken} "
                                  f"(from {decay_at[out[-1][0]]!r}); decays must be distinct epochs")
            dropped = taken + 1 >= total_epochs
            outcome = (f", and epoch {taken + 1} is past the run: this decay is dropped" if dropped
                       else f": it is moved to epoch {taken + 1}")
            warnings.warn(f"optim.decay_at: {d!r} of a {total_epochs}-epoch run rounds to epoch "
                          f"{epoch}, where the decay from {decay_at[out[-1][0]]!r} already is"
                          f"{outcome}", ConfigWarning, stacklevel=3)
            if dropped:
                continue
            epoch = taken + 1
        out.append((index, epoch))
    return out


def decay_epochs(decay_at: Sequence[float | int], total_epochs: int) -> list[int]:
    """Decay epochs as integers: floats below 1 are fractions of the run's length."""
    return [epoch for _, epoch in _decay_schedule(decay_at, total_epochs)]


@dataclass(frozen=True)
class EpochLR:
    """LR of every epoch: base -> peak over warm-up, times decay_factor per passed decay."""

    base_lr: float              # lr * batch_size / reference_batch: the LR of one worker
    peak_factor: float          # world_size: the warm-up ends at base_lr * world_size
    warmup_epochs: float
    decays: tuple[int, ...]
    decay_factor: float
    official_off_by_one: bool = False
    # per decay, True where the official get_lr(e) counts it as passed at e >= decay (not e > decay)
    official_inclusive: tuple[bool, ...] = ()

    def _warmup_factor(self, epoch: float) -> float:
        if self.warmup_epochs <= 0:
            return self.peak_factor
        progress = min(max(epoch, 0.0) / self.warmup_epochs, 1.0)
        return 1.0 + (self.peak_factor - 1.0) * progress

    def __call__(self, epoch: int) -> float:
        inclusive = (True,) * len(self.decays)
        if self.official_off_by_one:
            if epoch == 0:
                return self.base_lr
            epoch -= 1  # the official get_lr(e - 1) runs at the end of epoch e - 1
            inclusive = self.official_inclusive or (False,) * len(self.decays)
        passed = sum(epoch >= d if inc else epoch > d for d, inc in zip(self.decays, inclusive))
        return self.base_lr * self._warmup_factor(epoch) * self.decay_factor**passed


def _official_inclusive(optim: OptimSettings, schedule: list[tuple[int, int]]) -> tuple[bool, ...]:
    """optim.official_decay_compare as one flag per kept decay (absent: '>' for every decay)."""
    if optim.official_decay_compare is None:
        return ()
    compare = list(optim.official_decay_compare)
    decay_at = list(optim.decay_at or [])
    if len(compare) != len(decay_at) or any(op not in (">", ">=") for op in compare):
        raise ConfigError("optim.official_decay_compare",
                          f"needs one '>' or '>=' per entry of optim.decay_at {decay_at}, got {compare}")
    return tuple(compare[index] == ">=" for index, _ in schedule)


def build_epoch_lr(optim, *, total_epochs: int, world_size: int, batch_size: int) -> EpochLR:
    require_settings(optim, OptimSettings, "build_epoch_lr", "RunSettings.optim")
    schedule = _decay_schedule(optim.decay_at, total_epochs)
    official = bool(optim.official_off_by_one)
    return EpochLR(
        base_lr=optim.lr * batch_size / optim.reference_batch,
        peak_factor=float(world_size),
        warmup_epochs=optim.warmup_epochs,
        decays=tuple(epoch for _, epoch in schedule),
        decay_factor=optim.decay_factor,
        official_off_by_one=official,
        official_inclusive=_official_inclusive(optim, schedule) if official else (),
    )
