"""Accordion's critical-regime detector (Algorithm 1 of the paper, as the official code runs it).

Rank 0 adds its local, uncompressed gradients into per-layer epoch sums every step. At the end
of an epoch whose number is a multiple of `interval`, the norm of each sum is compared with the
norm `interval` epochs earlier; a relative change of at least `eta` marks the layer critical
(low compression / small batch). Before a learning-rate decay every layer is sent to critical.
The flags returned at the end of epoch e hold from epoch e + 1 until the next decision.
See docs/schedules.md for the exact convention and where it follows the official code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..options import Options, Settings, option
from ..options import require_settings

STATISTICS = ("mean", "sum")
GRANULARITIES = ("layer", "model", "layer+model")


@dataclass(frozen=True)
class DetectorSettings(Settings):
    """The detector's options, as every detector-driven schedule takes them (`schedule.*`).

    The defaults are the paper's (facts section 2); conf/ repeats none of them. `interval` is 10
    for CIFAR and 5 for the LSTM in the paper: conf ties it to `scale.detector_interval`.
    """

    SECTION = "schedule"
    eta: float = option(
        Options.number, default=0.5, on_resume="changeable",
        help="a layer is critical when its epoch-gradient norm changed by at least this share: "
             "|prev - cur| / prev >= eta")
    interval: int = option(
        Options.integer, default=10, on_resume="changeable",
        help="epochs between two checks of the detector")
    lr_decay_rule: bool = option(
        Options.flag, default=True, on_resume="changeable",
        help="send every layer to critical before a learning-rate decay")
    statistic: str = option(
        Options.choice, STATISTICS, default="mean", on_resume="changeable",
        help="the norm of the mean step gradient (mean) or of the epoch sum (sum, the official "
             "code's)")


class CriticalRegimeDetector:
    """Maps per-layer epoch-gradient norms and the LR schedule to "critical or not".

    `granularity` chooses the decision units: "layer" (one flag per layer, the paper's rule for
    compression), "model" (one flag from the norm of the whole model's gradient, used to pick one
    batch size) or "layer+model" (the per-layer flags followed by the model flag, for the joint
    schedule). `statistic` is what the norm is taken of: "sum" is the official epoch sum, "mean"
    divides it by the number of steps in the epoch; the two give identical ratios while the
    number of steps per epoch is constant, and only "mean" stays meaningful when a batch-size
    schedule changes it.
    """

    def __init__(self, num_layers: int, *, granularity: str = "layer",
                 settings: DetectorSettings | None = None, **options):
        """`options`: any of DetectorSettings' options (eta, interval, lr_decay_rule,
        statistic); or `settings`, already checked (a schedule's, which holds them)."""
        if num_layers < 0:
            raise ValueError(f"num_layers must be >= 0, got {num_layers}")
        if granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
        if settings is None:
            s = DetectorSettings.from_config(options, owner="the detector")
        elif options:
            raise TypeError("CriticalRegimeDetector takes settings= or keywords, not both")
        else:
            s = require_settings(settings, DetectorSettings, "CriticalRegimeDetector",
                                 "a schedule's settings, or the options as keywords")
        self.num_layers = int(num_layers)
        self.eta, self.interval = s.eta, s.interval
        self.lr_decay_rule, self.statistic = s.lr_decay_rule, s.statistic
        self.granularity = granularity
        self._sums: list[torch.Tensor] | None = None
        self._fused = False
        self._needs_placement = False
        self._steps = 0
        self._flags = [True] * self.num_units          # epoch 0: every unit at low compression
        self._reference: list[float] | None = None     # unit norms at the last check epoch
        self._reference_epoch: int | None = None
        self.report: dict = {}

    @property
    def num_units(self) -> int:
        """How many flags end_epoch returns."""
        return {"layer": self.num_layers, "model": 1,
                "layer+model": self.num_layers + 1}[self.granularity]

    @property
    def critical(self) -> list[bool]:
        """The flags in force now (from the last decision, or the initial all-critical)."""
        return list(self._flags)

    # ---- every step -----------------------------------------------------------------------
    def accumulate(self, grads: Sequence[torch.Tensor]) -> None:
        """Add one step's local gradients to the epoch sums: in-place adds, no synchronisation."""
        if len(grads) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} gradients, got {len(grads)}")
        if self._sums is None:
            self._sums = [torch.zeros_like(g, dtype=_sum_dtype(g.dtype)) for g in grads]
            self._fused = _can_fuse(self._sums, grads)
        elif self._needs_placement:
            self._place_like(grads)
        if self._fused:
            torch._foreach_add_(self._sums, list(grads))
        else:
            for total, grad in zip(self._sums, grads):
                total.add_(grad)
        self._steps += 1

    # ---- every step, in parts (DDP buckets) ----------------------------------------------
    def prepare(self, like: Sequence[torch.Tensor]) -> None:
        """Allocate the epoch sums for tensors shaped like `like` (one per layer), so that a
        step can then be added in parts with accumulate_layers; a restored sum is kept."""
        if len(like) != self.num_layers:
            raise ValueError(f"expected {self.num_layers} tensors, got {len(like)}")
        if self._sums is None:
            self._sums = [torch.zeros(t.shape, dtype=_sum_dtype(t.dtype), device=t.device)
                          for t in like]
        elif self._needs_placement:
            self._place_like(like)

    def accumulate_layers(self, layers: Sequence[int], grads: Sequence[torch.Tensor]) -> None:
        """Add the local gradients of some layers (grads[j] is layer layers[j]) to the epoch sums
        without counting a step: a DDP hook adds each bucket before it is reduced, then calls
        end_step() once. The same in-place adds as accumulate, so the sums are bit for bit alike."""
        if self._sums is None:
            raise RuntimeError("call prepare(tensors) before accumulate_layers")
        if len(layers) != len(grads):
            raise ValueError(f"{len(layers)} layers but {len(grads)} gradients")
        sums = [self._sums[layer] for layer in layers]
        if _can_fuse(sums, grads):
            torch._foreach_add_(sums, list(grads))
        else:
            for total, grad in zip(sums, grads):
                total.add_(grad.to(total.device))

    def end_step(self) -> None:
        """One step of accumulate_layers is complete (the mean statistic divides by steps)."""
        self._steps += 1

    def _place_like(self, grads: Sequence[torch.Tensor]) -> None:
        """After a restore the sums may sit on another device (checkpoints load on the CPU)."""
        self._sums = [s.to(g.device) for s, g in zip(self._sums, grads)]
        self._fused = _can_fuse(self._sums, grads)
        self._needs_placement = False

    def epoch_sums(self) -> list[torch.Tensor] | None:
        """This epoch's per-layer sums so far (live tensors, read-only for callers; None before
        the first step): L-GreCo measures its error table on them (accordion/lgreco.py)."""
        return self._sums

    # ---- end of epoch ---------------------------------------------------------------------
    def end_epoch(self, epoch: int, lr_now: float, lr_next: float) -> list[bool]:
        """Decide the flags that hold from epoch + 1 on, and start a new epoch sum.

        `lr_now` is the LR used during `epoch`, `lr_next` the scheduled LR of epoch + 1.
        """
        norms = self._unit_norms()
        checked = epoch % self.interval == 0
        ratios, compared_with = None, None
        if checked:
            compared_with = self._reference_epoch
            ratios, self._flags = self._compare(norms)
            self._reference, self._reference_epoch = norms, epoch
        lr_rule_fired = self.lr_decay_rule and lr_next < lr_now
        if lr_rule_fired:
            self._flags = [True] * self.num_units
        self.report = {
            "epoch": int(epoch),
            "checked": checked,
            "granularity": self.granularity,
            "statistic": self.statistic,
            "steps": self._steps,
            "norms": norms,
            "ratios": ratios,
            "compared_with_epoch": compared_with,
            "lr_rule_fired": lr_rule_fired,
            "critical": list(self._flags),
        }
        self._reset_sums()
        return list(self._flags)

    def _compare(self, norms: list[float]) -> tuple[list[float | None] | None, list[bool]]:
        """Ratios and flags at a check epoch; with nothing to compare with, everything is critical."""
        if self._reference is None:
            return None, [True] * self.num_units
        ratios: list[float | None] = []
        flags: list[bool] = []
        for prev, cur in zip(self._reference, norms):
            if prev == 0.0:
                ratios.append(None)  # the official code records 9 here; JSON has no infinity
                flags.append(True)
            else:
                ratio = abs(prev - cur) / prev
                ratios.append(ratio)
                flags.append(ratio >= self.eta)
        return ratios, flags

    def _unit_norms(self) -> list[float]:
        """One host transfer for all norms; the model norm is the root of the summed squares."""
        if self._sums is None or not self._sums:
            layer = [0.0] * self.num_layers
        else:
            stacked = torch.stack([torch.linalg.vector_norm(s, dtype=torch.float64) for s in self._sums])
            layer = stacked.cpu().tolist()
        if self.statistic == "mean":
            divisor = max(self._steps, 1)
            layer = [n / divisor for n in layer]
        model = math.sqrt(sum(n * n for n in layer))
        return {"layer": layer, "model": [model], "layer+model": layer + [model]}[self.granularity]

    def _reset_sums(self) -> None:
        if self._sums is not None:
            for total in self._sums:
                total.zero_()
        self._steps = 0

    # ---- checkpointing --------------------------------------------------------------------
    def _settings(self) -> dict:
        return {"num_layers": self.num_layers, "eta": self.eta, "interval": self.interval,
                "lr_decay_rule": self.lr_decay_rule, "statistic": self.statistic,
                "granularity": self.granularity}

    def state_dict(self) -> dict:
        return {
            "settings": self._settings(),
            "sums": None if self._sums is None else [s.detach().clone() for s in self._sums],
            "steps": self._steps,
            "flags": list(self._flags),
            "reference": None if self._reference is None else list(self._reference),
            "reference_epoch": self._reference_epoch,
            "report": dict(self.report),
        }

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        """`strict=False` (a resume the user allowed to change the config) accepts new
        thresholds and intervals over the same layers; the history is kept as it is."""
        mine, theirs = self._settings(), state["settings"]
        shape_keys = ("num_layers", "granularity")
        differs = [k for k in mine if mine[k] != theirs.get(k)]
        if differs and (strict or any(k in shape_keys for k in differs)):
            raise ValueError(f"detector settings differ from the checkpoint: {mine} vs {theirs}")
        sums = state["sums"]
        self._sums = None if sums is None else [s.clone() for s in sums]
        self._fused = False
        self._needs_placement = self._sums is not None
        self._steps = int(state["steps"])
        self._flags = list(state["flags"])
        self._reference = None if state["reference"] is None else list(state["reference"])
        self._reference_epoch = state["reference_epoch"]
        self.report = dict(state["report"])


def _sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """Half-precision gradients are summed in float32 so an epoch of them does not overflow."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _can_fuse(sums: Sequence[torch.Tensor], grads: Sequence[torch.Tensor]) -> bool:
    return all(s.dtype == g.dtype and s.device == g.device for s, g in zip(sums, grads))
