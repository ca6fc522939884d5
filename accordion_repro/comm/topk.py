"""Top-K sparsification with per-layer kept fractions, all layers in one all-gather.

Each worker keeps the k = max(1, floor(ratio * numel)) entries of largest magnitude of every
compressed layer (`official_topk`: k = floor(ratio * numel), as the released code, so a layer
too small for its ratio sends nothing and its averaged gradient is zero). The step's values
(float32) and indices (int32) go into ONE float32 buffer: values first, then the indices stored
bitwise (an int32 view of the same storage), so one all-gather moves everything and no index
is rounded through a float conversion.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from .base import Reducer
from ..costmodel import ALLGATHER
from .config import TopKSettings, kept_entries, topk_sends_dense
from .stats import CommStats


# Below this size torch.topk alone is as fast as anything cleverer.
_SAMPLED_MIN_NUMEL = 1 << 16
_SAMPLE_SIZE = 1 << 14
_sample_positions: dict[tuple[int, torch.device], torch.Tensor] = {}


def _sample(magnitudes: torch.Tensor) -> torch.Tensor:
    """A fixed pseudo-random sample of a layer's magnitudes (the same positions every step)."""
    key = (magnitudes.numel(), magnitudes.device)
    if key not in _sample_positions:
        generator = torch.Generator().manual_seed(magnitudes.numel())
        positions = torch.randint(magnitudes.numel(), (_SAMPLE_SIZE,), generator=generator)
        _sample_positions[key] = positions.to(magnitudes.device)
    return magnitudes[_sample_positions[key]]


def _margin(fraction: float) -> float:
    """Extra sampled fraction so the sampled threshold lets through >= k entries almost surely."""
    return 5.0 * math.sqrt(fraction * (1.0 - fraction) / _SAMPLE_SIZE) + 2.0 / _SAMPLE_SIZE


def topk_indices(values: torch.Tensor, k: int, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the k largest |values| of a 1-D tensor, in no particular order, no full sort.

    Large layers use a threshold from a fixed sample of magnitudes: one comparison pass picks a
    candidate set a little larger than k (or, when keeping most entries, a set a little larger
    than the n - k to drop), and an exact torch.topk on that small set finishes. The candidate
    count is checked, so the result is always the exact top k; a rare miss of the sampled
    threshold (or NaNs) falls back to torch.topk over the whole layer.
    """
    n = values.numel()
    magnitudes = torch.abs(values, out=scratch) if scratch is not None else values.abs()
    # CPU only: torch.nonzero and the candidate count are host reads, one GPU sync each, and
    # torch.topk on a GPU is a radix select that needs no candidate set.
    if n >= _SAMPLED_MIN_NUMEL and k < n and values.device.type == "cpu":
        sample = _sample(magnitudes)
        if k <= n // 2:
            fraction = min(1.0, k / n + _margin(k / n))
            rank = max(1, _SAMPLE_SIZE - int(fraction * _SAMPLE_SIZE))
            threshold = torch.kthvalue(sample, rank).values
            candidates = torch.nonzero(magnitudes >= threshold).view(-1)
            if candidates.numel() >= k:
                chosen = torch.topk(magnitudes[candidates], k, sorted=False).indices
                return candidates[chosen]
        else:
            drop = n - k
            fraction = min(1.0, drop / n + _margin(drop / n))
            rank = min(_SAMPLE_SIZE, max(1, int(fraction * _SAMPLE_SIZE)))
            threshold = torch.kthvalue(sample, rank).values
            candidates = torch.nonzero(magnitudes <= threshold).view(-1)
            if candidates.numel() >= drop:
                dropped = torch.topk(magnitudes[candidates], drop, largest=False,
                                     sorted=False).indices
                keep = torch.ones(n, dtype=torch.bool, device=values.device)
                keep[candidates[dropped]] = False
                return torch.nonzero(keep).view(-1)
    return torch.topk(magnitudes, k, sorted=False).indices


def add_in_rank_order(flat: torch.Tensor, indices: torch.Tensor, values: torch.Tensor) -> None:
    """flat[indices[r, j]] += values[r, j], rank 0's row first, then rank 1's, and so on.

    Each row holds one worker's top-k, so its indices are distinct: one index_add_ per row adds
    at most once to each entry, and the rows follow one another in stream order. A single
    index_add_ over all rows would add the ranks' values of a shared index with CUDA atomics in
    whatever order the threads run (torch lists index_add_ on CUDA among the nondeterministic
    operations): with 3 or more ranks the float sums, and so the replicas, would differ. On
    the CPU the single call adds in the order of its index, row after row, so this is the same
    sum, bit for bit (tests/test_comm_reducers.py checks it).
    """
    for rank_indices, rank_values in zip(indices, values):
        flat.index_add_(0, rank_indices, rank_values)


class TopKReducer(Reducer):
    name = "topk"
    SETTINGS = TopKSettings
    STEP_COLLECTIVES = (2, 1)  # the dense tensors' all-reduce, then the selections' all-gather
    # Runs log only totals, so a Top-K run's bytes are priced as all-gathered (its dense 1-D
    # tensors are in fact all-reduced: a small overestimate).
    WIRE_OP = ALLGATHER

    def __init__(self, params: Sequence[torch.Tensor], *, ratio: float, error_feedback: bool,
                 official_topk: bool, group=None):
        """Options as TopKSettings (comm/config.py) holds them; build_reducer fills defaults."""
        # The released Accordion Top-K sums without dividing and never writes its memory.
        super().__init__(params, group=group, default_level=self._check_level(ratio),
                         error_feedback=error_feedback and not official_topk)
        if self.dtype != torch.float32:
            raise ValueError("the Top-K reducer packs float32 values with int32 indices; "
                             f"got {self.dtype} gradients")
        self.official_topk = official_topk
        self._scratch = torch.empty(0, dtype=self.dtype, device=self.device)

    def kept(self, layer: int, ratio: float) -> int:
        """Entries each worker sends for `layer`: k of the module docstring."""
        return kept_entries(self.matrix_shapes[layer], ratio, self.official_topk)

    def _sends_dense(self, layer: int, level: float) -> bool:
        return topk_sends_dense(self.matrix_shapes[layer], level, self.official_topk)

    def _compressed_floats(self, layer: int, level: float) -> int:
        return 2 * self.kept(layer, level) * self.comm.world_size

    def _compressed_steps(self, items: list[tuple[int, torch.Tensor]], stats: CommStats,
                          carried: Sequence[torch.Tensor] = ()):
        counts = [self.kept(layer, self.levels[layer]) for layer, _ in items]
        total = sum(counts)
        send = torch.empty(2 * total, dtype=torch.float32, device=self.device)
        send_values, send_indices = send[:total], send[total:].view(torch.int32)
        largest = max(grad.numel() for _, grad in items)
        if self._scratch.numel() < largest:
            self._scratch = torch.empty(largest, dtype=self.dtype, device=self.device)

        for (layer, grad), k, out_values, out_indices in zip(
                items, counts, send_values.split(counts), send_indices.split(counts)):
            if k == 0:
                continue  # official_topk only: nothing sent, the output below stays zero
            flat = grad.view(-1)
            if self.error_feedback:
                flat = self._memory(layer).view(-1).add_(flat)  # memory now holds M = g + e
            chosen = topk_indices(flat, k, self._scratch[:flat.numel()])
            torch.index_select(flat, 0, chosen, out=out_values)
            out_indices.copy_(chosen)
            if self.error_feedback:
                flat.index_fill_(0, chosen, 0.0)  # memory = M - what this worker sent

        if total == 0:  # official_topk only: no layer sends an entry this step
            for _, grad in items:
                grad.zero_()
            return
        if self.comm.distributed:
            gathered, handles = self.comm.all_gather_async(send, stats)
            yield handles, True
        else:  # one worker: the gather is the identity, there is nothing to wait for
            gathered = self.comm.all_gather(send, stats)
        values, indices = gathered[:, :total], gathered[:, total:].view(torch.int32)
        scale = 1.0 if self.official_topk else 1.0 / self.comm.world_size
        for (_, grad), layer_values, layer_indices in zip(items, values.split(counts, dim=1),
                                                          indices.split(counts, dim=1)):
            flat = grad.view(-1).zero_()
            add_in_rank_order(flat, layer_indices, layer_values)
            if scale != 1.0:
                flat.mul_(scale)
