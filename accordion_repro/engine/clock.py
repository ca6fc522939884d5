"""Seconds spent in each phase of an epoch's steps, without a host sync per step on CUDA.

The trainer splits a step into compute (local gradient, optimizer update) and communication
(the reducer). On the CPU the wall clock around each phase is exact. On a GPU the host only
queues kernels, so a wall clock needs `torch.cuda.synchronize()` after every phase (three per
step: the device's queue drains, the host waits, and the next phase starts from an empty
queue). Here each phase is bracketed by CUDA events recorded on the stream instead, and the
elapsed times are read once, when the epoch asks for its totals (one sync per epoch).
"""

from __future__ import annotations

import time
from collections import defaultdict

import torch


class PhaseClock:
    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self._seconds: dict[str, float] = defaultdict(float)
        self._events: list[tuple[str, object, object]] = []  # CUDA: (phase, start, end)

    def timed(self, phase: str, work, *args):
        """work(*args), its time added to `phase`."""
        if not self.cuda:
            start = time.perf_counter()
            out = work(*args)
            self._seconds[phase] += time.perf_counter() - start
            return out
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = work(*args)
        end.record()
        self._events.append((phase, start, end))
        return out

    def totals(self) -> dict[str, float]:
        """Seconds per phase so far (on CUDA: waits for the last recorded phase to finish)."""
        if self._events:
            self._events[-1][2].synchronize()
            for phase, start, end in self._events:
                self._seconds[phase] += start.elapsed_time(end) / 1e3
            self._events = []
        return dict(self._seconds)
