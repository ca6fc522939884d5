"""The levels schedule=auto chooses among, per compressor: what each candidate sends per step,
how it travels, and the relative error it leaves on a layer's gradient (issue 42).

- PowerSGD and ACP-SGD: ranks 1, 2, 4, ... up to `max_rank`; e(r) = ||G - G_r|| / ||G||, G_r the
  best rank-r approximation, from the exact singular values (lgreco.rank_errors).
- Top-K: kept fractions b/2, b/4, ... down to `min_fraction`, b = 1 / (2 x world size) the
  break-even (the all-gather sends 2 k values and indices from each of the p workers, so a
  fraction at or above b sends no fewer floats than the dense all-reduce); the error of keeping
  the k largest entries is e(f) = sqrt(1 - (energy of the top k) / ||G||^2), exact from one
  torch.topk of the squared entries per layer and check.

A family prices a level in the reducers' own floats (comm/base.py floats_per_step), so the
traffic budget and the logged floats_sent agree, and names the collective it travels by, so
the step-time budget can price it on a link (accordion_repro/costmodel.py StepExchange).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..costmodel import ALLGATHER, ALLREDUCE, StepExchange
from ..comm.config import kept_entries, topk_sends_dense
from ..comm.registry import compressor
from .lgreco import layer_cost, rank_errors



def power_of_two_ranks(max_rank: int) -> list[int]:
    """The candidates 1, 2, 4, ... up to max_rank (max_rank itself included)."""
    ranks, rank = [], 1
    while rank < max_rank:
        ranks.append(rank)
        rank *= 2
    return [*ranks, max_rank]


def relative_errors(matrix: torch.Tensor, ranks: Sequence[int]) -> list[float]:
    """e(r) = ||M - M_r||_F / ||M||_F for each r (0 for an all-zero M: nothing to lose)."""
    total = rank_errors(matrix, [0])[0]  # ||M - M_0|| = ||M||
    if total == 0.0:
        return [0.0] * len(ranks)
    return [error / total for error in rank_errors(matrix, ranks)]


def fraction_grid(world_size: int, min_fraction: float) -> list[float]:
    """Top-K's candidates, ascending: b/2^j for j = 1, 2, ... while >= min_fraction, where
    b = 1 / (2 x world_size) is the break-even (empty when min_fraction > b / 2)."""
    fraction, grid = 1.0 / (4 * world_size), []
    while fraction >= min_fraction:
        grid.append(fraction)
        fraction /= 2
    return grid[::-1]


def topk_errors(matrix: torch.Tensor, fractions: Sequence[float]) -> list[float]:
    """e(f) = sqrt(1 - top-k energy share) for each kept fraction f (k as the reducer keeps,
    comm/config.py kept_entries), in float64; 0 for an all-zero matrix or a k of every entry."""
    shape = tuple(matrix.shape)
    squares = matrix.detach().to(torch.float64).reshape(-1).square()
    total = float(squares.sum())
    if total == 0.0:
        return [0.0] * len(fractions)
    ks = [min(kept_entries(shape, f), squares.numel()) for f in fractions]
    kept = torch.cumsum(torch.topk(squares, max(ks), sorted=True).values, 0)
    return [math.sqrt(max(0.0, 1.0 - float(kept[k - 1]) / total)) for k in ks]


class RankCandidates:
    """PowerSGD (or ACP-SGD) ranks: all-reduced, (n + m) r floats, n m where r >= min(n, m)."""

    kind = int

    def __init__(self, compressor: str, max_rank: int):
        self.compressor = compressor
        self.levels = power_of_two_ranks(max_rank)

    def floats(self, shape: tuple[int, int], level: int) -> int:
        return layer_cost(shape, level)

    def op(self, shape: tuple[int, int], level: int) -> str:
        return ALLREDUCE

    def errors(self, matrix: torch.Tensor, levels: Sequence[int]) -> list[float]:
        return relative_errors(matrix, levels)


class FractionCandidates:
    """Top-K kept fractions below the break-even: all-gathered, 2 k p floats (n m, all-reduced,
    where k would keep every entry)."""

    kind = float

    def __init__(self, compressor: str, world_size: int, min_fraction: float):
        self.compressor, self.world_size = compressor, world_size
        self.levels = fraction_grid(world_size, min_fraction)

    def floats(self, shape: tuple[int, int], level: float) -> int:
        n, m = shape
        return n * m if topk_sends_dense(shape, level) else \
            2 * kept_entries(shape, level) * self.world_size

    def op(self, shape: tuple[int, int], level: float) -> str:
        return ALLREDUCE if topk_sends_dense(shape, level) else ALLGATHER

    def errors(self, matrix: torch.Tensor, levels: Sequence[float]) -> list[float]:
        return topk_errors(matrix, levels)


def candidates_for(compressor: str, level_kind: type, world_size: int, max_rank: int,
                   min_fraction: float):
    """The family of `compressor` (its level kind as comm/ gives it)."""
    if level_kind is int:
        return RankCandidates(compressor, max_rank)
    return FractionCandidates(compressor, world_size, min_fraction)


def step_exchange(candidates, network, world_size: int) -> StepExchange:
    """The cost model of one step of this compressor's exchange on `network`: its collectives
    per whole-model reduction (the reducer's STEP_COLLECTIVES), whose latency is the same at
    every level; the DDP hook sends one set per bucket."""
    collectives, allgathers = compressor(candidates.compressor).STEP_COLLECTIVES
    return StepExchange(network, world_size, collectives, allgathers)
