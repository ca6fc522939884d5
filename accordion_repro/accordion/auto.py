"""`schedule=auto`: Accordion whose levels and eta are chosen from the gradients (issue 42).

The paper leaves the user two choices, the levels (`low`, `high`) and the detector's
threshold `eta`; this suite's eta sweep showed how much they matter on a short schedule. Here
both come from what rank 0 already measures:

- *Endpoints per layer, from error targets.* At every check rank 0 takes the epoch's summed
  local gradient of each layer (the detector's own sums, as L-GreCo does), and for each
  candidate level (candidates.py: PowerSGD ranks 1, 2, 4, ... `max_rank`; Top-K fractions on a
  log grid below the break-even 1 / (2 x world size)) its relative error e: for a rank
  ||G - G_r|| / ||G|| from the exact singular values, for a fraction sqrt(1 - top-k energy
  share). `low` is the cheapest candidate with e <= `error_low`, `high` the cheapest with
  e <= `error_high` (looser, so never more than `low`). Either may be pinned to a level.
- *Or `high` from a budget.* With `budget` (a share of the dense gradient's floats per step),
  or `step_time` on a link (`link_bps`, `latency_s`, `compute_time`: the step priced by
  accordion_repro/costmodel.py's alpha-beta model, StepExchange), the high plan is the one of least
  summed error within it, by L-GreCo's knapsack (lgreco.least_total_within) on a grid of
  budget / bins, then filled exactly (fill_up): no layer could step up within the budget.
- *eta from a traffic share.* With `low_share` = f, eta becomes the (1 - f) quantile of this
  check's per-layer norm ratios |prev - cur| / prev, floored at `eta_floor` and at `noise_z`
  times the measured noise of the ratio (noise_level: from the epoch-to-epoch norms of the
  current LR phase, with a linear trend cancelled): about f of the layers run at `low` after
  each check, but none whose change is within noise. f = 1 is static `low`, f = 0 static
  `high` (the floors only ever raise eta). Without `low_share`, `eta` is the detector's, fixed.
- Accordion's other rules stay: everything is critical at the first check and, with
  `lr_decay_rule`, after each LR decay; a decision holds until the next check.

With `low` and `high` pinned and no `low_share`, this is exactly `schedule=accordion`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..costmodel import Network
from ..errors import ConfigError
from ..options import Options, is_int, option
from .candidates import candidates_for, step_exchange
from .detector import CriticalRegimeDetector, DetectorSettings
from .lgreco import ErrorProbe, least_total_within
from .schedules import Plan, ScheduleContext, ScheduleOptions, _detector, _level, _level_pair
from .successors import _ShapedSchedule


def _up(value: float) -> str:
    """`value` rounded up to 3 significant digits, as a value the user can pass back."""
    if value <= 0:
        return "0"
    scale = 10 ** (math.floor(math.log10(value)) - 2)
    return f"{math.ceil(value / scale - 1e-9) * scale:.3g}"


def cheapest_within(errors: Sequence[float], costs: Sequence[int], target: float) -> int:
    """The index of the cheapest candidate whose error is at most `target` (of equal costs,
    the smaller error); the least-error candidate when none reaches it."""
    fitting = [i for i, error in enumerate(errors) if error <= target + 1e-12]
    if not fitting:
        return min(range(len(errors)), key=lambda i: (errors[i], costs[i]))
    return min(fitting, key=lambda i: (costs[i], errors[i]))


def least_error_within(errors: Sequence[Sequence[float]], costs: Sequence[Sequence[float]],
                       budget: float, bins: int) -> list[int]:
    """Per layer, the candidate index of least summed error with summed cost <= budget: L-GreCo's
    knapsack (lgreco.least_total_within) with the roles of error and size swapped. Costs are
    rounded *up* to multiples of budget / bins, so a plan found never exceeds the budget; what
    the grid leaves unspent is then filled (fill_up), so no layer could step up within it.
    When the grid fits nothing, the cheapest candidates, filled up the same way if they fit the
    budget themselves (a coarse grid rounds every cost up, and can leave a feasible budget
    without a plan); when even they do not, the cheapest candidates (config.validate refuses
    such a budget before the run)."""
    cheapest = [min(range(len(c)), key=c.__getitem__) for c in costs]
    if not budget > 0:
        return cheapest
    step = budget / bins
    units = [[math.ceil(cost / step - 1e-9) for cost in layer] for layer in costs]
    chosen = least_total_within(units, errors, bins)
    if chosen is None:
        if sum(c[i] for c, i in zip(costs, cheapest)) > budget:
            return cheapest
        chosen = cheapest
    return fill_up(chosen, errors, costs, budget)


def fill_up(chosen: Sequence[int], errors: Sequence[Sequence[float]],
            costs: Sequence[Sequence[float]], budget: float) -> list[int]:
    """Raise layers one candidate at a time while the exact summed cost stays within the budget,
    the largest error drop first (then the smaller extra cost, then the earlier layer); a step
    that lowers no error is never taken. Afterwards every step up that would lower a layer's
    error exceeds the budget: the property the step-time budget promises."""
    chosen = list(chosen)

    def spent_with(layer: int, index: int) -> float:
        return sum(costs[j][index if j == layer else i] for j, i in enumerate(chosen))

    while True:
        best = None
        for layer, i in enumerate(chosen):
            if i + 1 >= len(costs[layer]) or not errors[layer][i + 1] < errors[layer][i] \
                    or spent_with(layer, i + 1) > budget:
                continue
            key = (errors[layer][i] - errors[layer][i + 1],
                   costs[layer][i] - costs[layer][i + 1], -layer)
            if best is None or key > best[0]:
                best = (key, layer)
        if best is None:
            return chosen
        chosen[best[1]] += 1


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


def noise_level(history: Sequence[Sequence[float]]) -> float:
    """The spread a check's norm ratio |prev - cur| / prev shows on gradients whose norm only
    fluctuates, measured from consecutive epochs' per-layer norms (history[t][layer], the
    epochs of one LR phase).

    Each triple of consecutive epochs gives d = (n[t] - 2 n[t-1] + n[t-2]) / n[t-1], which a
    linear trend cancels exactly: if each epoch's norm carries an independent relative
    fluctuation of s.d. sigma, d has variance 6 sigma^2, and a ratio of two epochs with no
    trend has s.d. sqrt(2) sigma = rms(d) / sqrt(3). Per layer rms(d) / sqrt(3); the median over
    the layers (0 with fewer than 3 epochs)."""
    per_layer = []
    for layer in range(len(history[0]) if history else 0):
        norms = [epoch[layer] for epoch in history]
        d = [(norms[t] - 2 * norms[t - 1] + norms[t - 2]) / norms[t - 1]
             for t in range(2, len(norms)) if norms[t - 1] > 0]
        if d:
            per_layer.append(math.sqrt(sum(x * x for x in d) / len(d) / 3))
    if not per_layer:
        return 0.0
    per_layer.sort()
    middle = len(per_layer) // 2
    return per_layer[middle] if len(per_layer) % 2 else (per_layer[middle - 1] + per_layer[middle]) / 2


def _optional_level(o: ScheduleOptions, option_name: str):
    """A pinned endpoint (a level of the run's compressor), or None: chosen from its target."""
    return None if o.get(option_name, None) is None else _level(o, option_name)


def _max_rank(o: ScheduleOptions, option_name: str) -> int:
    """The largest PowerSGD candidate (read, and unused, under Top-K, whose grid is
    min_fraction's); a compressor without levels is refused here, in schedules' one wording,
    and one whose levels are neither (precision's bits: no error table to choose from)."""
    c = o.context
    if c.level_kind is None:
        _level(o, option_name)
    if c.level_kind not in (int, float):
        raise ConfigError("schedule.name",
                          f"schedule {c.schedule!r} chooses PowerSGD ranks or Top-K fractions "
                          f"from their measured errors, but compressor {c.compressor!r} takes "
                          "neither; use schedule=accordion with two of its levels")
    return o.integer(option_name, what="a PowerSGD rank")


def _min_fraction(o: ScheduleOptions, option_name: str) -> float:
    """The smallest Top-K candidate; it must leave at least one below the break-even."""
    value = o.number(option_name, high=1.0)
    largest = 1.0 / (4 * o.context.world_size)
    if o.context.level_kind is float and value > largest:
        raise o.error(option_name, f"{value:g} is above {largest:g}, the largest Top-K candidate "
                                   f"on {o.context.world_size} ranks (half the break-even "
                                   "1 / (2 x world size))")
    return value


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
        _max_rank, default=16,
        help="the largest candidate rank (candidates 1, 2, 4, ..., max_rank; PowerSGD only)")
    min_fraction: float = option(
        _min_fraction, default=0.001,
        help="the smallest Top-K fraction of the candidate grid (Top-K only)")
    # pin an endpoint to a level instead (null: chosen from the error target)
    low: int | float | None = option(
        _optional_level, default=None,
        help="pin the low level to this rank or fraction (null: chosen from error_low)")
    high: int | float | None = option(
        _optional_level, default=None,
        help="pin the high level to this rank or fraction (null: chosen from error_high)")
    # the share of layers to run at low after each check (null: eta as given)
    low_share: float | None = option(
        Options.number, high=1.0, closed="low+high", optional=True, default=None,
        help="the share of layers to run at low after each check (null: eta as given)")
    eta_floor: float = option(
        Options.number, closed="low", default=0.0,
        help="the floor of the eta a low_share sets")
    noise_z: float = option(
        Options.number, closed="low", default=2.0,
        help="eta is floored at noise_z x the measured noise of the norm ratio (0: no floor)")
    # a traffic budget for the high level instead of error_high: the floats one step may send
    # with every layer at `high`, as a share of the dense gradient's
    budget: float | None = option(
        Options.number, high=1.0, closed="high", optional=True, default=None,
        help="a traffic budget for the high level instead of error_high, as a share of the dense "
             "gradient's floats")
    # or a step-time budget (seconds) on a link of link_bps bits/s and latency_s per message:
    # the predicted step (compute_time + the exchange at `high`) must fit within step_time
    step_time: float | None = option(
        Options.number, optional=True, default=None,
        help="a step-time budget in seconds for the high level (with link_bps), instead of "
             "error_high")
    compute_time: float = option(
        Options.number, closed="low", default=0.0,
        help="the step's compute seconds the step-time budget adds to the exchange")
    link_bps: float | None = option(
        Options.number, optional=True, default=None,
        help="the link's rate in bits per second for the step-time budget")
    latency_s: float = option(
        Options.number, closed="low", default=50e-6,
        help="the link's latency per message in seconds for the step-time budget")
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
            if is_int(pinned) and pinned > self.max_rank:
                raise ConfigError(f"schedule.{name}", f"{pinned} is above schedule.max_rank = "
                                                      f"{self.max_rank}, the largest candidate")
        if self.low is not None and self.high is not None:
            _level_pair("low", self.low, "high", self.high)
        if self.budget is not None and self.step_time is not None:
            raise ConfigError("schedule.step_time", "give a traffic budget (schedule.budget) or "
                                                    "a step-time budget, not both")
        if (self.step_time is None) != (self.link_bps is None):
            given, missing = (("step_time", "link_bps") if self.link_bps is None
                              else ("link_bps", "step_time"))
            raise ConfigError(f"schedule.{missing}", f"is required with schedule.{given}: a "
                                                     "step-time budget needs both the budget "
                                                     "and the link's rate")
        if self.step_time is not None and self.compute_time >= self.step_time:
            raise ConfigError("schedule.compute_time",
                              f"{self.compute_time} s leaves nothing of schedule.step_time = "
                              f"{self.step_time} s for the gradient exchange")


class RelativeErrorProbe(ErrorProbe):
    """ErrorProbe whose table is the candidates' relative error (candidates.py) and whose result
    also carries the detector's norms and ratios, so the schedule can set its own eta."""

    def __init__(self, detector: CriticalRegimeDetector, layer_shapes, candidates):
        super().__init__(detector, layer_shapes, candidates.levels)
        self.candidates = candidates

    def errors_of(self, matrix: torch.Tensor, ranks: Sequence) -> list[float]:
        return self.candidates.errors(matrix, ranks)

    def end_epoch(self, epoch: int, lr_now: float, lr_next: float) -> dict:
        measured = super().end_epoch(epoch, lr_now, lr_next)
        report = self.detector.report
        return {**measured, "checked": report["checked"], "norms": report["norms"],
                "ratios": report["ratios"], "lr_rule_fired": report["lr_rule_fired"]}


class AutoSchedule(_ShapedSchedule):
    """Per layer: `low` where the layer is critical, `high` elsewhere, both chosen from the
    layer's error table at each check, and eta from the traffic share (module docstring)."""

    name = "auto"
    Settings = AutoSettings
    granularity = "layer"
    context_needed = True  # build_schedule passes the compressor and the world size

    def __init__(self, num_layers: int, settings=None, *, context: ScheduleContext, **kwargs):
        s = settings
        self.candidates = candidates_for(context.compressor, context.level_kind,
                                         context.world_size, s.max_rank, s.min_fraction)
        self.ranks = self.candidates.levels  # the probe's name for its candidates
        # until the first table, the pinned levels or the largest candidate (no error known)
        start = s.low if s.low is not None else self.ranks[-1]
        self.endpoints = [(start, s.high if s.high is not None else start)] * num_layers
        super().__init__(num_layers, settings, **kwargs)
        self.costs = [[self.candidates.floats(shape, level) for level in self.ranks]
                      for shape in self.layer_shapes]
        self.exchange = (None if s.step_time is None else step_exchange(
            self.candidates, Network(s.link_bps, s.latency_s), context.world_size))
        self.share_eta: float | None = None  # with low_share: the eta the last check derived
        self.noise = 0.0     # the measured noise of the ratio at the last check
        self.history: list[list[float]] = []  # per-epoch layer norms since the last LR decay
        self.predicted_step_s: float | None = None  # with step_time: the high plan's step

    @property
    def needs_detector(self) -> bool:
        return True

    def make_detector(self) -> RelativeErrorProbe:
        detector: CriticalRegimeDetector = _detector(self)
        return RelativeErrorProbe(detector, self.layer_shapes, self.candidates)

    def initial_plan(self) -> Plan:
        return Plan(levels=[low for low, _ in self.endpoints], global_batch=None)

    def _initial_flags(self):
        return [True] * self.num_layers, None

    def step_seconds(self, levels: Sequence) -> float:
        """The cost model's step time at these levels: compute_time, the collectives' latency
        and each layer's bandwidth time (accordion_repro/costmodel.py StepExchange)."""
        c = self.candidates
        return self.settings.compute_time + self.exchange.fixed_seconds() + sum(
            self.exchange.layer_seconds(c.floats(shape, level), c.op(shape, level))
            for shape, level in zip(self.layer_shapes, levels))

    def check_feasible(self) -> None:
        """A traffic or step-time budget below what every layer at its cheapest candidate needs
        has no plan; the least-error fallback would then spend more than asked, silently."""
        s = self.settings
        dense = sum(n * m for n, m in self.layer_shapes)
        cheapest = sum(min(costs) for costs in self.costs)
        if s.budget is not None and cheapest > s.budget * dense:
            raise ConfigError("schedule.budget", f"{s.budget:g} of the dense floats per step "
                              f"({s.budget * dense:,.0f} floats) is below the cheapest plan "
                              f"({cheapest:,} floats, every layer at its cheapest candidate): "
                              f"the smallest feasible budget is {_up(cheapest / dense)}")
        if s.step_time is not None:
            c = self.candidates
            fastest = self.exchange.fixed_seconds() + sum(
                min(self.exchange.layer_seconds(c.floats(shape, level), c.op(shape, level))
                    for level in self.ranks) for shape in self.layer_shapes)
            if s.compute_time + fastest > s.step_time:
                raise ConfigError("schedule.step_time",
                                  f"{s.step_time:g} s is below the fastest plan's step on this "
                                  f"link ({s.compute_time:g} s of compute + {fastest:.3g} s of "
                                  f"exchange): the smallest feasible step time is "
                                  f"{_up(s.compute_time + fastest)} s")

    def _high_picks(self, errors: Sequence[Sequence[float]]) -> list[int]:
        """Each layer's `high` candidate: within the traffic or the step-time budget at least
        summed error, else the cheapest within error_high."""
        s = self.settings
        if s.budget is not None:  # the whole high plan within the budget, least summed error
            dense = sum(n * m for n, m in self.layer_shapes)
            return least_error_within(errors, self.costs, s.budget * dense, s.bins)
        if s.step_time is not None:  # the same DP, each candidate priced in seconds
            c = self.candidates
            seconds = [[self.exchange.layer_seconds(c.floats(shape, level), c.op(shape, level))
                        for level in self.ranks] for shape in self.layer_shapes]
            room = s.step_time - s.compute_time - self.exchange.fixed_seconds()
            return least_error_within(errors, seconds, room, s.bins)
        return [cheapest_within(e, c, s.error_high) for e, c in zip(errors, self.costs)]

    def choose_endpoints(self, errors: Sequence[Sequence[float]]) -> list[tuple]:
        """(low, high) per layer from its error table; a pinned endpoint stays pinned."""
        s, chosen = self.settings, []
        for layer_errors, costs, pick in zip(errors, self.costs, self._high_picks(errors)):
            low = s.low if s.low is not None else \
                self.ranks[cheapest_within(layer_errors, costs, s.error_low)]
            high = s.high if s.high is not None else self.ranks[pick]
            chosen.append((low, min(high, low)))
        if self.exchange is not None:
            self.predicted_step_s = self.step_seconds([high for _, high in chosen])
        return chosen

    @property
    def eta(self) -> float:
        """The threshold in force: the setting (the detector's option), or with low_share the
        one the last check derived from the ratios (before the first: the setting)."""
        return self.settings.eta if self.share_eta is None else self.share_eta

    def _measure_noise(self, norms: list[float]) -> None:
        """Keep the epochs' norms the noise is measured on: the last interval + 2 epochs."""
        self.history = [*self.history, list(norms)][-(self.settings.interval + 2):]

    def on_epoch_end(self, epoch: int, measurement) -> Plan:
        m = _expect_measurement(self, measurement)
        s = self.settings
        self._measure_noise(m["norms"])
        if m["checked"]:
            self.endpoints = self.choose_endpoints(m["errors"])
            ratios = m["ratios"]
            if ratios is None:  # the first check: nothing to compare with, all critical
                flags = [True] * self.num_layers
            else:
                if s.low_share is not None:
                    self.noise = noise_level(self.history)
                    floor = max(s.eta_floor, s.noise_z * self.noise)
                    self.share_eta = eta_for_share(ratios, s.low_share, floor)
                flags = [r is None or r >= self.eta for r in ratios]
        else:
            flags = list(self._critical)
        if m["lr_rule_fired"]:
            flags = [True] * self.num_layers
            self.history = []  # a new LR phase: its norms are not the old one's noise
        self._critical = flags
        levels = [low if critical else high for critical, (low, high) in zip(flags, self.endpoints)]
        return self._set(Plan(levels=levels, global_batch=None))

    def state_dict(self) -> dict:
        return {**super().state_dict(), "eta": self.eta, "noise": self.noise,
                "history": [list(h) for h in self.history],
                "predicted_step_s": self.predicted_step_s,
                "endpoints": [list(pair) for pair in self.endpoints]}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        kind = self.candidates.kind
        # eta is state only where low_share derives it from the ratios; otherwise it is the
        # setting, which an allowed change on resume may have moved (issue 56)
        if self.settings.low_share is not None:
            self.share_eta = float(state["eta"])
        self.noise = float(state["noise"])
        self.history = [list(h) for h in state["history"]]
        self.predicted_step_s = state["predicted_step_s"]
        self.endpoints = [(kind(low), kind(high)) for low, high in state["endpoints"]]

    def info(self) -> dict:
        return {**super().info(), "eta": self.eta, "ratio_noise": self.noise,
                **({} if self.exchange is None else {"predicted_step_s": self.predicted_step_s})}


def _expect_measurement(schedule: AutoSchedule, measurement) -> dict:
    keys = ("critical", "errors", "checked", "norms", "ratios", "lr_rule_fired")
    if not isinstance(measurement, dict) or any(key not in measurement for key in keys) \
            or len(measurement["errors"]) != schedule.num_layers:
        raise ValueError(f"schedule {schedule.name!r} expects its RelativeErrorProbe's "
                         f"measurement ({', '.join(keys)}) over {schedule.num_layers} layers; "
                         "build it with schedule.make_detector()")
    return measurement
