"""Mixed precision for the trainer: autocast for the forward pass, a loss scale for fp16.

Only the model's forward and loss run in reduced precision; gradients stay in the parameters'
dtype (float32), so compression, error memory and the detector's norms are float32 as in fp32
runs. fp16 gradients underflow without a loss scale: the loss is multiplied by `scale` before
backward and the gradients divided by it after; a step whose gradients overflowed on any rank is
skipped on every rank (the ranks agree, or their compressed collectives would mix inf with
numbers) and the scale halves; after `growth_interval` clean steps it doubles (torch's
GradScaler rule). bf16 has float32's range and needs no scale.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Sequence

import torch

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def cpu_bf16_is_emulated() -> bool:
    """True where this CPU has no native bf16 (no AVX512-BF16 or AMX, as oneDNN reports it).

    There autocast's bf16 convolutions are emulated and run far slower than fp32: ResNet-18 at
    a quarter width, one 64-image step on one thread of an AVX2 CPU, took 11.3 s in bf16 with
    channels_last against 1.4 s in fp32 (docs/reproduce.md). `scale=cpu_long` chose bf16 on an
    AVX512 CPU where it was 1.7-1.8x faster. torch.ops.mkldnn._is_mkldnn_bf16_supported is
    private; where it is missing nothing is claimed (False).
    """
    try:
        return not bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


EMULATED_BF16 = ("trainer.precision=bf16 on a CPU without native bf16 (oneDNN reports none; "
                 "capability {capability}): autocast emulates it, about 8x slower than fp32 "
                 "for ResNet-18 here (docs/reproduce.md); trainer.precision=fp32 is faster on "
                 "this CPU but a different configuration from a bf16 run's")


def autocast(device: torch.device, precision: str):
    """The forward pass's context: autocast to the precision's dtype (nothing for fp32)."""
    dtype = DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


class LossScaler:
    """fp16's dynamic loss scale, agreed over ranks."""

    def __init__(self, scale: float = 2.0 ** 16, growth_interval: int = 2000):
        self.scale, self.growth_interval, self.clean_steps = float(scale), growth_interval, 0

    def scaled(self, loss: torch.Tensor) -> torch.Tensor:
        return loss * self.scale

    def unscale(self, grads: Sequence[torch.Tensor], any_rank: Callable[[int], int]) -> bool:
        """Divide the gradients by the scale; True when this step must be skipped (a gradient
        overflowed on some rank). One host sync per step, fp16 runs only."""
        finite = torch.stack([torch.isfinite(g).all() for g in grads]).all()
        overflow = bool(any_rank(0 if bool(finite) else 1))
        if overflow:
            self.scale, self.clean_steps = self.scale / 2, 0
            return True
        for g in grads:
            g.div_(self.scale)
        self.clean_steps += 1
        if self.clean_steps >= self.growth_interval:
            self.scale, self.clean_steps = self.scale * 2, 0
        return False

    def state_dict(self) -> dict:
        return {"scale": self.scale, "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.clean_steps = float(state["scale"]), int(state["clean_steps"])
