"""Accordion (and its successors) on your own DistributedDataParallel model, in one object.

    acc = Accordion(ddp_model, compressor="powersgd", low=2, high=1, eta=0.5, interval=10)
    # or LGreCo(ddp_model, r0=2), LGreCoAccordion(ddp_model, r0=2, low=2, high=1),
    # PhaseRule(ddp_model, boundaries=[0.5], splits=[10000], levels=[[2, 2], [2, 1]],
    #           total_epochs=30), any of them with compressor="acp_powersgd"
    for epoch in range(epochs):
        ...                                          # train as usual: forward, backward, step
        acc.end_epoch(epoch, lr_now, lr_next)        # every rank, at the end of each epoch

The object registers the Accordion hook on the model (comm/ddp_hook.py), feeds rank 0's
detector each bucket's *local* gradients before they are reduced (after backward() p.grad holds
the averaged, compressed gradient, which would change the decisions), applies the schedule's
initial plan (every layer at `low`), and at the end of an epoch lets rank 0 decide, broadcasts
the decision and applies the plan on every rank. It is what the suite's trainer does in its
own loop (engine/trainer.py; docs/compressors.md says why that loop stays separate).
"""

from __future__ import annotations

import warnings
from dataclasses import fields

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .accordion import SCHEDULES, DetectorSettings, Plan, build_schedule
from .comm import level_option
from .comm.collectives import broadcast_object
from .comm.config import SETTINGS as COMPRESSOR_SETTINGS
from .comm.ddp_hook import AccordionHookState, accordion_hook, check_agreement
from .comm.stats import CommStats
from .errors import ConfigError

_STATE_VERSION = 1
DETECTOR_OPTIONS = tuple(f.name for f in fields(DetectorSettings))


class AccordionWarning(UserWarning):
    """A setting Accordion accepts but that defeats its purpose (a Top-K level that sends more
    than no compression)."""


def _compressor_options(compressor: str, level: str) -> list[str]:
    """The compressor's own keywords that Accordion passes through (its level is low/high)."""
    return sorted(f.name for f in fields(COMPRESSOR_SETTINGS[compressor]) if f.name != level)


def _schedule_arguments(schedule: str) -> tuple[str, ...]:
    """The schedule's own keywords (the detector's come apart), in their Settings' order."""
    return tuple(o for o in SCHEDULES[schedule].options() if o not in DETECTOR_OPTIONS)


def _in_callers_words(exc: ConfigError, level: str, level_from: str,
                      arguments: tuple[str, ...]) -> ConfigError:
    """A ConfigError of the pieces underneath, naming the object's own argument, not a config key
    (`compressor.ratio` is `low`, `schedule.high` is `high`, `schedule.eta` is `eta`)."""
    names = {f"compressor.{level}": level_from,
             **{f"schedule.{argument}": argument for argument in arguments}}
    argument = names.get(exc.key, exc.key.split(".")[-1])
    message = str(exc).removeprefix(f"{exc.key}: ")
    for key, name in sorted(names.items(), key=lambda item: -len(item[0])):
        message = message.replace(key, name)
    return ConfigError(argument, message)


class AdaptiveCompression:
    """One object on a DistributedDataParallel model: the hook, rank 0's measurement, the
    schedule; per-layer levels decided at the end of each epoch and applied on every rank.

    A subclass names its schedule (`SCHEDULE`, a key of accordion.SCHEDULES) and which of the
    schedule's arguments gives the compressor its starting level (`_start_level`). Keywords the
    schedule takes go to the schedule; the compressor's other options (error_feedback, seed,
    ...) to the compressor; `async_op` and `check_levels` to AccordionHookState.
    """

    SCHEDULE: str
    LEVEL_FROM: str  # the argument a message names for the compressor's level

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 async_op: bool = True, check_levels: bool = True,
                 total_epochs: int | None = None, **options):
        """`total_epochs`: only for epochs given as fractions of the run (phase_rule)."""
        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError(f"{type(self).__name__} needs the DistributedDataParallel-wrapped "
                            "model (it registers a communication hook on it), got "
                            f"{type(ddp_model).__name__}")
        if compressor not in COMPRESSOR_SETTINGS or level_option(compressor) is None:
            raise ValueError(f"{type(self).__name__} adapts a compression level; compressor "
                             f"{compressor!r} has none (use powersgd, acp_powersgd or topk)")
        option = level_option(compressor)
        passed = _compressor_options(compressor, option)
        own = _schedule_arguments(self.SCHEDULE)
        detector_options = [o for o in DETECTOR_OPTIONS
                            if o in SCHEDULES[self.SCHEDULE].options()]
        if option in options:
            setters = " and ".join(a for a in own if a in ("low", "high")) or "the schedule"
            raise TypeError(f"{type(self).__name__}() takes no {option}=: {setters} set each "
                            f"layer's {option} (got {option}={options[option]!r})")
        unknown = sorted(set(options) - set(own) - set(detector_options) - set(passed))
        if unknown:
            detector_text = (f"the detector's {', '.join(detector_options)} and "
                             if detector_options else "")
            raise TypeError(
                f"{type(self).__name__}() got an unexpected keyword argument {unknown[0]!r}; it "
                f"takes {', '.join(own)}, async_op, check_levels, {detector_text}"
                f"{compressor}'s {', '.join(passed)}")
        group = ddp_model.process_group
        schedule_options = {name: options.pop(name) for name in [*own, *detector_options]
                            if name in options}
        world_size = dist.get_world_size(group)
        try:
            start = {option: self._start_level(schedule_options), **options}
            # The level check runs in this object's forward pre-hook instead (below), where a
            # rank that calls end_epoch alone meets it before any gradient collective.
            self.state = AccordionHookState(ddp_model.module, compressor, group=group,
                                            async_op=async_op, check_levels=False, **start)
            self.schedule = build_schedule(
                self.SCHEDULE, num_layers=len(self.state.layer_names), compressor=compressor,
                default_level=start[option], base_global_batch=None, world_size=world_size,
                total_epochs=total_epochs, layer_shapes=self.state.reducer.matrix_shapes,
                **schedule_options)
        except ConfigError as exc:
            raise _in_callers_words(exc, option, self.LEVEL_FROM, own) from None
        self.rank = dist.get_rank(group)
        self._src = dist.get_global_rank(group, 0)  # the group's rank 0 decides
        self.check_levels = bool(check_levels)
        if compressor == "topk" and self.rank == 0:
            _warn_above_break_even({k: v for k, v in schedule_options.items()
                                    if k in ("low", "high")}, world_size)
        # Rank 0's local gradients decide, as in the paper's code; the other ranks skip the sums.
        self.detector = self.schedule.make_detector() if self.rank == 0 else None
        if self.detector is not None:
            self.detector.prepare(self.state.layer_params)
            self.state.detector = self.detector
        self.plan: Plan = self.schedule.initial_plan()
        self.state.set_levels(self.plan.levels)
        self.report: dict | None = None
        self._group = group
        ddp_model.register_comm_hook(self.state, accordion_hook)
        if self.check_levels:
            ddp_model.register_forward_pre_hook(self._check_before_forward)

    def _start_level(self, schedule_options: dict):
        """The compressor's level before the first plan (each subclass's own argument)."""
        return schedule_options.get(self.LEVEL_FROM)

    def _check_before_forward(self, module, args) -> None:
        """One 16-byte all-reduce per training forward, before DDP's own collectives (its
        buffer broadcast): the ranks hold the same levels and none is in end_epoch alone."""
        if module.training and torch.is_grad_enabled():
            check_agreement(self.state.reducer)

    # ---- what users read ------------------------------------------------------------------
    @property
    def layer_names(self) -> list[str]:
        """The compressible parameters (2 or more dimensions), in the order of `levels`."""
        return self.state.layer_names

    @property
    def levels(self) -> list:
        """The level of each layer in force now."""
        return self.state.levels

    @property
    def uncompressed_layers(self) -> list[str]:
        """The layers whose level in force cannot compress them (a PowerSGD rank >= min(n, m),
        a Top-K fraction that keeps every entry): they are sent whole, as dense all-reduces."""
        reducer = self.state.reducer
        return [name for layer, (name, level) in enumerate(zip(self.layer_names, self.levels))
                if reducer._sends_dense(layer, level)]

    def pop_stats(self) -> CommStats:
        """Floats, bytes and collectives this rank sent since the last call."""
        return self.state.pop_stats()

    # ---- end of an epoch ------------------------------------------------------------------
    def end_epoch(self, epoch: int, lr_now: float, lr_next: float) -> Plan:
        """Decide the levels from epoch + 1 on; call it on every rank at the end of `epoch`.

        `lr_now` is the learning rate used during `epoch`, `lr_next` the one scheduled for
        epoch + 1 (for Accordion's detector a decay between them sends every layer to `low`).
        Rank 0's measurement (the detector's flags, L-GreCo's error table) is broadcast and
        every rank's schedule turns it into the same plan; a schedule that measures nothing
        (phase_rule) plans from the epoch alone.
        """
        if self.check_levels:  # every rank is here, at the same epoch (one line if not)
            check_agreement(self.state.reducer, ending_epoch=epoch)
        decision = None
        if self.detector is not None:
            measured = self.detector.end_epoch(epoch, lr_now, lr_next)
            decision = {"measured": measured, "report": self.detector.report}
        if self.schedule.needs_detector:
            decision = broadcast_object(decision, src=self._src, group=self._group)
        measured, report = (decision["measured"], decision["report"]) if decision else (None, {})
        self.plan = self.schedule.on_epoch_end(epoch, measured)
        self.state.set_levels(self.plan.levels)
        self.report = {**report, "uncompressed_layers": self.uncompressed_layers}
        return self.plan

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state: save it on every rank (each rank has its own error memory).

        Holds the reducer (error memory, warm-start Q, levels, draw counters), rank 0's
        detector (epoch sums and history), the schedule and the plan in force.
        """
        return {"version": _STATE_VERSION, "rank": self.rank,
                "reducer": self.state.reducer.state_dict(),
                "detector": None if self.detector is None else self.detector.state_dict(),
                "schedule": self.schedule.state_dict(), "plan": self.plan.to_dict(),
                "report": self.report}

    def load_state_dict(self, state: dict) -> None:
        """Resume from this rank's state_dict; the next step computes as if never stopped."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"not an Accordion state (version {state.get('version')!r})")
        if state["rank"] != self.rank:
            raise ValueError(f"this state was saved by rank {state['rank']}, not rank "
                             f"{self.rank}: each rank loads its own (error memory differs)")
        self.state.reducer.load_state_dict(state["reducer"])
        if self.detector is not None:
            self.detector.load_state_dict(state["detector"])
            self.detector.prepare(self.state.layer_params)  # back onto the parameters' device
        self.schedule.load_state_dict(state["schedule"])
        self.plan = Plan.from_dict(state["plan"])
        self.report = state["report"]

    # ---- manual control -------------------------------------------------------------------
    def set_levels(self, levels) -> None:
        """Override the plan's levels (one per layer_names entry), on every rank alike."""
        self.state.set_levels(levels)

    def set_level(self, layer_name: str, level) -> None:
        self.state.set_level(layer_name, level)


class Accordion(AdaptiveCompression):
    """Adaptive per-layer compression for a DistributedDataParallel model.

    `low` is the level inside critical regimes (PowerSGD rank, or Top-K kept fraction) and
    `high` the level outside them; `eta`, `interval`, `lr_decay_rule` and `statistic` are the
    detector's (docs/schedules.md; their defaults are DetectorSettings'). Other keywords go to
    the compressor (error_feedback, warm_start, seed for PowerSGD; official_topk for Top-K).
    `async_op` and `check_levels` go to AccordionHookState (comm/ddp_hook.py).
    """

    SCHEDULE = "accordion"
    LEVEL_FROM = "low"

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 low, high, async_op: bool = True, check_levels: bool = True, **options):
        super().__init__(ddp_model, compressor, low=low, high=high, async_op=async_op,
                         check_levels=check_levels, **options)


class LGreCo(AdaptiveCompression):
    """L-GreCo's per-layer ranks (schedule=lgreco): each epoch, the ranks of least size whose
    summed error is at most alpha x that of rank `r0` everywhere, from rank 0's error table of
    candidates floor(gamma r0)..ceil(beta r0). Keywords: r0, gamma, beta, alpha, bins; the
    compressor's (powersgd or acp_powersgd) other options."""

    SCHEDULE = "lgreco"
    LEVEL_FROM = "r0"

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 r0: int, async_op: bool = True, check_levels: bool = True, **options):
        super().__init__(ddp_model, compressor, r0=r0, async_op=async_op,
                         check_levels=check_levels, **options)


class LGreCoAccordion(AdaptiveCompression):
    """L-GreCo + Accordion (schedule=lgreco_accordion): Accordion's detector picks `low` or
    `high` per layer, and the error of that choice (times alpha) is L-GreCo's budget."""

    SCHEDULE = "lgreco_accordion"
    LEVEL_FROM = "low"

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 r0: int, low: int, high: int, async_op: bool = True, check_levels: bool = True,
                 **options):
        super().__init__(ddp_model, compressor, r0=r0, low=low, high=high, async_op=async_op,
                         check_levels=check_levels, **options)


class PhaseRule(AdaptiveCompression):
    """The zero-cost phase/size rule (schedule=phase_rule): levels[phase][size group], phases
    starting at `boundaries` (epochs, or fractions of `total_epochs`), size groups at `splits`
    (entries of a layer). No measurement and no broadcast at the end of an epoch."""

    SCHEDULE = "phase_rule"
    LEVEL_FROM = "levels"

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 boundaries, splits, levels, total_epochs: int | None = None,
                 async_op: bool = True, check_levels: bool = True, **options):
        super().__init__(ddp_model, compressor, boundaries=boundaries, splits=splits,
                         levels=levels, total_epochs=total_epochs, async_op=async_op,
                         check_levels=check_levels, **options)

    def _start_level(self, schedule_options: dict):
        """The table's first entry; the schedule's own plan replaces it before any step."""
        table = schedule_options.get("levels")
        try:
            return table[0][0]
        except (TypeError, IndexError, KeyError):
            return None  # the schedule's check names what is wrong with the table


def _warn_above_break_even(levels: dict[str, float], world_size: int) -> None:
    """Top-K's all-gather sends 2 k values and indices from each of `world_size` workers: a
    layer costs 2 x ratio x world_size of its dense all-reduce, so a ratio at or above
    1 / (2 x world_size) saves nothing."""
    break_even = 1 / (2 * world_size)
    for name, ratio in levels.items():
        if break_even <= ratio < 1:
            warnings.warn(
                f"Accordion: Top-K {name}={ratio:g} on {world_size} ranks sends "
                f"{2 * ratio * world_size:g}x the floats of no compression (the all-gather "
                f"sends 2 x k x {world_size}); Top-K saves traffic only below {name}="
                f"{break_even:g} (1 / (2 x world size))", AccordionWarning, stacklevel=3)


__all__ = ["AdaptiveCompression", "Accordion", "LGreCo", "LGreCoAccordion", "PhaseRule",
           "AccordionWarning"]
