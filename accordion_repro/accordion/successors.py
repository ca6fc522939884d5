"""Schedules of the methods that came after Accordion, in the same harness (docs/schedules.md).

- `lgreco`: L-GreCo's per-layer ranks from a knapsack over measured compression errors, the
  budget set by the uniform rank r0 (accordion/lgreco.py has the measurement and the DP).
- `lgreco_accordion`: the same DP, the budget set by the ranks Accordion's detector chose.
- `phase_rule`: a zero-cost rule in the spirit of LEGACY: each layer's level looked up from the
  phase of training and the layer's size, no gradient statistics at all.

Each needs the (n, m) shape of every compressible layer (`layer_shapes`, the reducer's
`matrix_shapes`), which build_schedule passes on.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..comm.config import check_level
from ..errors import ConfigError
from ..options import Options, Settings, as_epoch, is_int, option
from .detector import CriticalRegimeDetector, DetectorSettings
from .lgreco import ErrorProbe, candidate_ranks, choose_ranks, layer_cost
from .schedules import (Plan, Schedule, ScheduleOptions, _detector, _expect_flags, _level,
                        _level_pair, _levels)


def _rank(o: ScheduleOptions, option: str) -> int:
    """A PowerSGD rank: the schedule chooses ranks, so the compressor must take ranks."""
    c = o.context
    if c.level_kind is not int:
        raise ConfigError("schedule.name",
                          f"schedule {c.schedule!r} chooses PowerSGD ranks, but compressor "
                          f"{c.compressor!r} takes none; use compressor=powersgd or acp_powersgd")
    return o.integer(option, what="a PowerSGD rank")


def _ascending_ints(o: ScheduleOptions, option: str) -> list[int]:
    values, key = o.get(option), o.key(option)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) \
            or not all(is_int(v) and v >= 1 for v in values):
        raise ConfigError(key, f"must be a list of integers >= 1, got {values!r}")
    if list(values) != sorted(set(values)):
        raise ConfigError(key, f"must be strictly ascending, got {list(values)!r}")
    return [int(v) for v in values]


def _boundaries(o: ScheduleOptions, option: str) -> list[int]:
    """Epochs (or fractions of the run) at which the 2nd, 3rd, ... phase starts. Ascending; two
    equal ones leave a phase empty (a short run may round fractions together)."""
    values, key = o.get(option), o.key(option)
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise ConfigError(key, f"must be a list of epochs or fractions, got {values!r}")
    total = o.context.total_epochs
    epochs = [as_epoch(v, f"{key}[{i}]", total) for i, v in enumerate(values)]
    if epochs != sorted(epochs):
        raise ConfigError(key, f"must be ascending, got {epochs}")
    for i, epoch in enumerate(epochs):
        if total is not None and epoch >= total:
            raise ConfigError(f"{key}[{i}]", f"{values[i]!r} starts a phase at epoch {epoch}, "
                              f"after the last epoch of the {total}-epoch run ({total - 1}), so "
                              f"that phase would never run; the latest feasible boundary is "
                              f"{total - 1}")
    return epochs


def _table(o: ScheduleOptions, option: str) -> list[list]:
    """levels[phase][size group], each entry a level of the run's compressor."""
    rows, key = o.get(option), o.key(option)
    if isinstance(rows, (str, bytes)) or not isinstance(rows, Sequence) or not rows:
        raise ConfigError(key, f"must be a list of rows (one per phase), got {rows!r}")
    if o.context.level_kind is None:
        _level(o, option)  # raises the one error of a compressor without levels
    table = []
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not isinstance(row, Sequence) or not row:
            raise ConfigError(f"{key}[{i}]", f"must be a list of levels (one per size group), "
                                             f"got {row!r}")
        table.append([check_level(o.context.level_kind, value, f"{key}[{i}][{j}]")
                      for j, value in enumerate(row)])
    return table


@dataclass(frozen=True, kw_only=True)
class LGreCoSettings(Settings):
    SECTION = "schedule"
    r0: int = option(_rank, help="the uniform rank whose compression error sets the budget")
    # candidates floor(gamma r0) .. ceil(beta r0); budget alpha x the reference error; the DP's
    # error grid in steps of the reference (the released DPBUCKETS)
    gamma: float = option(
        Options.number, high=1.0, closed="high", default=0.5,
        help="the smallest candidate rank is floor(gamma x r0)")
    beta: float = option(
        Options.number, low=1.0, closed="low", default=2.0,
        help="the largest candidate rank is ceil(beta x r0)")
    alpha: float = option(
        Options.number, default=1.0,
        help="the error budget is alpha x the reference error")
    bins: int = option(
        Options.integer, default=10_000,
        help="steps of the dynamic programme's error grid (the released DPBUCKETS)")
    # alpha < 1 may leave no plan within the budget (only the reference plan is sure to fit):
    # refuse it before the run, or let the released code's fallback act (every layer at its
    # least-error rank)
    no_plan: str = option(
        Options.choice, ("refuse", "least_error"), default="refuse", added="least_error",
        help="what alpha < 1 may lead to, where no plan fits: refuse it before the run, or "
             "fall back to each layer's least-error rank")

    @property
    def ranks(self) -> list[int]:
        return candidate_ranks(self.r0, self.gamma, self.beta)


@dataclass(frozen=True, kw_only=True)
class LGreCoAccordionSettings(LGreCoSettings, DetectorSettings):
    low: int = option(
        _rank,
        help="Accordion's rank inside critical regimes (sets the budget there)")
    high: int = option(_rank, help="Accordion's rank outside critical regimes")

    def __post_init__(self):
        _level_pair("low", self.low, "high", self.high)
        for name in ("low", "high"):
            if getattr(self, name) not in self.ranks:
                raise ConfigError(f"schedule.{name}",
                                  f"{getattr(self, name)} is not among L-GreCo's candidate ranks "
                                  f"{self.ranks} (r0, gamma, beta); the budget needs its error")


@dataclass(frozen=True, kw_only=True)
class PhaseRuleSettings(Settings):
    SECTION = "schedule"
    boundaries: list = option(
        _boundaries,
        help="the epochs (or fractions of the run) where phases 2, 3, ... start")
    splits: list = option(
        _ascending_ints,
        help="layer sizes (entries) that start size groups 2, 3, ...")
    levels: list = option(_table, help="levels[phase][size group]")

    def __post_init__(self):
        if len(self.levels) != len(self.boundaries) + 1:
            raise ConfigError("schedule.levels", f"has {len(self.levels)} rows; "
                                                 f"{len(self.boundaries)} boundaries make "
                                                 f"{len(self.boundaries) + 1} phases")
        for i, row in enumerate(self.levels):
            if len(row) != len(self.splits) + 1:
                raise ConfigError(f"schedule.levels[{i}]",
                                  f"has {len(row)} levels; {len(self.splits)} splits make "
                                  f"{len(self.splits) + 1} size groups")


class _ShapedSchedule(Schedule):
    """A schedule that needs each compressible layer's (n, m)."""

    layer_shapes_needed = True  # build_schedule passes its layer_shapes on
    sets_levels = True  # per layer, from its shape (and the epoch, or a measurement)

    def __init__(self, num_layers: int, settings=None, *, layer_shapes=None, **kwargs):
        if layer_shapes is None or len(layer_shapes) != num_layers:
            got = None if layer_shapes is None else len(layer_shapes)
            raise ValueError(f"schedule {self.name!r} needs layer_shapes, the (n, m) of each of "
                             f"the {num_layers} compressible layers (reducer.matrix_shapes), "
                             f"got {got}")
        self.layer_shapes = [(int(n), int(m)) for n, m in layer_shapes]
        super().__init__(num_layers, settings, **kwargs)


class LGreCoSchedule(_ShapedSchedule):
    """L-GreCo: every epoch, the ranks of least total size whose summed compression error stays
    within alpha x the error of the reference levels (uniform r0), from rank 0's error table."""

    name = "lgreco"
    Settings = LGreCoSettings
    granularity = "layer"

    def __init__(self, num_layers: int, settings=None, **kwargs):
        self.ranks = settings.ranks
        super().__init__(num_layers, settings, **kwargs)
        self.costs = [[layer_cost(shape, r) for r in self.ranks] for shape in self.layer_shapes]

    @property
    def needs_detector(self) -> bool:
        return True

    def make_detector(self) -> ErrorProbe:
        detector = (_detector(self) if isinstance(self.settings, DetectorSettings)
                    else CriticalRegimeDetector(self.num_layers))  # its epoch sums only
        return ErrorProbe(detector, self.layer_shapes, self.ranks)

    def check_feasible(self) -> None:
        s = self.settings
        if s.alpha < 1.0 and s.no_plan == "refuse":
            raise ConfigError("schedule.alpha", f"{s.alpha:g} is below 1: only the reference "
                              f"plan is sure to fit within alpha x its error, so an epoch may "
                              f"have no plan and fall back to every layer's least-error rank; "
                              f"the nearest value sure to have a plan is 1 (or set "
                              f"schedule.no_plan=least_error to accept the fallback)")

    def initial_plan(self) -> Plan:
        return Plan(levels=[self.settings.r0] * self.num_layers, global_batch=None)

    def reference_levels(self) -> list[int]:
        """The levels whose summed error, times alpha, is the budget."""
        return [self.settings.r0] * self.num_layers

    def on_epoch_end(self, epoch: int, measurement) -> Plan:
        errors = _expect_errors(self, measurement)
        reference = sum(layer[self.ranks.index(level)]
                        for layer, level in zip(errors, self.reference_levels()))
        chosen = choose_ranks(errors, self.costs, reference, self.settings.alpha,
                              self.settings.bins)
        return self._set(Plan(levels=[self.ranks[c] for c in chosen], global_batch=None))


class LGreCoAccordionSchedule(LGreCoSchedule):
    """L-GreCo + Accordion: Accordion's detector picks low or high per layer, and the error of
    that choice (times alpha) is L-GreCo's budget; epoch 0 runs Accordion's all-low plan."""

    name = "lgreco_accordion"
    Settings = LGreCoAccordionSettings

    def initial_plan(self) -> Plan:
        return Plan(levels=[self.settings.low] * self.num_layers, global_batch=None)

    def _initial_flags(self):
        return [True] * self.num_layers, None

    def reference_levels(self) -> list[int]:
        return _levels(self.settings, self._critical)

    def on_epoch_end(self, epoch: int, measurement) -> Plan:
        self._critical = _expect_flags(self, (measurement or {}).get("critical"))
        return super().on_epoch_end(epoch, measurement)


def _expect_errors(schedule: LGreCoSchedule, measurement) -> list[list[float]]:
    errors = None if not isinstance(measurement, dict) else measurement.get("errors")
    if errors is None or len(errors) != schedule.num_layers \
            or any(len(layer) != len(schedule.ranks) for layer in errors):
        raise ValueError(f"schedule {schedule.name!r} expects an error table of "
                         f"{schedule.num_layers} layers x {len(schedule.ranks)} ranks from its "
                         "ErrorProbe; build it with schedule.make_detector()")
    return [[float(e) for e in layer] for layer in errors]


class PhaseRuleSchedule(_ShapedSchedule):
    """A zero-cost rule (after LEGACY): levels[phase][size group], no gradient statistics.

    A layer of n x m entries is in the first size group whose split exceeds n m (the last
    group when none does); epoch e is in phase 1 + (number of boundaries <= e).
    """

    name = "phase_rule"
    Settings = PhaseRuleSettings

    def phase_of(self, epoch: int) -> int:
        return sum(1 for start in self.settings.boundaries if epoch >= start)

    def group_of(self, shape: tuple[int, int]) -> int:
        size = shape[0] * shape[1]
        return next((i for i, split in enumerate(self.settings.splits) if size < split),
                    len(self.settings.splits))

    def levels_at(self, epoch: int) -> list:
        row = self.settings.levels[self.phase_of(epoch)]
        return [row[self.group_of(shape)] for shape in self.layer_shapes]

    def initial_plan(self) -> Plan:
        return Plan(levels=self.levels_at(0), global_batch=None)

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        return self.replan(epoch + 1)

    def replan(self, epoch: int) -> Plan:
        """A function of the epoch: after an allowed change of trainer.epochs (fraction
        boundaries move) or of the table, the plan is made afresh from the first resumed epoch."""
        return self._set(Plan(levels=self.levels_at(epoch), global_batch=None))


SUCCESSOR_SCHEDULES = (LGreCoSchedule, LGreCoAccordionSchedule, PhaseRuleSchedule)
