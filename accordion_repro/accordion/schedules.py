"""Schedules: they turn detector flags (or the epoch number) into the plan for the next epoch.

A schedule never sees a compressor or a loop. The engine asks for `initial_plan()` before
epoch 0 and calls `on_epoch_end(e, flags)` at the end of epoch e; the returned Plan holds from
epoch e + 1 on. Each class has a `parse(options, context)` that checks the user's options and
returns the constructor's keyword arguments, so that validation and construction cannot drift.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from ..errors import ConfigError
from .batch import LR_SCALINGS, check_batch_order, check_global_batch, lr_scale_for
from .detector import STATISTICS, CriticalRegimeDetector
from .levels import check_compresses_more, check_level, require_compressor
from .options import as_bool, as_choice, as_epoch, as_int, as_positive_real, key_of, required
from .plan import Plan, compact_levels

# How per-layer flags become the one model-wide decision a batch size needs.
BATCH_DECISIONS = ("model_norm", "any", "majority")
BATCH_MODES = ("detector", "fixed_epoch")


@dataclass(frozen=True)
class ScheduleContext:
    """What a schedule needs to know about the rest of the run to check its options."""

    compressor: str
    base_global_batch: int
    world_size: int
    total_epochs: int | None = None


@dataclass(frozen=True)
class DetectorSettings:
    eta: float = 0.5
    interval: int = 10
    lr_decay_rule: bool = True
    statistic: str = "mean"

    OPTIONS = ("eta", "interval", "lr_decay_rule", "statistic")

    @classmethod
    def parse(cls, options: Mapping) -> DetectorSettings:
        return cls(eta=as_positive_real(options, "eta"),
                   interval=as_int(options, "interval", minimum=1),
                   lr_decay_rule=as_bool(options, "lr_decay_rule"),
                   statistic=as_choice(options, "statistic", STATISTICS))


class Schedule:
    """Base: holds the plan in force and the last flags, and reports them for metrics.jsonl."""

    name = "schedule"
    OPTIONS: tuple[str, ...] = ()

    def __init__(self, num_layers: int, *, default_level=None, base_global_batch: int | None = None):
        self.num_layers = int(num_layers)
        self.default_level = default_level
        self.base_global_batch = base_global_batch
        self._plan = self.initial_plan()
        # per-layer flags and the model-wide batch decision in force, when the schedule has them
        self._critical, self._model_critical = self._initial_flags()

    @property
    def needs_detector(self) -> bool:
        return False

    def make_detector(self) -> CriticalRegimeDetector | None:
        """The detector this schedule expects its flags from (None when it needs none)."""
        return None

    def initial_plan(self) -> Plan:
        """The plan for epoch 0 (pure: after a restore, `plan` is the one in force)."""
        raise NotImplementedError

    def _initial_flags(self) -> tuple[list[bool] | None, bool | None]:
        return None, None

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        raise NotImplementedError

    @property
    def plan(self) -> Plan:
        return Plan.from_dict(self._plan.to_dict())

    def info(self) -> dict:
        """The schedule's part of one metrics.jsonl line (JSON-ready)."""
        levels = self._plan.levels
        if levels is None:
            levels = [self.default_level] * self.num_layers
        return {
            "levels": compact_levels(levels),
            "layer_levels": list(levels),
            "critical_layers": None if self._critical is None else sum(self._critical),
            "critical_model": self._model_critical,
            "global_batch": self._plan.global_batch or self.base_global_batch,
            "lr_scale": self._plan.lr_scale,
        }

    def _set(self, plan: Plan) -> Plan:
        self._plan = plan
        return self.plan

    def state_dict(self) -> dict:
        return {"name": self.name, "num_layers": self.num_layers, "plan": self._plan.to_dict(),
                "critical": None if self._critical is None else list(self._critical),
                "model_critical": self._model_critical}

    def load_state_dict(self, state: dict) -> None:
        if state["name"] != self.name or state["num_layers"] != self.num_layers:
            raise ValueError(f"checkpoint holds schedule {state['name']!r} over "
                             f"{state['num_layers']} layers, not {self.name!r} over "
                             f"{self.num_layers}")
        self._plan = Plan.from_dict(state["plan"])
        self._critical = None if state["critical"] is None else list(state["critical"])
        self._model_critical = state["model_critical"]

    @classmethod
    def parse(cls, options: Mapping, context: ScheduleContext) -> dict:
        raise NotImplementedError


class StaticSchedule(Schedule):
    """The compressor's own level, the trainer's own batch, all run long."""

    name = "static"

    def initial_plan(self) -> Plan:
        return Plan(levels=None, global_batch=None, lr_scale=1.0)

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        return self.plan

    @classmethod
    def parse(cls, options: Mapping, context: ScheduleContext) -> dict:
        return {}


class _DetectorDriven(Schedule):
    """Shared by the schedules that follow the detector's flags."""

    granularity = "layer"

    def __init__(self, num_layers: int, *, detector: DetectorSettings = DetectorSettings(),
                 **kwargs):
        self.detector_settings = detector
        super().__init__(num_layers, **kwargs)

    @property
    def needs_detector(self) -> bool:
        return True

    def make_detector(self) -> CriticalRegimeDetector:
        return CriticalRegimeDetector(self.num_layers, granularity=self.granularity,
                                      **asdict(self.detector_settings))

    def _expect_flags(self, critical: Sequence[bool] | None) -> list[bool]:
        expected = {"layer": self.num_layers, "model": 1,
                    "layer+model": self.num_layers + 1}[self.granularity]
        if critical is None or len(critical) != expected:
            got = None if critical is None else len(critical)
            raise ValueError(f"schedule {self.name!r} expects {expected} detector flags "
                             f"(granularity {self.granularity!r}), got {got}; build the detector "
                             "with schedule.make_detector()")
        return [bool(c) for c in critical]


def _batch_decision(flags: list[bool], decision: str) -> bool:
    """One model-wide "critical" from per-layer flags (model_norm passes its single flag)."""
    if decision == "any":
        return any(flags)
    if decision == "majority":
        return 2 * sum(flags) > len(flags)
    return flags[-1]


class AccordionSchedule(_DetectorDriven):
    """The paper's rule for compression: `low` in critical regimes, `high` outside, per layer."""

    name = "accordion"
    OPTIONS = ("low", "high") + DetectorSettings.OPTIONS

    def __init__(self, num_layers: int, *, low, high, **kwargs):
        self.low, self.high = low, high
        super().__init__(num_layers, **kwargs)

    def initial_plan(self) -> Plan:
        return Plan(levels=[self.low] * self.num_layers, global_batch=None, lr_scale=1.0)

    def _initial_flags(self):
        return [True] * self.num_layers, None

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        self._critical = self._expect_flags(critical)
        levels = [self.low if c else self.high for c in self._critical]
        return self._set(Plan(levels=levels, global_batch=None, lr_scale=1.0))

    @classmethod
    def parse(cls, options: Mapping, context: ScheduleContext) -> dict:
        low, high = _parse_level_pair(cls.name, options, context, "low", "high")
        return {"low": low, "high": high, "detector": DetectorSettings.parse(options)}


class BatchAccordionSchedule(_DetectorDriven):
    """Accordion for the batch size: B_low in critical regimes, B_high outside.

    mode "detector" is the paper's rule on one model-wide decision (see BATCH_DECISIONS);
    mode "fixed_epoch" is what the released batch-size logs did: B_low before `switch_epoch`,
    B_high from it to the end.
    """

    name = "batch_accordion"
    OPTIONS = ("low", "high", "lr_scaling", "mode", "switch_epoch",
               "decision") + DetectorSettings.OPTIONS

    def __init__(self, num_layers: int, *, batch_low: int, batch_high: int,
                 lr_scaling: str = "linear", mode: str = "detector", switch_epoch: int = 20,
                 decision: str = "model_norm", **kwargs):
        self.batch_low, self.batch_high = batch_low, batch_high
        self.lr_scaling, self.mode = lr_scaling, mode
        self.switch_epoch, self.decision = switch_epoch, decision
        super().__init__(num_layers, **kwargs)

    @property
    def granularity(self) -> str:
        return "model" if self.decision == "model_norm" else "layer"

    @property
    def needs_detector(self) -> bool:
        return self.mode == "detector"

    def make_detector(self) -> CriticalRegimeDetector | None:
        return super().make_detector() if self.needs_detector else None

    def _batch_plan(self, critical: bool, levels=None) -> Plan:
        batch = self.batch_low if critical else self.batch_high
        return Plan(levels=levels, global_batch=batch,
                    lr_scale=lr_scale_for(batch, self.batch_low, self.lr_scaling))

    def _starts_critical(self) -> bool:
        return self.mode == "detector" or self.switch_epoch > 0

    def initial_plan(self) -> Plan:
        return self._batch_plan(critical=self._starts_critical())

    def _initial_flags(self):
        per_layer = [True] * self.num_layers if self.granularity != "model" else None
        return (per_layer if self.mode == "detector" else None), self._starts_critical()

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        if self.mode == "fixed_epoch":
            self._model_critical = epoch + 1 < self.switch_epoch
        else:
            flags = self._expect_flags(critical)
            if self.granularity == "layer":
                self._critical = flags
            self._model_critical = _batch_decision(flags, self.decision)
        return self._set(self._batch_plan(self._model_critical))

    @classmethod
    def parse(cls, options: Mapping, context: ScheduleContext) -> dict:
        batch_low, batch_high = _parse_batch_pair(options, context, "low", "high")
        return {"batch_low": batch_low, "batch_high": batch_high,
                "lr_scaling": as_choice(options, "lr_scaling", LR_SCALINGS),
                "mode": as_choice(options, "mode", BATCH_MODES),
                "switch_epoch": as_epoch(required(options, "switch_epoch"),
                                         key_of("switch_epoch"), context.total_epochs),
                "decision": as_choice(options, "decision", BATCH_DECISIONS),
                "detector": DetectorSettings.parse(options)}


class JointSchedule(BatchAccordionSchedule):
    """Our extension (the paper adapts compression and batch size separately, never jointly):
    one detector sets each layer's compression level and the global batch together."""

    name = "joint"
    OPTIONS = ("low", "high", "batch_low", "batch_high", "lr_scaling",
               "decision") + DetectorSettings.OPTIONS

    def __init__(self, num_layers: int, *, low, high, **kwargs):
        self.low, self.high = low, high
        super().__init__(num_layers, mode="detector", **kwargs)

    @property
    def granularity(self) -> str:
        return "layer+model" if self.decision == "model_norm" else "layer"

    def initial_plan(self) -> Plan:
        return self._batch_plan(critical=True, levels=[self.low] * self.num_layers)

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        flags = self._expect_flags(critical)
        self._critical = flags[:self.num_layers]
        self._model_critical = _batch_decision(flags, self.decision)
        levels = [self.low if c else self.high for c in self._critical]
        return self._set(self._batch_plan(self._model_critical, levels=levels))

    @classmethod
    def parse(cls, options: Mapping, context: ScheduleContext) -> dict:
        low, high = _parse_level_pair(cls.name, options, context, "low", "high")
        batch_low, batch_high = _parse_batch_pair(options, context, "batch_low", "batch_high")
        return {"low": low, "high": high, "batch_low": batch_low, "batch_high": batch_high,
                "lr_scaling": as_choice(options, "lr_scaling", LR_SCALINGS),
                "decision": as_choice(options, "decision", BATCH_DECISIONS),
                "detector": DetectorSettings.parse(options)}


class RegimeWindowsSchedule(Schedule):
    """Figure 2: fixed epoch windows stand for the critical regimes.

    Windows are half-open: [150, 160] covers epochs 150..159. `inside` is the level inside a
    window and `outside` elsewhere, so high compression can be put only inside or only outside.
    """

    name = "regime_windows"
    OPTIONS = ("windows", "inside", "outside")

    def __init__(self, num_layers: int, *, windows: Sequence[tuple[int, int]], inside, outside,
                 **kwargs):
        self.windows = [(int(a), int(b)) for a, b in windows]
        self.inside, self.outside = inside, outside
        super().__init__(num_layers, **kwargs)

    def in_window(self, epoch: int) -> bool:
        return any(start <= epoch < end for start, end in self.windows)

    def _plan_for(self, epoch: int) -> Plan:
        level = self.inside if self.in_window(epoch) else self.outside
        return Plan(levels=[level] * self.num_layers, global_batch=None, lr_scale=1.0)

    def initial_plan(self) -> Plan:
        return self._plan_for(0)

    def _initial_flags(self):
        return [self.in_window(0)] * self.num_layers, None

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        self._critical = [self.in_window(epoch + 1)] * self.num_layers
        return self._set(self._plan_for(epoch + 1))

    @classmethod
    def parse(cls, options: Mapping, context: ScheduleContext) -> dict:
        kind = require_compressor(cls.name, context.compressor)
        return {"windows": _parse_windows(required(options, "windows"), context.total_epochs),
                "inside": check_level(kind, required(options, "inside"), key_of("inside")),
                "outside": check_level(kind, required(options, "outside"), key_of("outside"))}


def _parse_level_pair(name: str, options: Mapping, context: ScheduleContext,
                      low_option: str, high_option: str):
    kind = require_compressor(name, context.compressor)
    low = check_level(kind, required(options, low_option), key_of(low_option))
    high = check_level(kind, required(options, high_option), key_of(high_option))
    check_compresses_more(high, low, high_key=key_of(high_option), low_key=key_of(low_option))
    return low, high


def _parse_batch_pair(options: Mapping, context: ScheduleContext,
                      low_option: str, high_option: str) -> tuple[int, int]:
    low = check_global_batch(required(options, low_option), key_of(low_option),
                             context.world_size)
    high = check_global_batch(required(options, high_option), key_of(high_option),
                              context.world_size)
    check_batch_order(low, high, low_key=key_of(low_option), high_key=key_of(high_option))
    return low, high


def _parse_windows(windows, total_epochs: int | None) -> list[tuple[int, int]]:
    key = key_of("windows")
    if isinstance(windows, (str, bytes)) or not isinstance(windows, Sequence):
        raise ConfigError(key, f"must be a list of [start, end] epoch pairs, got {windows!r}")
    parsed = []
    for i, window in enumerate(windows):
        item_key = f"{key}[{i}]"
        if isinstance(window, (str, bytes)) or not isinstance(window, Sequence) \
                or len(window) != 2:
            raise ConfigError(item_key, f"must be a [start, end] pair, got {window!r}")
        start = as_epoch(window[0], item_key, total_epochs)
        end = as_epoch(window[1], item_key, total_epochs)
        if end <= start:
            raise ConfigError(item_key, f"covers no epoch: [{start}, {end}) (end is exclusive)")
        if total_epochs is not None and start >= total_epochs:
            raise ConfigError(item_key, f"starts at epoch {start}, after the last epoch "
                                        f"({total_epochs - 1}); give it as a fraction to scale")
        parsed.append((start, end))
    return parsed
