"""What every reducer shares: the tensor layout, per-layer levels, error memory, the dense path.

A reducer turns each worker's local gradients into the averaged (decompressed) gradients in
place. Tensors with 2 or more dimensions are "layers" that may be compressed (viewed as
(shape[0], rest), so a conv weight is (out_channels, in*kh*kw)); every other tensor, and every
layer whose level would not compress, is averaged exactly through one flat all-reduce that is
issued first so it overlaps with the compression work (or, after fold_dense, the DDP hook's
packing, at the end of the compressed layers' first all-reduce: one collective fewer).

One reduction is written once, as a generator of phases (`reduce_steps`): each phase starts
collectives asynchronously and hands their work handles to whoever drives it. `reduce` drives
it at once (waiting on each phase), the asynchronous DDP hook interleaves the phases of several
buckets with the backward pass; both run the very same operations, so their outputs agree.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from math import prod
from typing import NamedTuple

import torch

from .collectives import Communicator
from ..costmodel import ALLREDUCE
from .config import DenseSettings, check_level
from .stats import CommStats

_UNSET = object()  # Reducer._applied before any set_levels call


class Phase(NamedTuple):
    """Collectives one phase of a reduction has just started (their work handles).

    The next phase may run once they are complete. `final`: no collective follows, what is left
    is local work (decompression, error memory), which a driver may run on any thread.
    """

    works: list
    final: bool


class Reducer:
    """The facts a compressor's entry in comm/registry.py carries are class attributes: `name`,
    `SETTINGS`, `STEP_COLLECTIVES` (collectives of one whole-model reduction, and how many of
    them are all-gathers: the latency schedule=auto prices) and `WIRE_OP` (how the analysis'
    cost model sends a run's logged bytes)."""

    name = "none"
    SETTINGS = DenseSettings
    STEP_COLLECTIVES = (1, 0)
    WIRE_OP = ALLREDUCE
    # Whether the first collective of _compressed_steps is an all-reduce sum whose buffer can
    # carry the dense tensors too (PowerSGD's P, ACP-SGD's factor; not Top-K's all-gather).
    CARRIES_DENSE = False
    # Whether the FSDP path hands the compressed layers to reduce_scatter_compressed, which
    # returns only this rank's chunk of each average (precision's all-to-all), instead of
    # average_compressed, which makes each whole average on every rank (comm/fsdp.py).
    REDUCE_SCATTERS = False

    def __init__(self, params: Sequence[torch.Tensor], *, group=None, default_level=None,
                 error_feedback: bool = False):
        params = list(params)
        if not params:
            raise ValueError("a reducer needs at least one tensor")
        self.shapes = [tuple(p.shape) for p in params]
        self.numels = [p.numel() for p in params]
        self.dtype = params[0].dtype
        self.device = params[0].device
        self.compressible = [len(shape) >= 2 for shape in self.shapes]
        self.tensor_of_layer = [i for i, c in enumerate(self.compressible) if c]
        layer_of = {index: layer for layer, index in enumerate(self.tensor_of_layer)}
        self.layer_of_tensor = [layer_of.get(index) for index in range(len(params))]
        self.num_compressible = len(self.tensor_of_layer)
        self.matrix_shapes = [(self.shapes[i][0], prod(self.shapes[i][1:]))
                              for i in self.tensor_of_layer]
        self.comm = Communicator(group)
        self.default_level = default_level
        self.levels = [default_level] * self.num_compressible
        self._applied = _UNSET  # the `levels` set_levels applied last
        self.error_feedback = error_feedback
        self.memory: list[torch.Tensor | None] = [None] * self.num_compressible
        # Reductions in flight at the same time (DDP buckets) each need their own flat buffer.
        self._slot_buffers: dict = {}
        self._fold_dense = False  # see fold_dense

    # ---- levels ---------------------------------------------------------------------------
    def fold_dense(self) -> None:
        """From now on send the dense tensors of a reduction at the end of its first compressed
        all-reduce (PowerSGD's P, ACP-SGD's factor) instead of in an all-reduce of their own:
        one collective fewer per reduction (the DDP hook calls it: one per bucket and step).

        Their sums are the same numbers at 2 ranks (one addition each); at more ranks an
        element's sum over ranks is added in an order set by where it sits in the buffer, so
        they may round differently (docs/compressors.md, "The DDP hook"). The trainer's
        whole-model reduction keeps its own dense all-reduce, issued before the compression:
        its committed runs log 3 collectives per PowerSGD step, and the network benchmark
        holds those logs against the trainer's step. Top-K's first collective is an
        all-gather, which would send every rank's dense tensors to every rank: it is left as is.
        """
        self._fold_dense = self.CARRIES_DENSE

    def _check_level(self, level):
        """A valid level of this compressor; None (a reducer's own level only) stays None."""
        option, kind = self.SETTINGS.LEVEL
        if level is None:
            return None
        if kind is None:
            raise ValueError(f"compressor {self.name!r} takes no levels, got {level!r}")
        return check_level(kind, level, f"compressor.{option}")

    def _sends_dense(self, layer: int, level) -> bool:
        return True

    def _on_level_change(self, layer: int) -> None:
        """Reallocate what belongs to `layer` only; its error memory is kept."""

    def _normalized_levels(self, levels) -> list:
        option = self.SETTINGS.LEVEL[0]
        if option is not None and self.default_level is None and \
                (levels is None or any(lv is None for lv in levels)):
            raise ValueError(f"{self.name}: a layer has no {option}: this reducer was built with "
                             f"{option}=None (a schedule sets each layer's), so set_levels must "
                             f"give every layer one, got {levels!r}")
        if levels is None or self.default_level is None and all(lv is None for lv in levels):
            return [self.default_level] * self.num_compressible
        levels = list(levels)
        if len(levels) != self.num_compressible:
            raise ValueError(f"expected {self.num_compressible} levels (one per tensor with 2 or "
                             f"more dimensions), got {len(levels)}")
        return [self.default_level if lv is None else self._check_level(lv) for lv in levels]

    def set_levels(self, levels: Sequence | None) -> None:
        """Apply per-layer levels from now on (None, or a None entry, = the default level).

        The levels of the last call are checked once: a step at the same levels (every step
        of an epoch reduces at its plan's) checks nothing again."""
        given = None if levels is None else tuple(levels)
        if given == self._applied:
            return
        for layer, new in enumerate(self._normalized_levels(levels)):
            if new != self.levels[layer]:
                self.levels[layer] = new
                self._on_level_change(layer)
        self._applied = given

    def _tensor_floats(self, index: int, levels: Sequence) -> int:
        layer = self.layer_of_tensor[index]
        if layer is None or self._sends_dense(layer, levels[layer]):
            return self.numels[index]
        return self._compressed_floats(layer, levels[layer])

    def floats_per_step(self, levels: Sequence | None = None) -> int:
        """Floats one worker sends per step at these levels, in the paper's convention."""
        levels = self._normalized_levels(levels)
        return sum(self._tensor_floats(i, levels) for i in range(len(self.shapes)))

    # ---- reduction ------------------------------------------------------------------------
    def reduce(self, grads: Sequence[torch.Tensor], levels: Sequence | None = None) -> CommStats:
        """Average `grads` over workers in place (compressed where the level says so)."""
        if len(grads) != len(self.shapes):
            raise ValueError(f"expected {len(self.shapes)} gradients, got {len(grads)}")
        return self.reduce_subset(range(len(grads)), grads, levels)

    def reduce_subset(self, positions: Sequence[int], grads: Sequence[torch.Tensor],
                      levels: Sequence | None = None) -> CommStats:
        """Like reduce, for the tensors at `positions` only (a DDP bucket); grads[j] belongs to
        positions[j]. Levels still cover every layer; per-layer state makes the split free."""
        stats = CommStats()
        for phase in self.reduce_steps(positions, grads, stats, levels):
            for work in phase.works:
                work.wait()
        return stats

    def reduce_steps(self, positions: Sequence[int], grads: Sequence[torch.Tensor],
                     stats: CommStats, levels: Sequence | None = None, *,
                     slot=None) -> Generator[Phase, None, None]:
        """reduce_subset as phases: each `yield` has started collectives; resume the generator
        once its works are complete, until it is exhausted (then `grads` hold the average).

        Reductions that are in flight together must use distinct `slot`s (any hashable, e.g.
        the DDP bucket index); a slot keeps its own buffer for the dense tensors.
        """
        self.set_levels(levels)
        positions = list(positions)
        work = [g.contiguous() for g in grads]  # g itself when it is contiguous
        dense_at, compressed = self.split_dense(positions, work, stats)
        dense = [work[j] for j in dense_at]
        # With fold_dense the compressed layers' first all-reduce carries the dense tensors
        # (one worker sends nothing: they are their own average and stay where they are).
        carried = dense if self._fold_dense and compressed and self.comm.world_size > 1 else []
        flat, handle = self._start_dense([] if carried else dense, stats, slot)
        pending = [handle] if handle is not None else []  # joins the final phase
        steps = self._compressed_steps(compressed, stats, carried) if compressed else ()
        for works, final in steps:
            works = [w for w in works if w is not None]
            if final:
                works, pending = works + pending, []
            yield Phase(works, final)
        if pending:
            yield Phase(pending, True)
        self._finish_dense(dense, flat)
        for grad, work_grad in zip(grads, work):
            if work_grad is not grad:
                grad.copy_(work_grad)

    def split_dense(self, positions: list[int], grads: list[torch.Tensor],
                    stats: CommStats) -> tuple[list[int], list[tuple[int, torch.Tensor]]]:
        """Sort contiguous gradients into those sent dense and those compressed at the levels in
        force: (indices j of the dense grads[j], [(layer, grads[j]) to compress]).

        A compressible layer sent dense gets its error memory added first (the memory is sent
        in full and cleared). Counts the floats of all of them and the uncompressed layers in
        `stats`. The DDP and trainer paths send the dense ones in one all-reduce
        (reduce_steps), the FSDP path in a reduce-scatter (comm/fsdp.py).
        """
        dense, compressed = [], []
        for j, (pos, grad) in enumerate(zip(positions, grads)):
            if tuple(grad.shape) != self.shapes[pos]:
                raise ValueError(f"gradient {pos} has shape {tuple(grad.shape)}, "
                                 f"expected {self.shapes[pos]}")
            layer = self.layer_of_tensor[pos]
            if layer is None or self._sends_dense(layer, self.levels[layer]):
                if layer is not None:
                    stats.uncompressed_layers += 1
                if layer is not None and self.memory[layer] is not None:
                    grad.add_(self.memory[layer].view_as(grad))  # the memory is sent in full
                    self.memory[layer].zero_()
                dense.append(j)
            else:
                compressed.append((layer, grad))
        stats.floats_sent += sum(self._tensor_floats(pos, self.levels) for pos in positions)
        return dense, compressed

    def _compressed_steps(self, items: list[tuple[int, torch.Tensor]], stats: CommStats,
                          carried: Sequence[torch.Tensor] = ()):
        """Yield (work handles, final) after starting each collective of the compressed layers;
        after the last resume, the layers' gradients hold their decompressed average.

        `carried` (only where CARRIES_DENSE): dense tensors to send at the end of the first
        all-reduce's buffer (`_pack_dense`) and to average from it once it completes
        (`_finish_dense`)."""
        raise NotImplementedError

    def average_compressed(self, items: list[tuple[int, torch.Tensor]], stats: CommStats) -> None:
        """Run the compressed part of a reduction at once (what split_dense left to compress):
        afterwards each layer's gradient holds its decompressed average."""
        for works, _ in self._compressed_steps(items, stats) if items else ():
            for work in works:
                if work is not None:
                    work.wait()

    def memory_bytes(self) -> int:
        """Bytes of error memory this worker holds now (one full-size matrix per compressed
        layer that has been compressed with error feedback)."""
        return sum(m.numel() * m.element_size() for m in self.memory if m is not None)

    def _start_dense(self, dense: list[torch.Tensor], stats: CommStats, slot):
        total = sum(g.numel() for g in dense)
        if total == 0 or self.comm.world_size == 1:
            return None, None
        buffer = self._slot_buffers.get(slot)
        if buffer is None or buffer.numel() < total:
            buffer = self._slot_buffers[slot] = torch.empty(total, dtype=self.dtype,
                                                            device=self.device)
        flat = buffer[:total]
        torch.cat([g.view(-1) for g in dense], out=flat)
        return flat, self.comm.all_reduce_sum(flat, stats)

    @staticmethod
    def _dense_numel(dense: Sequence[torch.Tensor]) -> int:
        return sum(g.numel() for g in dense)

    @staticmethod
    def _pack_dense(dense: Sequence[torch.Tensor], tail: torch.Tensor) -> None:
        """Copy the dense tensors into `tail` (the end of a compressed all-reduce's buffer)."""
        if dense:
            torch.cat([g.view(-1) for g in dense], out=tail)

    def _finish_dense(self, dense: list[torch.Tensor], flat) -> None:
        """Copy the averaged flat buffer back; its all-reduce was in the final phase, so the
        driver has seen it complete (no wait here: in a Future callback of that very work,
        waiting on it would never return)."""
        if flat is None:
            return
        flat.div_(self.comm.world_size)
        for grad, part in zip(dense, flat.split([g.numel() for g in dense])):
            grad.view(-1).copy_(part)

    def _memory(self, layer: int) -> torch.Tensor:
        """The error memory of `layer` as an (n, m) matrix, created at first use."""
        if self.memory[layer] is None:
            self.memory[layer] = torch.zeros(self.matrix_shapes[layer], dtype=self.dtype,
                                             device=self.device)
        return self.memory[layer]

    # ---- state ----------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"name": self.name, "shapes": list(self.shapes), "levels": list(self.levels),
                "memory": [None if m is None else m.detach().clone() for m in self.memory]}

    def load_state_dict(self, state: dict) -> None:
        if state["name"] != self.name or [tuple(s) for s in state["shapes"]] != self.shapes:
            raise ValueError(f"state of a {state['name']!r} reducer over other tensors cannot be "
                             f"loaded into this {self.name!r} reducer")
        self.levels = list(state["levels"])
        self._applied = _UNSET
        self.memory = [None if m is None else m.to(self.device, self.dtype).clone()
                       for m in state["memory"]]


class DenseReducer(Reducer):
    """Plain averaging of every tensor in one flat all-reduce (`compressor=none`)."""

    def __init__(self, params: Sequence[torch.Tensor], *, group=None):
        super().__init__(params, group=group)
