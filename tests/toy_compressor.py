"""A toy compressor, registered the way a user registers one: a module-level class and one
registry line (docs/architecture.md, "Adding a compressor"). tests/test_compressor_contract.py
runs the contract on it and trains with it through the CLI (`plugins=[toy_compressor]`).

It lives outside the test modules, which pytest imports at collection: registered there, it
would be in the registry of every test of the session (in the lists that "choose one of"
messages name, in the generated options page), which no user's run has.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch

from accordion_repro.comm import CommStats, Reducer, register_compressor
from accordion_repro.options import Options, Settings, option


class StrideReducer(Reducer):
    """A toy compressor: each worker sends every `stride`-th entry of a layer (plus its error
    memory) in one all-reduce; the entries it did not send wait in the memory."""

    name = "stride"

    @dataclass(frozen=True)
    class SETTINGS(Settings):
        SECTION = "compressor"
        LEVEL: ClassVar[tuple] = ("stride", int)
        stride: int | None = option(Options.integer, minimum=1, optional=True,
                                    help="send every stride-th entry (1: the layer whole)")

    def __init__(self, params, *, stride: int | None, group=None):
        super().__init__(params, group=group, default_level=self._check_level(stride),
                         error_feedback=True)

    def _sends_dense(self, layer: int, level: int) -> bool:
        return level == 1

    def _compressed_floats(self, layer: int, level: int) -> int:
        return math.ceil(math.prod(self.matrix_shapes[layer]) / level)

    def _compressed_steps(self, items, stats: CommStats, carried=()):
        memories = [self._memory(layer).view(-1).add_(grad.view(-1)) for layer, grad in items]
        sent = torch.cat([m[::self.levels[layer]] for (layer, _), m in zip(items, memories)])
        work = self.comm.all_reduce_sum(sent, stats)
        yield [work], True
        sent.div_(self.comm.world_size)
        for (layer, grad), memory, part in zip(items, memories, sent.split(
                [m[::self.levels[layer]].numel() for (layer, _), m in zip(items, memories)])):
            memory[::self.levels[layer]] = 0.0
            grad.view(-1).zero_()[::self.levels[layer]] = part


register_compressor(StrideReducer)
