"""ACP-SGD: PowerSGD that compresses P and Q alternately (Zhang et al., lzhangbv/acpsgd).

PowerSGD sends P = M Q, waits for its all-reduce, orthonormalises P, then sends Q = M^T P: two
collectives in sequence every step, and the second cannot start before the first has finished
(pytorch #74148: this is what stops PowerSGD from scaling). ACP-SGD sends one factor per step
and keeps the other from the step before:

    P turn:  Q <- orthonormalise(kept Q);  P = M Q;    all-reduce P;  output P Q^T / workers
    Q turn:  P <- orthonormalise(kept P);  Q = M^T P;  all-reduce Q;  output P Q^T / workers

with M = gradient + error memory and memory = M - P Q^T computed with the *local* factor before
the all-reduce (as the released code does). Each layer alternates on its own: a turn is a
property of the layer, so DDP buckets and per-layer levels need no global step counter. A layer
sends n*r floats on a P turn and m*r on a Q turn: over two steps exactly what PowerSGD sends in
one. docs/compressors.md lists the differences from the released code.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .base import Reducer
from .config import ACPPowerSGDSettings
from .powersgd import _draw_seed, orthonormalize_
from .stats import CommStats

P_TURN, Q_TURN = 0, 1


class ACPPowerSGDReducer(Reducer):
    name = "acp_powersgd"
    SETTINGS = ACPPowerSGDSettings
    STEP_COLLECTIVES = (2, 0)  # the dense tensors' all-reduce, then one factor's
    CARRIES_DENSE = True

    def __init__(self, params: Sequence[torch.Tensor], *, rank: int, error_feedback: bool,
                 seed: int, group=None):
        """Options as ACPPowerSGDSettings (comm/config.py) holds them."""
        super().__init__(params, group=group, default_level=self._check_level(rank),
                         error_feedback=error_feedback)
        self.seed = seed
        # The factor each layer keeps for its next turn, stored transposed like PowerSGD's:
        # Q^T (rank, m) before a P turn, the averaged P^T (rank, n) before a Q turn.
        self.kept: list[torch.Tensor | None] = [None] * self.num_compressible
        self.turn = [P_TURN] * self.num_compressible
        self.draws = [0] * self.num_compressible

    def _sends_dense(self, layer: int, level: int) -> bool:
        return level >= min(self.matrix_shapes[layer])  # as PowerSGD: the same layers go dense

    def _compressed_floats(self, layer: int, level: int) -> int:
        """This step's factor: n*r on the layer's P turn, m*r on its Q turn."""
        return self.matrix_shapes[layer][self.turn[layer]] * level

    def _on_level_change(self, layer: int) -> None:
        # A kept factor of another rank cannot be used: start over with a P turn and a fresh
        # random Q, as a PowerSGD layer does; the error memory is kept.
        self.kept[layer] = None
        self.turn[layer] = P_TURN

    def _fresh_q(self, layer: int, rank: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(_draw_seed(self.seed, layer, self.draws[layer]))
        self.draws[layer] += 1
        return torch.randn(rank, self.matrix_shapes[layer][1], generator=generator,
                           dtype=self.dtype).to(self.device)

    def _compressed_steps(self, items: list[tuple[int, torch.Tensor]], stats: CommStats,
                          carried: Sequence[torch.Tensor] = ()):
        items = sorted(items, key=lambda item: item[0])
        sizes = [self.matrix_shapes[layer][self.turn[layer]] * self.levels[layer]
                 for layer, _ in items]
        flat = torch.empty(sum(sizes) + self._dense_numel(carried), dtype=self.dtype,
                           device=self.device)
        buffer, tail = flat[:sum(sizes)], flat[sum(sizes):]  # the factors, then `carried`
        work = []
        offset = 0
        for (layer, grad), size in zip(items, sizes):
            rank, turn = self.levels[layer], self.turn[layer]
            grad_matrix = grad.view(self.matrix_shapes[layer])
            matrix = self._memory(layer).add_(grad_matrix) if self.error_feedback else grad_matrix
            if self.kept[layer] is None:
                self.kept[layer] = self._fresh_q(layer, rank)
            kept = self.kept[layer]
            orthonormalize_(kept.t().unsqueeze(0))  # the kept factor's columns, orthonormal
            sent = buffer[offset:offset + size].view(rank, -1)
            offset += size
            if turn == P_TURN:
                torch.mm(kept, matrix.t(), out=sent)  # P^T = Q^T M^T
            else:
                torch.mm(kept, matrix, out=sent)      # Q^T = P^T M
            if self.error_feedback:
                matrix.sub_(self._product(turn, sent, kept))  # memory = M - local P Q^T
            work.append((layer, grad_matrix, kept, sent))
        self._pack_dense(carried, tail)
        yield [self.comm.all_reduce_sum(flat, stats)], True
        self._finish_dense(carried, tail)
        if self.comm.world_size > 1:
            buffer.div_(self.comm.world_size)
        for layer, grad_matrix, kept, sent in work:
            turn = self.turn[layer]
            grad_matrix.copy_(self._product(turn, sent, kept))
            # The averaged factor is kept for the other turn, in its own tensor: a resumed run
            # then multiplies exactly the same memory layout as an uninterrupted one.
            self.kept[layer] = sent.clone()
            self.turn[layer] = Q_TURN if turn == P_TURN else P_TURN

    @staticmethod
    def _product(turn: int, sent: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """P Q^T from this turn's sent factor and the kept one (both transposed, (rank, .))."""
        return sent.t() @ kept if turn == P_TURN else kept.t() @ sent

    def state_dict(self) -> dict:
        return {**super().state_dict(),
                "kept": [None if k is None else k.detach().clone() for k in self.kept],
                "turn": list(self.turn), "draws": list(self.draws), "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.kept = [None if k is None else k.to(self.device, self.dtype).clone()
                     for k in state["kept"]]
        self.turn = list(state["turn"])
        self.draws = list(state["draws"])
        self.seed = state["seed"]
