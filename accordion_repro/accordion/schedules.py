"""Schedules: they turn detector flags (or the epoch number) into the plan for the next epoch.

A schedule never sees a compressor or a loop. The engine asks for `initial_plan()` before
epoch 0 and calls `on_epoch_end(e, flags)` at the end of epoch e; the returned Plan holds from
epoch e + 1 on. Each class names its options once, as the `option()` fields of its `Settings`
dataclass (with the defaults); reading the user's options into that object checks them, and the
schedule is built from it, so that validation and construction cannot drift.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

from ..comm.config import check_level
from ..errors import ConfigError
from ..options import Options, Settings, as_epoch, option
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
    fractions, None); `schedule` and `compressor` only name them in messages.
    """

    schedule: str
    compressor: str
    level_kind: type | None
    world_size: int
    total_epochs: int | None = None


# ---- each schedule's options: the one list of their names, with their defaults -------------
class ScheduleOptions(Options):
    """The schedule node, read knowing the rest of the run: a level's kind comes from the
    compressor, a global batch must split across the ranks, an epoch may be a fraction."""

    def __init__(self, values: Mapping, settings: type, context: ScheduleContext):
        super().__init__("schedule", values, settings)
        self.context = context


def _level(o: ScheduleOptions, option: str):
    """Schedules that change the compression level need a compressor that has levels (the
    kind, int ranks or float kept fractions, is comm/'s answer, passed in the context)."""
    c = o.context
    if c.level_kind is None:
        raise ConfigError("schedule.name",
                          f"schedule {c.schedule!r} changes the compression level, but compressor "
                          f"{c.compressor!r} has no levels; use compressor=powersgd or topk, or a "
                          "schedule that keeps compression fixed (static, batch_accordion)")
    return check_level(c.level_kind, o.get(option), o.key(option))


def _global_batch(o: ScheduleOptions, option: str) -> int:
    value, world_size = o.integer(option, what="a global batch"), o.context.world_size
    if value % world_size:
        raise o.error(option, f"global batch {value} does not divide across {world_size} "
                              f"workers (per-worker batch {value / world_size:g})")
    return value


def _epoch(o: ScheduleOptions, option: str) -> int:
    return as_epoch(o.get(option), o.key(option), o.context.total_epochs)


# `schedule.windows: plan:<arm>` in a preset: the windows must come from a detect run's plan
# (analysis/regime_plan.py); until an override replaces them, the run is refused, naming how.
PLAN_PREFIX = "plan:"


def _windows(o: ScheduleOptions, option: str) -> list[tuple[int, int]]:
    windows, total_epochs, key = o.get(option), o.context.total_epochs, o.key(option)
    if isinstance(windows, str) and windows.startswith(PLAN_PREFIX):
        raise ConfigError(key, f"this arm's epochs come from a reference run's plan ({windows}): "
                               "`python -m accordion_repro.analysis.regime_plan RUN_DIR` prints "
                               f"the {key}=... override to pass")
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


def _level_pair(low_option: str, low, high_option: str, high) -> None:
    """`high` (outside critical regimes) may not send more than `low` (inside them); for both
    kinds a larger number sends more: a higher rank, a larger kept fraction."""
    if high > low:
        raise ConfigError(f"schedule.{high_option}", f"{high!r} compresses less than schedule."
                          f"{low_option} = {low!r}; the high-compression level must send no more "
                          "than the low one")


def _batch_pair(low_option: str, low: int, high_option: str, high: int) -> None:
    if high < low:
        raise ConfigError(f"schedule.{high_option}", f"B_high = {high} is smaller than schedule."
                          f"{low_option} = {low}; the batch outside critical regimes must be at "
                          "least as large")


@dataclass(frozen=True, kw_only=True)
class StaticSettings(DetectorSettings):
    # true: run the detector beside a fixed level and log what it would flag (never acted on)
    detect: bool = option(
        Options.flag, default=False, added=False,
        help="run the detector beside the fixed level and log what it would flag (never acted on)")


@dataclass(frozen=True, kw_only=True)
class AccordionSettings(DetectorSettings):
    low: int | float = option(
        _level,
        help="the compression level inside critical regimes (a rank or a kept fraction)")
    high: int | float = option(_level, help="the compression level outside critical regimes")

    def __post_init__(self):
        _level_pair("low", self.low, "high", self.high)


@dataclass(frozen=True, kw_only=True)
class BatchChoices(Settings):
    # lr_scale = B / B_low | sqrt | none
    lr_scaling: str = option(
        Options.choice, LR_SCALINGS, default="linear",
        help="lr_scale = B / B_low (linear), its square root (sqrt) or none")
    # batch from the whole-model norm | any | majority of layers
    decision: str = option(
        Options.choice, BATCH_DECISIONS, default="model_norm",
        help="the batch from the whole-model norm (model_norm), any layer (any) or the majority of"
             " layers")


@dataclass(frozen=True, kw_only=True)
class BatchAccordionSettings(BatchChoices, DetectorSettings):
    low: int = option(
        _global_batch,
        help="B_low: the global batch inside critical regimes (trainer.batch_size x world size)")
    high: int = option(_global_batch, help="B_high: the global batch outside critical regimes")
    # the paper's rule | fixed_epoch: B_low before switch_epoch (the released logs)
    mode: str = option(
        Options.choice, BATCH_MODES, default="detector",
        help="detector: the paper's rule; fixed_epoch: B_low before switch_epoch (the released "
             "logs)")
    switch_epoch: int | float = option(
        _epoch, default=0.0666666667,
        help="the epoch (or fraction of the run: 20 of 300) where fixed_epoch switches to B_high")

    def __post_init__(self):
        _batch_pair("low", self.low, "high", self.high)


@dataclass(frozen=True, kw_only=True)
class JointSettings(BatchChoices, DetectorSettings):
    low: int | float = option(_level, help="the compression level inside critical regimes")
    high: int | float = option(_level, help="the compression level outside critical regimes")
    batch_low: int = option(_global_batch, help="the global batch inside critical regimes")
    batch_high: int = option(_global_batch, help="the global batch outside critical regimes")

    def __post_init__(self):
        _level_pair("low", self.low, "high", self.high)
        _batch_pair("batch_low", self.batch_low, "batch_high", self.batch_high)


@dataclass(frozen=True, kw_only=True)
class RegimeWindowsSettings(Settings):
    SECTION = "schedule"
    # [start, end) epoch pairs, or fractions of the run (conf gives all three)
    windows: list = option(
        _windows,
        help="[start, end) epoch pairs, or fractions of the run, that are critical")
    inside: int | float = option(_level, help="the compression level inside the windows")
    outside: int | float = option(_level, help="the compression level outside them")


class Schedule:
    """Base: holds the plan in force and the last flags, and reports them for metrics.jsonl.

    A subclass names its options once, as the fields of its `Settings` dataclass; the checked
    values are `schedule.settings`.
    """

    name = "schedule"
    Settings: type[Settings]
    batch_low_option: str | None = None  # the option holding B_low, for batch schedules
    # True: every plan sets each layer's compression level, so the compressor's own level
    # (compressor.rank / ratio) is never read; the config refuses one (config.py
    # check_level_owner), as AdaptiveCompression refuses rank= (ddp.py).
    sets_levels = False

    def __init__(self, num_layers: int, settings=None, *, default_level=None,
                 base_global_batch: int | None = None):
        self.settings = settings if settings is not None else self.Settings()
        self.num_layers = int(num_layers)
        self.default_level = default_level
        self.base_global_batch = base_global_batch
        self._plan = self.initial_plan()
        # per-layer flags and the model-wide batch decision in force, when the schedule has them
        self._critical, self._model_critical = self._initial_flags()

    @classmethod
    def options(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls.Settings))

    @property
    def needs_detector(self) -> bool:
        return False

    def make_detector(self) -> CriticalRegimeDetector | None:
        """The detector this schedule expects its flags from (None when it needs none)."""
        return _detector(self) if self.needs_detector else None

    def initial_plan(self) -> Plan:
        """The plan for epoch 0 (pure: after a restore, `plan` is the one in force)."""
        raise NotImplementedError

    def _initial_flags(self) -> tuple[list[bool] | None, bool | None]:
        return None, None

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        raise NotImplementedError

    def check_feasible(self) -> None:
        """ConfigError naming the option, and the nearest value that works, when the settings
        ask for what no plan can give on these layers (config.validate calls it with the
        model's layer shapes, before any rank starts); most schedules can always plan."""

    def replan(self, epoch: int) -> Plan:
        """The plan for `epoch` under this schedule's settings, after a restore from a run
        whose settings differed (trainer.allow_config_change): a plan that is a function of
        the epoch (regime windows, their fractions of trainer.epochs) is made afresh; a plan
        the detector decided stays, as its gradients cannot be seen again (the new settings
        act from the decision at the end of `epoch`)."""
        return self.plan

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
        return self.settings.detect

    def initial_plan(self) -> Plan:
        return Plan(levels=None, global_batch=None, lr_scale=1.0)

    def _initial_flags(self):
        return ([True] * self.num_layers, True) if self.settings.detect else (None, None)

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        if self.settings.detect:
            flags = _expect_flags(self, critical)
            self._critical, self._model_critical = flags[:self.num_layers], flags[-1]
        return self.plan


def _detector(schedule: Schedule) -> CriticalRegimeDetector:
    """The detector a schedule's options describe, deciding in the schedule's units."""
    return CriticalRegimeDetector(schedule.num_layers, granularity=schedule.granularity,
                                  settings=schedule.settings)


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


def _levels(settings, critical: list[bool]) -> list:
    """Each layer's level: `low` where the layer is critical, `high` elsewhere."""
    return [settings.low if c else settings.high for c in critical]


def batch_decision(flags: list[bool], decision: str) -> bool:
    """One model-wide "critical" from per-layer flags (model_norm passes its single flag)."""
    if decision == "any":
        return any(flags)
    if decision == "majority":
        return 2 * sum(flags) > len(flags)
    return flags[-1]


def held_decision(layer_and_model_flags: list[bool], decision: str) -> bool:
    """The model-wide decision from a "layer+model" report (each layer's flag, then the whole
    model's), as a schedule with this `decision` would have taken it: model_norm reads the
    whole-model flag, the per-layer rules read only the layers'."""
    flags = layer_and_model_flags if decision == "model_norm" else layer_and_model_flags[:-1]
    return batch_decision(flags, decision)


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
    sets_levels = True
    Settings = AccordionSettings

    def initial_plan(self) -> Plan:
        return Plan(levels=[self.settings.low] * self.num_layers, global_batch=None, lr_scale=1.0)

    def _initial_flags(self):
        return [True] * self.num_layers, None

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        self._critical = _expect_flags(self, critical)
        return self._set(Plan(levels=_levels(self.settings, self._critical), global_batch=None,
                              lr_scale=1.0))


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
        return "model" if self.settings.decision == "model_norm" else "layer"

    @property
    def needs_detector(self) -> bool:
        return self.settings.mode == "detector"

    def _starts_critical(self) -> bool:
        return self.settings.mode == "detector" or self.settings.switch_epoch > 0

    def initial_plan(self) -> Plan:
        return self.rule.plan(critical=self._starts_critical())

    def _initial_flags(self):
        per_layer = [True] * self.num_layers if self.granularity != "model" else None
        return (per_layer if self.needs_detector else None), self._starts_critical()

    def replan(self, epoch: int) -> Plan:
        """fixed_epoch's plan is a function of the epoch (its switch_epoch may be a fraction of
        trainer.epochs): made afresh after an allowed change; the detector's stays."""
        if self.settings.mode != "fixed_epoch":
            return self.plan
        self._model_critical = epoch < self.settings.switch_epoch
        return self._set(self.rule.plan(self._model_critical))

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        if self.settings.mode == "fixed_epoch":
            return self.replan(epoch + 1)
        flags = _expect_flags(self, critical)
        if self.granularity == "layer":
            self._critical = flags
        self._model_critical = batch_decision(flags, self.settings.decision)
        return self._set(self.rule.plan(self._model_critical))


class JointSchedule(_DetectorDriven):
    """Our extension (the paper adapts compression and batch size separately, never jointly):
    one detector sets each layer's compression level and the global batch together."""

    name = "joint"
    sets_levels = True
    Settings = JointSettings
    batch_low_option = "batch_low"

    def __init__(self, num_layers: int, settings: JointSettings, **kwargs):
        self.rule = BatchRule(settings.batch_low, settings.batch_high, settings.lr_scaling)
        super().__init__(num_layers, settings, **kwargs)

    @property
    def granularity(self) -> str:
        return "layer+model" if self.settings.decision == "model_norm" else "layer"

    def initial_plan(self) -> Plan:
        return self.rule.plan(critical=True, levels=[self.settings.low] * self.num_layers)

    def _initial_flags(self):
        return [True] * self.num_layers, True

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        flags = _expect_flags(self, critical)
        self._critical = flags[:self.num_layers]
        self._model_critical = batch_decision(flags, self.settings.decision)
        return self._set(self.rule.plan(self._model_critical,
                                        levels=_levels(self.settings, self._critical)))


class RegimeWindowsSchedule(Schedule):
    """Figure 2: fixed epoch windows stand for the critical regimes.

    Windows are half-open: [150, 160] covers epochs 150..159. `inside` is the level inside a
    window and `outside` elsewhere, so high compression can be put only inside or only outside.
    """

    name = "regime_windows"
    sets_levels = True
    Settings = RegimeWindowsSettings

    def in_window(self, epoch: int) -> bool:
        return any(start <= epoch < end for start, end in self.settings.windows)

    def _plan_for(self, epoch: int) -> Plan:
        level = self.settings.inside if self.in_window(epoch) else self.settings.outside
        return Plan(levels=[level] * self.num_layers, global_batch=None, lr_scale=1.0)

    def initial_plan(self) -> Plan:
        return self._plan_for(0)

    def _initial_flags(self):
        return [self.in_window(0)] * self.num_layers, None

    def on_epoch_end(self, epoch: int, critical: Sequence[bool] | None) -> Plan:
        return self.replan(epoch + 1)

    def replan(self, epoch: int) -> Plan:
        self._critical = [self.in_window(epoch)] * self.num_layers
        return self._set(self._plan_for(epoch))
