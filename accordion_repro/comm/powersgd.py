"""PowerSGD with per-layer ranks (Vogels et al. 2019, as the Accordion code runs it).

One power step per iteration: P = M Q with the warm-started Q, all-reduce P (sum), orthonormalise
P, Q = M^T P, all-reduce Q and divide by the workers, output P Q^T. All P's travel in one buffer
and all Q's in another, so a step issues at most 3 collectives (with the flat dense buffer)
whatever the number of layers; 2 where the dense tensors ride at the end of P's buffer
(Reducer.fold_dense, the DDP hook).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..transfer import host_to_device
from .base import Reducer
from .config import PowerSGDSettings
from .stats import CommStats


# A column whose norm is below this is left at (near) zero instead of dividing by zero:
# an all-zero layer gradient then decompresses to zero, not NaN.
_TINY = 1e-30


def orthonormalize_(batch: torch.Tensor) -> torch.Tensor:
    """Make the columns of each (n, r) matrix of a (b, n, r) batch orthonormal, in place.

    Rank 1 is a normalisation. Higher ranks use Householder QR (LAPACK), which stays
    orthonormal where classical Gram-Schmidt loses orthogonality on nearly dependent columns;
    the signs QR picks do not matter because Q = M^T P carries them into the product P Q^T.
    """
    if batch.shape[-1] == 1:
        norms = torch.linalg.vector_norm(batch, dim=1, keepdim=True)
        return batch.div_(norms.clamp_min_(_TINY))
    q, _ = torch.linalg.qr(batch, mode="reduced")
    return batch.copy_(q)


class _PackedLayout:
    """Where each layer's P and Q live in the two packed buffers of one set of (layer, rank).

    P and Q are stored transposed, as (rank, n) and (rank, m) row-major blocks: with a
    row-major M, Q^T M^T and P^T M are fast wide products, whereas M Q with a thin Q falls on
    a slow BLAS path (about 10x slower for rank 2 and 4 with MKL on one thread). Layers that
    share (n, rank) sit next to each other so P can be orthonormalised as one batch.

    `tail` (elements): room after the P blocks for the dense tensors that travel with P
    (Reducer.fold_dense); `flat` is the buffer P's all-reduce sends, P blocks then the tail.

    `align` (elements): every layer's block starts at a multiple of it. BLAS products depend on
    where their operands sit (MKL's sgemm rounds Q^T M^T and P^T M differently for a Q or an
    output 4 floats off a 16-byte boundary), so with `align` = 64 bytes a layer's products are
    the same whichever layers share its buffers (a DDP bucket, an FSDP unit, the trainer's
    whole model). Runs committed before PACKING was recorded packed the blocks end to end.
    """

    def __init__(self, items: tuple[tuple[int, int], ...], matrix_shapes, dtype, device,
                 align: int = 1, tail: int = 0):
        groups: dict[tuple[int, int], list[int]] = {}
        for layer, rank in items:
            groups.setdefault((matrix_shapes[layer][0], rank), []).append(layer)

        def padded(size: int) -> int:
            return -(-size // align) * align

        p_size = sum(len(layers) * padded(n * rank) for (n, rank), layers in groups.items())
        q_size = sum(padded(matrix_shapes[l][1] * r) for l, r in items)
        self.flat = torch.zeros(p_size + tail, dtype=dtype, device=device)  # padding sums to 0
        self.p_buffer, self.tail = self.flat[:p_size], self.flat[p_size:]
        self.q_buffer = torch.zeros(q_size, dtype=dtype, device=device)
        self.p_groups: list[torch.Tensor] = []  # (layers, n, rank) views of P (transposed)
        self.p_t: dict[int, torch.Tensor] = {}  # layer -> P^T, (rank, n)
        self.q_t: dict[int, torch.Tensor] = {}  # layer -> Q^T, (rank, m)
        p_off = q_off = 0
        for (n, rank), layers in groups.items():
            stride = padded(rank * n)
            rows = self.p_buffer[p_off:p_off + len(layers) * stride].view(len(layers), stride)
            block = rows[:, :rank * n].view(len(layers), rank, n)
            self.p_groups.append(block.transpose(1, 2))
            p_off += rows.numel()
            for j, layer in enumerate(layers):
                m = matrix_shapes[layer][1]
                self.p_t[layer] = block[j]
                self.q_t[layer] = self.q_buffer[q_off:q_off + rank * m].view(rank, m)
                q_off += padded(rank * m)


def _draw_seed(seed: int, layer: int, draw: int) -> int:
    """A distinct, rank-independent seed per (reducer seed, layer, how many draws so far)."""
    return (seed * 1_000_003 + layer * 999_983 + draw * 7_919 + draw * layer) % (2**63 - 1)


# How P and Q blocks sit in their buffers, recorded in every run's summary.json (`numerics`):
# runs that differ in it compute different last bits and are never paired (analysis/paired.py).
PACKING = "aligned64"
_ALIGN_BYTES = 64


class PowerSGDReducer(Reducer):
    name = "powersgd"
    SETTINGS = PowerSGDSettings
    STEP_COLLECTIVES = (3, 0)  # the dense tensors' all-reduce, then P's and Q's
    CARRIES_DENSE = True

    def __init__(self, params: Sequence[torch.Tensor], *, rank: int, error_feedback: bool,
                 warm_start: bool, seed: int, group=None):
        """Options as PowerSGDSettings (comm/config.py) holds them; build_reducer fills defaults."""
        super().__init__(params, group=group, default_level=self._check_level(rank),
                         error_feedback=error_feedback)
        self.warm_start = warm_start
        self.seed = seed
        # Q^T of each layer, (rank, m), drawn lazily; each draw re-seeds from (seed, layer,
        # draws[layer]) so every worker draws the same Q without communication, in any order.
        self.q: list[torch.Tensor | None] = [None] * self.num_compressible
        self.draws = [0] * self.num_compressible
        self._layouts: dict[tuple, _PackedLayout] = {}
        # Every P and Q block starts on a 64-byte boundary of its buffer, so a layer's products
        # do not depend on the layers reduced with it: DDP groups layers into buckets and
        # regroups them after its first step (a resumed run's first step would otherwise pack
        # other layers together than the step it replaces), FSDP reduces unit by unit, the
        # trainer the whole model at once, and all three compute the same bits.
        self._align = max(1, _ALIGN_BYTES // torch.empty((), dtype=self.dtype).element_size())
        self._aligned_m: list[torch.Tensor | None] = [None] * self.num_compressible

    def _matrix(self, layer: int, grad_matrix: torch.Tensor) -> torch.Tensor:
        """M = g + e with error feedback (held in the error memory), else a copy of g in a
        buffer of its own: g may be a view into a DDP bucket, at an offset set by the bucket's
        other layers, which BLAS would round differently."""
        if self.error_feedback:
            return self._memory(layer).add_(grad_matrix)
        if self._aligned_m[layer] is None:
            self._aligned_m[layer] = torch.empty(self.matrix_shapes[layer], dtype=self.dtype,
                                                 device=self.device)
        return self._aligned_m[layer].copy_(grad_matrix)

    def _sends_dense(self, layer: int, level: int) -> bool:
        return level >= min(self.matrix_shapes[layer])

    def _compressed_floats(self, layer: int, level: int) -> int:
        return sum(self.matrix_shapes[layer]) * level  # (n + m) * rank

    def _on_level_change(self, layer: int) -> None:
        self.q[layer] = None  # as the official code: a fresh random Q, the memory is kept

    def _fresh_q(self, layer: int, rank: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(_draw_seed(self.seed, layer, self.draws[layer]))
        self.draws[layer] += 1
        return host_to_device(torch.randn(rank, self.matrix_shapes[layer][1], generator=generator,
                                          dtype=self.dtype), self.device)

    def _layout(self, items: tuple[tuple[int, int], ...], tail: int) -> _PackedLayout:
        key = (items, tail)
        if key not in self._layouts:
            if len(self._layouts) > 64:  # level patterns come and go; keep the cache small
                self._layouts.clear()
            self._layouts[key] = _PackedLayout(items, self.matrix_shapes, self.dtype,
                                               self.device, self._align, tail)
        return self._layouts[key]

    def _compressed_steps(self, items: list[tuple[int, torch.Tensor]], stats: CommStats,
                          carried: Sequence[torch.Tensor] = ()):
        # Layer order, whatever order a DDP bucket lists its parameters in: the packed layout
        # (and so the BLAS calls) of a set of layers is always the same one.
        items = sorted(items, key=lambda item: item[0])
        layout = self._layout(tuple((layer, self.levels[layer]) for layer, _ in items),
                              self._dense_numel(carried))
        matrices = []
        for layer, grad in items:
            grad_matrix = grad.view(self.matrix_shapes[layer])
            matrix = self._matrix(layer, grad_matrix)
            q_t = layout.q_t[layer]
            if self.q[layer] is None or not self.warm_start:
                q_t.copy_(self._fresh_q(layer, self.levels[layer]))
            elif self.q[layer].data_ptr() != q_t.data_ptr():
                # Q always enters the product from its slot in the packed buffer: BLAS results
                # can depend on alignment, and a resumed run must compute bit for bit alike.
                q_t.copy_(self.q[layer])
            torch.mm(q_t, matrix.t(), out=layout.p_t[layer])  # P^T = Q^T M^T
            matrices.append((layer, grad_matrix, matrix))

        self._pack_dense(carried, layout.tail)
        yield [self.comm.all_reduce_sum(layout.flat, stats)], False
        self._finish_dense(carried, layout.tail)
        for group in layout.p_groups:
            orthonormalize_(group)
        for layer, _, matrix in matrices:
            torch.mm(layout.p_t[layer], matrix, out=layout.q_t[layer])  # Q^T = P^T M
        yield [self.comm.all_reduce_sum(layout.q_buffer, stats)], True
        if self.comm.world_size > 1:
            layout.q_buffer.div_(self.comm.world_size)

        for layer, grad_matrix, matrix in matrices:
            p_t, q_t = layout.p_t[layer], layout.q_t[layer]
            torch.mm(p_t.t(), q_t, out=grad_matrix)  # output P Q^T
            if self.error_feedback:
                matrix.sub_(grad_matrix)  # memory = M - what the average gave back
            self.q[layer] = q_t  # warm start: the averaged Q seeds the next step

    def state_dict(self) -> dict:
        return {**super().state_dict(),
                "q_t": [None if q is None else q.detach().clone() for q in self.q],
                "draws": list(self.draws), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.q = [None if q is None else q.to(self.device, self.dtype).clone() for q in state["q_t"]]
        self.draws = list(state["draws"])
        self.seed = state["seed"]
