"""L-GreCo's pieces (Alimohammadi et al., MLSys 2024; LGrCo/L-GreCo, hooks/lgreco_hook.py):
the per-layer error table and the knapsack that picks one PowerSGD rank per layer.

Every window (an epoch, as the released CIFAR script sets it) rank 0 measures, for each layer
and each candidate rank r in [floor(gamma r0), ceil(beta r0)], the error of the best rank-r
approximation of the layer's recently accumulated gradient, ||M - M_r||_F (from its singular
values). A dynamic programme then minimises the floats sent, sum over layers of (n + m) r,
subject to the summed error staying within alpha x the error of the uniform rank r0 (or, for
L-GreCo + Accordion, of the ranks Accordion chose). Errors are rounded *down* onto a grid of
`bins` steps of the reference error, so the reference plan itself always fits (at alpha >= 1
the plan never sends more than the reference) and an accepted plan exceeds the real budget by
less than (layers / bins) x the reference. docs/schedules.md names every difference from the
released code.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from .detector import CriticalRegimeDetector


def candidate_ranks(r0: int, gamma: float, beta: float) -> list[int]:
    """L-GreCo's candidates: floor(gamma r0) .. ceil(beta r0), never below rank 1."""
    return list(range(max(1, math.floor(gamma * r0)), math.ceil(beta * r0) + 1))


def layer_cost(shape: tuple[int, int], rank: int) -> int:
    """Floats one step sends for an (n, m) layer at `rank`: (n + m) r, or n m where the rank
    cannot compress the layer (the reducers then send it whole, error 0)."""
    n, m = shape
    return n * m if rank >= min(n, m) else (n + m) * rank


def rank_errors(matrix: torch.Tensor, ranks: Sequence[int]) -> list[float]:
    """||M - M_r||_F of the best rank-r approximation for each r: the root of the sum of the
    squared singular values past the r-th (0 from r = min(n, m) on), in float64.

    A wide matrix is decomposed as its transpose (the same singular values): LAPACK's path for
    a tall one reduces it by QR first, and took 4 s against 15.5 s for a 512 x 4608 layer on 2
    loaded cores (its 21 layers made one full-width ResNet-18 check take minutes).
    """
    matrix = matrix.detach()
    if matrix.shape[0] < matrix.shape[1]:
        matrix = matrix.T
    singular = torch.linalg.svdvals(matrix.to(torch.float64)).cpu()
    # tail[i] = sum of s_j^2 over j >= i
    tail = torch.flip(torch.cumsum(torch.flip(singular.square(), [0]), 0), [0])
    return [float(tail[r].sqrt()) if r < len(tail) else 0.0 for r in ranks]


def choose_ranks(errors: Sequence[Sequence[float]], costs: Sequence[Sequence[int]],
                 reference: float, alpha: float, bins: int) -> list[int]:
    """Per layer, the index of the candidate the DP picks: least total cost with
    sum of errors <= alpha x reference, errors rounded down to multiples of reference / bins.

    Ties in cost go to the smaller total error. If no choice fits (alpha below what the best
    candidates reach), every layer takes its least-error candidate.
    """
    if not errors:
        return []
    capacity = math.floor(alpha * bins + 1e-9)
    if reference <= 0.0:  # nothing to lose (all-zero gradients): the cheapest candidates
        return [int(np.argmin(c)) for c in costs]
    step = reference / bins
    units = [[grid_units(e, step, capacity) for e in layer] for layer in errors]
    chosen = least_total_within(units, costs, capacity)
    return chosen if chosen is not None else [int(np.argmin(layer)) for layer in errors]


def least_total_within(units: Sequence[Sequence[int]], values: Sequence[Sequence[float]],
                       capacity: int) -> list[int] | None:
    """The knapsack both budget forms solve (L-GreCo's: least size within an error budget;
    schedule=auto's: least error within a size budget): per layer the index of one candidate,
    least summed value with summed units <= capacity (of equal values, the fewest units; of
    equal candidates in a layer, the first). None when no choice fits."""
    num_layers = len(units)
    best = np.full(capacity + 1, np.inf)  # best[u] = least value of the layers so far using u units
    best[0] = 0.0
    picks = np.full((num_layers, capacity + 1), -1, dtype=np.int64)
    for layer in range(num_layers):
        new = np.full(capacity + 1, np.inf)
        for choice, (unit, value) in enumerate(zip(units[layer], values[layer])):
            if unit > capacity:
                continue
            shifted = np.full(capacity + 1, np.inf)
            shifted[unit:] = best[:capacity + 1 - unit] + value
            better = shifted < new
            new[better] = shifted[better]
            picks[layer][better] = choice
        best = new
    if not np.isfinite(best).any():
        return None
    used = int(np.argmin(best))
    chosen = [0] * num_layers
    for layer in range(num_layers - 1, -1, -1):
        chosen[layer] = int(picks[layer][used])
        used -= units[layer][chosen[layer]]
    return chosen


def grid_units(error: float, step: float, capacity: int) -> int:
    """An error in grid steps, rounded down (the reference plan's own errors sum to exactly
    `bins` steps or less); anything over the capacity is marked as never fitting."""
    return min(math.floor(error / step + 1e-9), capacity + 1)


class ErrorProbe:
    """Rank 0's measurement for L-GreCo, with the detector's interface (accumulate, prepare,
    accumulate_layers, end_step, end_epoch, report, state_dict), so the trainer and the DDP
    hook feed it as they feed Accordion's detector.

    It sums the local gradients of the epoch through a CriticalRegimeDetector (one pass over
    the gradients serves both L-GreCo and, for L-GreCo + Accordion, Accordion's flags) and at
    the end of the epoch measures each layer's error table on those sums before the detector
    starts a new epoch. end_epoch returns {"critical": the detector's flags, "errors": table}.
    """

    def __init__(self, detector: CriticalRegimeDetector, layer_shapes: Sequence[tuple[int, int]],
                 ranks: Sequence[int]):
        if len(layer_shapes) != detector.num_layers:
            raise ValueError(f"{len(layer_shapes)} layer shapes for a detector over "
                             f"{detector.num_layers} layers")
        self.detector = detector
        self.layer_shapes = [tuple(s) for s in layer_shapes]
        self.ranks = list(ranks)
        self.report: dict = {}

    @property
    def num_layers(self) -> int:
        return self.detector.num_layers

    def accumulate(self, grads) -> None:
        self.detector.accumulate(grads)

    def prepare(self, like) -> None:
        self.detector.prepare(like)

    def accumulate_layers(self, layers, grads) -> None:
        self.detector.accumulate_layers(layers, grads)

    def end_step(self) -> None:
        self.detector.end_step()

    def errors_of(self, matrix: torch.Tensor, ranks: Sequence[int]) -> list[float]:
        """One layer's error at each candidate rank (a subclass may measure another error)."""
        return rank_errors(matrix, ranks)

    def error_table(self) -> list[list[float]]:
        """Each layer's error at each candidate rank, on this epoch's sums (zeros before any)."""
        sums = self.detector.epoch_sums()
        if sums is None:
            return [[0.0] * len(self.ranks) for _ in self.layer_shapes]
        return [self.errors_of(total.reshape(shape), self.ranks)
                for total, shape in zip(sums, self.layer_shapes)]

    def end_epoch(self, epoch: int, lr_now: float, lr_next: float) -> dict:
        errors = self.error_table()
        critical = self.detector.end_epoch(epoch, lr_now, lr_next)
        self.report = {**self.detector.report, "ranks": list(self.ranks), "errors": errors}
        return {"critical": critical, "errors": errors}

    def state_dict(self) -> dict:
        return {"detector": self.detector.state_dict(), "ranks": list(self.ranks),
                "report": dict(self.report)}

    def load_state_dict(self, state: dict, strict: bool = True) -> None:
        if list(state["ranks"]) != self.ranks:
            raise ValueError(f"L-GreCo candidates differ from the checkpoint: {self.ranks} vs "
                             f"{state['ranks']}")
        self.detector.load_state_dict(state["detector"], strict=strict)
        self.report = dict(state["report"])
