"""Schedules: they turn detector flags (or the epoch number) into the plan for the next epoch.

A schedule never sees a compressor or a loop. The engine asks for `initial_plan()` before
epoch 0 and calls `on_epoch_end(e, flags)` at the end of epoch e; the returned Plan holds from
epoch e + 1 on. Each class names its options once, as its `Settings` dataclass (with the
defaults); `parse(options, context)` checks the user's options into that object, and the
schedule is built from it, so that validation and construction cannot drift.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields

from ..comm.config import check_level, level_kind
from ..errors import ConfigError
from ..options import Options, as_epoch, option
from .detector import CriticalRegimeDetector, DetectorSettings

# How per-layer flags become the one model-wide decision a batch size needs.
BATCH_DECISIONS = ("model_norm", "any", "majority")
BATCH_MODES = ("detector", "fixed_epoch")
# The LR multiplier at global batch B, from B / B_low (the scheduled LR is the one for B_low).
LR_SCALINGS = {"linear": lambda ratio: ratio, "sqrt": math.sqrt, "none": lambda ratio: 1.0}


# ---- what a schedule tells the engine, and the compact form of levels for metrics -----------
@dataclass
class Plan:
    """What holds from the next epoch on (or from epoch 0 for the initial plan)."""

    levels: list | None         # per compressible layer (rank: int, ratio: float); None = default
    global_batch: int | None    # None = the trainer's own global batch
    lr_scale: float = 1.0       # multiplies the scheduled LR

    def to_dict(self) -> dict:
        """Plain, JSON- and broadcast-ready form (lists copied, so the plan cannot be aliased)."""
        return {"levels": None if self.levels is None else list(self.levels),
                "global_batch": self.global_batch, "lr_scale": float(self.lr_scale)}

    @classmethod
    def from_dict(cls, data: dict) -> Plan:
        levels = data["levels"]
        return cls(levels=None if levels is None else list(levels),
                   global_batch=data["global_batch"], lr_scale=float(data["lr_scale"]))


def level_key(level) -> str:
    """How one level is spelled as a JSON key: 2 -> "2", 0.99 -> "0.99", None -> "none"."""
    return "none" if level is None else str(level)


def compact_levels(levels: Sequence) -> dict[str, int]:
    """How many layers sit at each level, most communication first: {"2": 20, "1": 1}."""
    counts = Counter(levels)
    ordered = sorted(counts, key=lambda lv: (lv is None, -(lv if lv is not None else 0)))
    return {level_key(lv): counts[lv] for lv in ordered}


@dataclass(frozen=True)
class ScheduleContext:
    """What a schedule needs to know about the rest of the run to check its options.

    `level_kind` is the compressor's kind of level as comm/ gives it (int ranks, float kept
    fractions, None); `compressor` only names the compressor in messages.
    """

    compressor: str
    level_kind: type | None
    world_size: int
    total_epochs: int | None = None


# ---- each schedule's options: the one list of their names, with their defaults -------------
@dataclass(frozen=True)
class NoSettings:
    pass


@dataclass(frozen=True, kw_only=True)
class StaticSettings(DetectorSettings):
    # true: run the detector beside a fixed level and log what it would flag (never acted on)
    detect: bool = option(Options.flag, default=False)


@dataclass(frozen=True, kw_only=True)
class AccordionSettings(DetectorSettings):
    low: int | float   # level inside critical regimes (conf gives it)
    high: int | float  # level outside them


@dataclass(frozen=True, kw_only=True)
class BatchChoices:
    lr_scaling: str = "linear"    # lr_scale = B / B_low | sqrt | none
    decision: str = "model_norm"  # batch from the whole-model norm | any | majority of layers


@dataclass(frozen=True, kw_only=True)
class BatchAccordionSettings(BatchChoices, DetectorSettings):
    low: int   # B_low, global (conf gives it)
    high: int  # B_high, global
    mode: str = "detector"  # the paper's rule | fixed_epoch: B_low before switch_epoch (the logs)
    switch_epoch: int | float = 0.0666666667  # epoch, or fraction of the run: 20 of 300


@dataclass(frozen=True, kw_only=True)
class JointSettings(BatchChoices, DetectorSettings):
    low: int | float  # compression level inside critical regimes (conf gives the four bounds)
    high: int | float
    batch_low: int    # global batch inside critical regimes
    batch_high: int


@dataclass(frozen=True, kw_only=True)
class RegimeWindowsSettings:
    windows: list  # [start, end) epoch pairs, or fractions of the run (conf gives all three)
    inside: int | float
    outside: int | float


def _detector_options(reader: Options) -> dict:
    return asdict(DetectorSettings.read(reader))


class Schedule:
    """Base: holds the plan in force and the last flags, and reports them for metrics.jsonl.

    A subclass names its options once, as the fields of its `Settings` dataclass; they read as
    attributes of the schedule (`schedule.low`).
    """

    name = "schedule"
    Settings: type = NoSettings
    batch_low_option: str | None = None  # the option holding B_low, for batch schedules

    def __init__(self, num_layers: int, settings=None, *, default_level=None,
                 base_global_batch: int | None = None):
        self.settings = settings if settings is not None else self.Settings()
        self.num_layers = int(num_layers)
        self.default_level = default_level
        self.base_global_batch = base_global_batch
        self._plan = self.initial_plan()
        # per-layer flags and the model-wide batch decision in force, when the schedule has them
        self._critical, self._model_critical = self._initial_flags()

    def __getattr__(self, option: str):
        settings = self.__dict__.get("settings")
        if settings is not None and option in self.options():
            return getattr(settings, option)
        raise AttributeError(f"{type(self).__name__!r} has no attribute {option!r}")

    @classmethod
    def options(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls.Settings))

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
    def parse(cls, options: Options, context: ScheduleContext):
        """The user's options, checked, as this schedule's Settings."""
        return cls.Settings()


class StaticSchedule(Schedule):
    """The compressor's own level, the trainer's own batch, all run long.

    With `detect`, the detector watches the run and its flags are logged (per layer and for
    the whole model) but never acted on: the critical regimes of a fixed-level run, which
    Figure 2 (b)'s data-driven arms are built from (analysis/regime_plan.py).
    """

    name = "static"
    Settings = StaticSettings
    granularity = "layer+model"

    @property
    def needs_detector(self) -> bool:
        return self.detect

    def make_detector(self) -> CriticalRegimeDetector | None:
        return _detector(self) if self.detect else None

    def initial_plan(self) -> Plan:
        return Plan(levels=None, global_batch=None, lr_scale=1.0)

    def _initial_flags(self):
        return ([True] * self.num_layers, True) if self.detect else (None, None)

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        if self.detect:
            flags = _expect_flags(self, critical)
            self._critical, self._model_critical = flags[:self.num_layers], flags[-1]
        return self.plan

    @classmethod
    def parse(cls, options: Options, context: ScheduleContext) -> StaticSettings:
        return StaticSettings(detect=options.flag("detect"), **_detector_options(options))


def _detector(schedule: Schedule) -> CriticalRegimeDetector:
    """The detector a schedule's options describe, deciding in the schedule's units."""
    detector = {f.name: getattr(schedule.settings, f.name) for f in fields(DetectorSettings)}
    return CriticalRegimeDetector(schedule.num_layers, granularity=schedule.granularity, **detector)


def _expect_flags(schedule: Schedule, critical: Sequence[bool] | None) -> list[bool]:
    expected = {"layer": schedule.num_layers, "model": 1,
                "layer+model": schedule.num_layers + 1}[schedule.granularity]
    if critical is None or len(critical) != expected:
        got = None if critical is None else len(critical)
        raise ValueError(f"schedule {schedule.name!r} expects {expected} detector flags "
                         f"(granularity {schedule.granularity!r}), got {got}; build the detector "
                         "with schedule.make_detector()")
    return [bool(c) for c in critical]


class _DetectorDriven(Schedule):
    """Shared by the schedules that follow the detector's flags."""

    granularity = "layer"

    @property
    def needs_detector(self) -> bool:
        return True

    def make_detector(self) -> CriticalRegimeDetector:
        return _detector(self)


def _batch_decision(flags: list[bool], decision: str) -> bool:
    """One model-wide "critical" from per-layer flags (model_norm passes its single flag)."""
    if decision == "any":
        return any(flags)
    if decision == "majority":
        return 2 * sum(flags) > len(flags)
    return flags[-1]


@dataclass(frozen=True)
class BatchRule:
    """B_low in critical regimes, B_high outside, and the LR scale that goes with the batch."""

    batch_low: int
    batch_high: int
    lr_scaling: str

    def plan(self, critical: bool, levels=None) -> Plan:
        batch = self.batch_low if critical else self.batch_high
        return Plan(levels=levels, global_batch=batch,
                    lr_scale=LR_SCALINGS[self.lr_scaling](batch / self.batch_low))


class AccordionSchedule(_DetectorDriven):
    """The paper's rule for compression: `low` in critical regimes, `high` outside, per layer."""

    name = "accordion"
    Settings = AccordionSettings

    def initial_plan(self) -> Plan:
        return Plan(levels=[self.low] * self.num_layers, global_batch=None, lr_scale=1.0)

    def _initial_flags(self):
        return [True] * self.num_layers, None

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        self._critical = _expect_flags(self, critical)
        levels = [self.low if c else self.high for c in self._critical]
        return self._set(Plan(levels=levels, global_batch=None, lr_scale=1.0))

    @classmethod
    def parse(cls, options: Options, context: ScheduleContext) -> AccordionSettings:
        low, high = _parse_level_pair(cls.name, options, context, "low", "high")
        return AccordionSettings(low=low, high=high, **_detector_options(options))


class BatchAccordionSchedule(_DetectorDriven):
    """Accordion for the batch size: B_low in critical regimes, B_high outside.

    mode "detector" is the paper's rule on one model-wide decision (see BATCH_DECISIONS);
    mode "fixed_epoch" is what the released batch-size logs did: B_low before `switch_epoch`,
    B_high from it to the end.
    """

    name = "batch_accordion"
    Settings = BatchAccordionSettings
    batch_low_option = "low"

    def __init__(self, num_layers: int, settings: BatchAccordionSettings, **kwargs):
        self.rule = BatchRule(settings.low, settings.high, settings.lr_scaling)
        super().__init__(num_layers, settings, **kwargs)

    @property
    def granularity(self) -> str:
        return "model" if self.decision == "model_norm" else "layer"

    @property
    def needs_detector(self) -> bool:
        return self.mode == "detector"

    def make_detector(self) -> CriticalRegimeDetector | None:
        return super().make_detector() if self.needs_detector else None

    def _starts_critical(self) -> bool:
        return self.mode == "detector" or self.switch_epoch > 0

    def initial_plan(self) -> Plan:
        return self.rule.plan(critical=self._starts_critical())

    def _initial_flags(self):
        per_layer = [True] * self.num_layers if self.granularity != "model" else None
        return (per_layer if self.mode == "detector" else None), self._starts_critical()

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        if self.mode == "fixed_epoch":
            self._model_critical = epoch + 1 < self.switch_epoch
        else:
            flags = _expect_flags(self, critical)
            if self.granularity == "layer":
                self._critical = flags
            self._model_critical = _batch_decision(flags, self.decision)
        return self._set(self.rule.plan(self._model_critical))

    @classmethod
    def parse(cls, options: Options, context: ScheduleContext) -> BatchAccordionSettings:
        low, high = _parse_batch_pair(options, context, "low", "high")
        return BatchAccordionSettings(
            low=low, high=high, lr_scaling=options.choice("lr_scaling", LR_SCALINGS),
            mode=options.choice("mode", BATCH_MODES),
            switch_epoch=as_epoch(options.get("switch_epoch"), options.key("switch_epoch"),
                                  context.total_epochs),
            decision=options.choice("decision", BATCH_DECISIONS), **_detector_options(options))


class JointSchedule(_DetectorDriven):
    """Our extension (the paper adapts compression and batch size separately, never jointly):
    one detector sets each layer's compression level and the global batch together."""

    name = "joint"
    Settings = JointSettings
    batch_low_option = "batch_low"

    def __init__(self, num_layers: int, settings: JointSettings, **kwargs):
        self.rule = BatchRule(settings.batch_low, settings.batch_high, settings.lr_scaling)
        super().__init__(num_layers, settings, **kwargs)

    @property
    def granularity(self) -> str:
        return "layer+model" if self.decision == "model_norm" else "layer"

    def initial_plan(self) -> Plan:
        return self.rule.plan(critical=True, levels=[self.low] * self.num_layers)

    def _initial_flags(self):
        return [True] * self.num_layers, True

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        flags = _expect_flags(self, critical)
        self._critical = flags[:self.num_layers]
        self._model_critical = _batch_decision(flags, self.decision)
        levels = [self.low if c else self.high for c in self._critical]
        return self._set(self.rule.plan(self._model_critical, levels=levels))

    @classmethod
    def parse(cls, options: Options, context: ScheduleContext) -> JointSettings:
        low, high = _parse_level_pair(cls.name, options, context, "low", "high")
        batch_low, batch_high = _parse_batch_pair(options, context, "batch_low", "batch_high")
        return JointSettings(low=low, high=high, batch_low=batch_low, batch_high=batch_high,
                             lr_scaling=options.choice("lr_scaling", LR_SCALINGS),
                             decision=options.choice("decision", BATCH_DECISIONS),
                             **_detector_options(options))


class RegimeWindowsSchedule(Schedule):
    """Figure 2: fixed epoch windows stand for the critical regimes.

    Windows are half-open: [150, 160] covers epochs 150..159. `inside` is the level inside a
    window and `outside` elsewhere, so high compression can be put only inside or only outside.
    """

    name = "regime_windows"
    Settings = RegimeWindowsSettings

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
    def parse(cls, options: Options, context: ScheduleContext) -> RegimeWindowsSettings:
        kind = require_levels(cls.name, context.compressor, context.level_kind)
        return RegimeWindowsSettings(
            windows=_parse_windows(options.get("windows"), context.total_epochs),
            inside=check_level(kind, options.get("inside"), options.key("inside")),
            outside=check_level(kind, options.get("outside"), options.key("outside")))


def require_levels(schedule: str, compressor: str, kind: type | None) -> type:
    """Schedules that change the compression level need a compressor that has levels (the
    kind, int ranks or float kept fractions, is comm/'s answer, passed in the context)."""
    if kind is None:
        raise ConfigError("schedule.name",
                          f"schedule {schedule!r} changes the compression level, but compressor "
                          f"{compressor!r} has no levels; use compressor=powersgd or topk, or a "
                          "schedule that keeps compression fixed (static, batch_accordion)")
    return kind


def _parse_level_pair(name: str, options: Options, context: ScheduleContext,
                      low_option: str, high_option: str):
    """`high` (outside critical regimes) may not send more than `low` (inside them); for both
    kinds a larger number sends more: a higher rank, a larger kept fraction."""
    kind = require_levels(name, context.compressor, context.level_kind)
    low = check_level(kind, options.get(low_option), options.key(low_option))
    high = check_level(kind, options.get(high_option), options.key(high_option))
    if high > low:
        raise options.error(high_option, f"{high!r} compresses less than {options.key(low_option)}"
                                         f" = {low!r}; the high-compression level must send no "
                                         "more than the low one")
    return low, high


def _parse_batch_pair(options: Options, context: ScheduleContext,
                      low_option: str, high_option: str) -> tuple[int, int]:
    """Two global batches, each split evenly into one per-worker batch per rank, B_high >= B_low."""
    low, high = (_global_batch(options, option, context.world_size)
                 for option in (low_option, high_option))
    if high < low:
        raise options.error(high_option, f"B_high = {high} is smaller than {options.key(low_option)}"
                                         f" = {low}; the batch outside critical regimes must be "
                                         "at least as large")
    return low, high


def _global_batch(options: Options, option: str, world_size: int) -> int:
    value = options.integer(option, what="a global batch")
    if value % world_size:
        raise options.error(option, f"global batch {value} does not divide across {world_size} "
                                    f"workers (per-worker batch {value / world_size:g})")
    return value


def _parse_windows(windows, total_epochs: int | None) -> list[tuple[int, int]]:
    key = "schedule.windows"
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


# ---- the config-facing entry points of accordion/ -------------------------------------------
SCHEDULES: dict[str, type[Schedule]] = {
    cls.name: cls for cls in (StaticSchedule, AccordionSchedule, BatchAccordionSchedule,
                              JointSchedule, RegimeWindowsSchedule)
}
SCHEDULE_NAMES = tuple(SCHEDULES)


def _parse(name, options: Mapping, compressor: str, world_size: int,
           total_epochs: int | None) -> tuple[type[Schedule], object]:
    if name not in SCHEDULES:
        raise ConfigError("schedule.name",
                          f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    cls = SCHEDULES[name]
    options = dict(options)
    if options.pop("name", name) != name:
        raise ConfigError("schedule.name", f"two names given: {name!r} and options['name']")
    reader = Options("schedule", options, cls.Settings)
    reader.reject_unknown(cls.options(), f"schedule {name!r}")
    # The compressor's kind of level comes from comm/, the one table of compressors.
    context = ScheduleContext(compressor, level_kind(compressor), world_size, total_epochs)
    return cls, cls.parse(reader, context)


def validate_schedule(name, options: Mapping, /, *, compressor: str, world_size: int,
                      total_epochs: int | None = None):
    """The schedule's checked Settings; ConfigError naming `schedule.<key>` for anything
    build_schedule would refuse.

    `options` is the schedule config node (its `name` key, if present, is ignored).
    `total_epochs` is needed only when an epoch is given as a fraction.
    """
    return _parse(name, options, compressor, world_size, total_epochs)[1]


def build_schedule(name: str, /, *, num_layers: int, compressor: str, default_level,
                   base_global_batch: int, world_size: int, total_epochs: int | None = None,
                   **options) -> Schedule:
    """A ready schedule; the engine gets its detector from `schedule.make_detector()`.

    `options` may be the whole schedule config node, `name` included (`**cfg.schedule`).
    `default_level` is the compressor's own level, reported for layers no plan sets.
    """
    cls, settings = _parse(name, options, compressor, world_size, total_epochs)
    return cls(num_layers, settings, default_level=default_level,
               base_global_batch=base_global_batch)
