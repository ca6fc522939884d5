"""`schedule=auto`: Accordion whose levels and eta are chosen from the gradients (issue 42).

The paper leaves the user two choices, the levels (`low`, `high`) and the detector's
threshold `eta`; this suite's eta sweep showed how much they matter on a short schedule. Here
both come from what rank 0 already measures:

- *Endpoints per layer, from error targets.* At every check rank 0 takes the epoch's summed
  local gradient of each layer (the detector's own sums, as L-GreCo does), and for each
  candidate PowerSGD rank r (1, 2, 4, ... up to `max_rank`) its relative error
  e(r) = ||G - G_r|| / ||G||, G_r the best rank-r approximation: exact singular values
  (`torch.linalg.svdvals` in float64; at CIFAR sizes one SVD per layer and check costs
  milliseconds beside an epoch, and warm-started power iterations would only bound e(r)).
  `low` is the cheapest candidate with e <= `error_low`, `high` the cheapest with
  e <= `error_high` (looser, so never more than `low`). Either may be pinned to a rank. With
  `budget` (a share of the dense gradient's floats per step) the high plan is instead the one of
  least summed error whose floats fit the budget, by L-GreCo's knapsack (lgreco.py).
- *eta from a traffic share.* With `low_share` = f, eta becomes the (1 - f) quantile of this
  check's per-layer norm ratios |prev - cur| / prev, floored at `eta_floor`: about f of the
  layers run at `low` after each check. f = 1 is static `low`, f = 0 static `high` (the floor
  aside, which only ever raises eta). Without `low_share`, `eta` is the detector's, fixed.
- Accordion's other rules stay: everything is critical at the first check and, with
  `lr_decay_rule`, after each LR decay; a decision holds until the next check.

With `low` and `high` pinned and no `low_share`, this is exactly `schedule=accordion`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..errors import ConfigError
from ..options import Options, option
from .detector import CriticalRegimeDetector, DetectorSettings
from .lgreco import ErrorProbe, layer_cost, least_total_within, rank_errors
from .schedules import Plan, ScheduleOptions, _detector
from .successors import _rank, _ShapedSchedule


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


def cheapest_within(errors: Sequence[float], costs: Sequence[int], target: float) -> int:
    """The index of the cheapest candidate whose error is at most `target` (of equal costs,
    the smaller error); the least-error candidate when none reaches it."""
    fitting = [i for i, error in enumerate(errors) if error <= target + 1e-12]
    if not fitting:
        return min(range(len(errors)), key=lambda i: (errors[i], costs[i]))
    return min(fitting, key=lambda i: (costs[i], errors[i]))


def least_error_within(errors: Sequence[Sequence[float]], costs: Sequence[Sequence[int]],
                       budget: float, bins: int) -> list[int]:
    """Per layer, the candidate index of least summed error with summed cost <= budget: L-GreCo's
    knapsack (lgreco.least_total_within) with the roles of error and size swapped. Costs are
    rounded *up* to multiples of budget / bins, so a plan found never exceeds the budget (one
    that fits by less than layers x budget / bins may be missed); when nothing fits, the
    cheapest candidates."""
    step = budget / bins
    units = [[math.ceil(cost / step - 1e-9) for cost in layer] for layer in costs]
    chosen = least_total_within(units, errors, bins)
    return chosen if chosen is not None else [min(range(len(c)), key=c.__getitem__) for c in costs]


def eta_for_share(ratios: Sequence[float | None], share: float, floor: float = 0.0) -> float:
    """The threshold that flags about `share` of the layers: the (1 - share) quantile of the
    ratios, so that round(share x layers) of them reach it (ties may flag more), floored at
    `floor`. share 1 flags everything (0), share 0 nothing (infinity). A layer without a ratio
    (its norm was 0 at the last check) is critical whatever eta is, as in the detector."""
    if share >= 1.0:
        return 0.0
    known = sorted((r for r in ratios if r is not None), reverse=True)
    flagged = round(share * len(known))
    if flagged == 0 or not known:
        return math.inf
    return max(known[flagged - 1], floor)


def _optional_rank(o: ScheduleOptions, option_name: str) -> int | None:
    """A pinned endpoint (a PowerSGD rank), or None: chosen from its error target."""
    return None if o.get(option_name, None) is None else _rank(o, option_name)


@dataclass(frozen=True, kw_only=True)
class AutoSettings(DetectorSettings):
    # the relative error e(r) = ||G - G_r|| / ||G|| the low level must reach, and the looser
    # one of the high level
    error_low: float = option(
        Options.number, high=1.0, closed="high", default=0.5,
        help="the relative error ||G - G_r|| / ||G|| the low level must reach")
    error_high: float = option(
        Options.number, high=1.0, closed="high", default=0.75,
        help="the looser error the high level must reach")
    max_rank: int = option(
        _rank, default=16,
        help="the largest candidate rank (candidates 1, 2, 4, ..., max_rank; PowerSGD only)")
    # pin an endpoint to a rank instead (null: chosen from the error target)
    low: int | None = option(
        _optional_rank, default=None,
        help="pin the low level to this rank (null: chosen from error_low)")
    high: int | None = option(
        _optional_rank, default=None,
        help="pin the high level to this rank (null: chosen from error_high)")
    # the share of layers to run at low after each check (null: eta as given)
    low_share: float | None = option(
        Options.number, high=1.0, closed="low+high", optional=True, default=None,
        help="the share of layers to run at low after each check (null: eta as given)")
    eta_floor: float = option(
        Options.number, closed="low", default=0.0,
        help="the floor of the eta a low_share sets")
    # a traffic budget for the high level instead of error_high: the floats one step may send
    # with every layer at `high`, as a share of the dense gradient's; the DP's grid in steps of it
    budget: float | None = option(
        Options.number, high=1.0, closed="high", optional=True, default=None,
        help="a traffic budget for the high level instead of error_high, as a share of the dense "
             "gradient's floats")
    bins: int = option(
        Options.integer, default=10_000,
        help="steps of the dynamic programme's error grid")

    def __post_init__(self):
        if self.error_high < self.error_low:
            raise ConfigError("schedule.error_high",
                              f"{self.error_high} is tighter than schedule.error_low = "
                              f"{self.error_low}; the high level's error bound must be the looser")
        for name in ("low", "high"):
            pinned = getattr(self, name)
            if pinned is not None and pinned > self.max_rank:
                raise ConfigError(f"schedule.{name}", f"{pinned} is above schedule.max_rank = "
                                                      f"{self.max_rank}, the largest candidate")
        if self.low is not None and self.high is not None and self.high > self.low:
            raise ConfigError("schedule.high", f"{self.high} compresses less than schedule.low = "
                                               f"{self.low}")


class RelativeErrorProbe(ErrorProbe):
    """ErrorProbe whose table is relative (e(r) = ||G - G_r|| / ||G||) and whose result also
    carries the detector's ratios, so the schedule can set its own eta."""

    def errors_of(self, matrix: torch.Tensor, ranks: Sequence[int]) -> list[float]:
        return relative_errors(matrix, ranks)

    def end_epoch(self, epoch: int, lr_now: float, lr_next: float) -> dict:
        measured = super().end_epoch(epoch, lr_now, lr_next)
        report = self.detector.report
        return {**measured, "checked": report["checked"], "ratios": report["ratios"],
                "lr_rule_fired": report["lr_rule_fired"]}


class AutoSchedule(_ShapedSchedule):
    """Per layer: `low` where the layer is critical, `high` elsewhere, both chosen from the
    layer's error table at each check, and eta from the traffic share (module docstring)."""

    name = "auto"
    Settings = AutoSettings
    granularity = "layer"

    def __init__(self, num_layers: int, settings=None, **kwargs):
        self.ranks = power_of_two_ranks(settings.max_rank)
        super().__init__(num_layers, settings, **kwargs)
        self.costs = [[layer_cost(shape, r) for r in self.ranks] for shape in self.layer_shapes]
        self.eta = settings.eta
        # until the first table, the pinned ranks or the largest candidate (no error known)
        self.endpoints = [(settings.low or self.ranks[-1], settings.high or settings.low
                           or self.ranks[-1])] * num_layers

    @property
    def needs_detector(self) -> bool:
        return True

    def make_detector(self) -> RelativeErrorProbe:
        detector: CriticalRegimeDetector = _detector(self)
        return RelativeErrorProbe(detector, self.layer_shapes, self.ranks)

    def initial_plan(self) -> Plan:
        low = self.settings.low or self.settings.max_rank
        return Plan(levels=[low] * self.num_layers, global_batch=None)

    def _initial_flags(self):
        return [True] * self.num_layers, None

    def choose_endpoints(self, errors: Sequence[Sequence[float]]) -> list[tuple[int, int]]:
        """(low, high) per layer from its error table; a pinned endpoint stays pinned."""
        s, chosen = self.settings, []
        if s.budget is not None:  # the whole high plan within the budget, least summed error
            dense = sum(n * m for n, m in self.layer_shapes)
            picks = least_error_within(errors, self.costs, s.budget * dense, s.bins)
        else:
            picks = [cheapest_within(e, c, s.error_high) for e, c in zip(errors, self.costs)]
        for layer_errors, costs, pick in zip(errors, self.costs, picks):
            low = s.low or self.ranks[cheapest_within(layer_errors, costs, s.error_low)]
            high = s.high or self.ranks[pick]
            chosen.append((low, min(high, low)))
        return chosen

    def on_epoch_end(self, epoch: int, measurement) -> Plan:
        m = _expect_measurement(self, measurement)
        if m["checked"]:
            self.endpoints = self.choose_endpoints(m["errors"])
            ratios = m["ratios"]
            if ratios is None:  # the first check: nothing to compare with, all critical
                flags = [True] * self.num_layers
            else:
                if self.settings.low_share is not None:
                    self.eta = eta_for_share(ratios, self.settings.low_share, self.settings.eta_floor)
                flags = [r is None or r >= self.eta for r in ratios]
        else:
            flags = list(self._critical)
        if m["lr_rule_fired"]:
            flags = [True] * self.num_layers
        self._critical = flags
        levels = [low if critical else high for critical, (low, high) in zip(flags, self.endpoints)]
        return self._set(Plan(levels=levels, global_batch=None))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "eta": self.eta,
                "endpoints": [list(pair) for pair in self.endpoints]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.eta = float(state["eta"])
        self.endpoints = [(int(low), int(high)) for low, high in state["endpoints"]]

    def info(self) -> dict:
        return {**super().info(), "eta": self.eta}


def _expect_measurement(schedule: AutoSchedule, measurement) -> dict:
    keys = ("critical", "errors", "checked", "ratios", "lr_rule_fired")
    if not isinstance(measurement, dict) or any(key not in measurement for key in keys) \
            or len(measurement["errors"]) != schedule.num_layers:
        raise ValueError(f"schedule {schedule.name!r} expects its RelativeErrorProbe's "
                         f"measurement ({', '.join(keys)}) over {schedule.num_layers} layers; "
                         "build it with schedule.make_detector()")
    return measurement
