"""Optimisers: torch SGD for CIFAR, and the official LSTM momentum form.

The official WikiText-2 code does not use torch's SGD: it keeps m = mu * m + g and steps with
g + m (a Nesterov-like form without the mu on the correction). Its buffers other than the first
come from torch.empty_like (uninitialised memory); we start them at zero, which equals its
behaviour whenever that memory happened to be zero.
"""

from __future__ import annotations

from typing import Iterable

import torch

from accordion_repro.engine.settings import OptimSettings


class LSTMMomentum(torch.optim.Optimizer):
    """p -= lr * (g + m), m = momentum * m + g (weight decay added to g first, if any)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0):
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                g = p.grad
                if group["weight_decay"]:
                    g = g.add(p, alpha=group["weight_decay"])
                if "momentum_buffer" not in self.state[p]:
                    self.state[p]["momentum_buffer"] = torch.zeros_like(p)
                m = self.state[p]["momentum_buffer"].mul_(group["momentum"]).add_(g)
                p.add_(g + m, alpha=-group["lr"])
        return None


def build_optimizer(optim: OptimSettings, params: list[torch.Tensor], lr: float) -> torch.optim.Optimizer:
    if optim.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=optim.momentum, nesterov=optim.nesterov,
                               weight_decay=optim.weight_decay)
    return LSTMMomentum(params, lr=lr, momentum=optim.momentum, weight_decay=optim.weight_decay)

