"""Top-K sparsification with per-layer kept fractions, all layers in one all-gather.

Each worker keeps the k = max(1, floor(ratio * numel)) entries of largest magnitude of every
compressed layer. The step's values (float32) and indices (int32) go into ONE float32 buffer:
values first, then the indices stored bitwise (an int32 view of the same storage), so one
all-gather moves everything and no index is rounded through a float conversion.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Reducer
from .config import check_ratio
from .stats import CommStats


def topk_indices(values: torch.Tensor, k: int, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Indices of the k largest |values| of a 1-D tensor, in no particular order, no full sort."""
    magnitudes = torch.abs(values, out=scratch) if scratch is not None else values.abs()
    return torch.topk(magnitudes, k, sorted=False).indices


class TopKReducer(Reducer):
    name = "topk"

    def __init__(self, params: Sequence[torch.Tensor], *, ratio: float,
                 error_feedback: bool = True, official_topk: bool = False, group=None):
        # The released Accordion Top-K sums without dividing and never writes its memory.
        super().__init__(params, group=group, default_level=check_ratio(ratio),
                         error_feedback=error_feedback and not official_topk)
        if self.dtype != torch.float32:
            raise ValueError("the Top-K reducer packs float32 values with int32 indices; "
                             f"got {self.dtype} gradients")
        self.official_topk = official_topk
        self._scratch = torch.empty(0, dtype=self.dtype, device=self.device)

    def _check_level(self, level) -> float:
        return check_ratio(level)

    def kept(self, layer: int, ratio: float) -> int:
        n, m = self.matrix_shapes[layer]
        return max(1, int(ratio * n * m))

    def _sends_dense(self, layer: int, level: float) -> bool:
        n, m = self.matrix_shapes[layer]
        return level >= 1.0 or self.kept(layer, level) >= n * m

    def _compressed_floats(self, layer: int, level: float) -> int:
        return 2 * self.kept(layer, level) * self.comm.world_size

    def _reduce_compressed(self, items: list[tuple[int, torch.Tensor]], stats: CommStats):
        counts = [self.kept(layer, self.levels[layer]) for layer, _ in items]
        total = sum(counts)
        send = torch.empty(2 * total, dtype=torch.float32, device=self.device)
        send_values, send_indices = send[:total], send[total:].view(torch.int32)
        largest = max(grad.numel() for _, grad in items)
        if self._scratch.numel() < largest:
            self._scratch = torch.empty(largest, dtype=self.dtype, device=self.device)

        offset = 0
        for (layer, grad), k in zip(items, counts):
            flat = grad.view(-1)
            if self.error_feedback:
                flat = self._memory(layer).view(-1).add_(flat)  # memory now holds M = g + e
            chosen = topk_indices(flat, k, self._scratch[:flat.numel()])
            torch.index_select(flat, 0, chosen, out=send_values[offset:offset + k])
            send_indices[offset:offset + k].copy_(chosen)
            if self.error_feedback:
                flat.index_fill_(0, chosen, 0.0)  # memory = M - what this worker sent
            offset += k

        gathered = self.comm.all_gather(send, stats)
        values, indices = gathered[:, :total], gathered[:, total:].view(torch.int32)
        scale = 1.0 if self.official_topk else 1.0 / self.comm.world_size
        offset = 0
        for (layer, grad), k in zip(items, counts):
            flat = grad.view(-1).zero_()
            flat.index_add_(0, indices[:, offset:offset + k].reshape(-1),
                            values[:, offset:offset + k].reshape(-1))
            if scale != 1.0:
                flat.mul_(scale)
            offset += k
