"""Accordion (and its successors) on your own DistributedDataParallel or FSDP2 (fully_shard)
model, in one object.

    acc = Accordion(ddp_model, compressor="powersgd", low=2, high=1, eta=0.5, interval=10)
    # or LGreCo(ddp_model, r0=2), LGreCoAccordion(ddp_model, r0=2, low=2, high=1),
    # PhaseRule(ddp_model, boundaries=[0.5], splits=[10000], levels=[[2, 2], [2, 1]],
    #           total_epochs=30), AutoAccordion(ddp_model, low_share=0.3), any of them with
    #           compressor="acp_powersgd"
    for epoch in range(epochs):
        ...                                          # train as usual: forward, backward, step
        acc.end_epoch(epoch, lr_now, lr_next)        # every rank, at the end of each epoch

The object registers the Accordion hook on the model (comm/ddp_hook.py; for a fully_shard model,
each unit's custom reduce-scatter, comm/fsdp.py, docs/fsdp.md), feeds rank 0's detector each
bucket's (unit's) *local* gradients before they are reduced (after backward() p.grad holds the
averaged, compressed gradient, which would change the decisions), applies the schedule's
initial plan (every layer at `low`), and at the end of an epoch lets rank 0 decide, broadcasts
the decision and applies the plan on every rank. It is what the suite's trainer does in its
own loop (engine/trainer.py; docs/compressors.md says why that loop stays separate).
"""

from __future__ import annotations

import copy
import difflib
import warnings
import zlib
from dataclasses import fields

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .accordion import SCHEDULES, DetectorSettings, Plan, build_schedule
from .accordion.controller import AdaptController, AdaptViews
from .comm.registry import COMPRESSORS, level_kind, level_option
from .comm.ddp_hook import AccordionHookState, accordion_hook, check_agreement
from .comm.fsdp import FSDPReducerState, FSDPSetupError, is_fsdp_model
from .comm.stats import CommStats
from .errors import AccordionWarning, ConfigError
from .options import Options, defaults_of, is_real

_STATE_VERSION = 1
DETECTOR_OPTIONS = tuple(f.name for f in fields(DetectorSettings))




def _compressor_options(compressor: str, level: str) -> list[str]:
    """The compressor's own keywords that Accordion passes through (its level is low/high)."""
    return sorted(f.name for f in fields(COMPRESSORS[compressor].SETTINGS) if f.name != level)


def _adaptable() -> tuple[str, ...]:
    """The compressors whose level Accordion adapts (those registered now, comm/registry.py)."""
    return tuple(sorted(name for name in COMPRESSORS if level_option(name) is not None))


def _passed_options() -> tuple[str, ...]:
    """Every option any adaptable compressor passes through."""
    return tuple(sorted({option for name in _adaptable()
                         for option in _compressor_options(name, level_option(name))}))


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


ATTACHED = "_accordion_repro_attached"  # set on a model an Accordion-family object hooks


class AdaptiveCompression(AdaptViews):
    """One object on a DistributedDataParallel or fully_shard model: the hook, rank 0's
    measurement, the schedule; per-layer levels decided at the end of each epoch and applied on
    every rank.

    A subclass names its schedule (`SCHEDULE`, a key of accordion.SCHEDULES) and which of the
    schedule's arguments gives the compressor its starting level (`LEVEL_FROM`,
    `_start_level`). Keywords the schedule takes go to the schedule; the compressor's other
    options (error_feedback, seed, ...) to the compressor; `async_op` and `check_levels` to
    AccordionHookState (comm/ddp_hook.py); `async_op` is DDP's only (an FSDP unit's
    reduce-scatter is synchronous in FSDP's own stream). Every rank must pass the same
    arguments: one small all-reduce at construction compares them.
    """

    SCHEDULE: str
    LEVEL_FROM: str  # the argument a message names for the compressor's level
    TAKES_TOTAL_EPOCHS = False  # only a schedule with epochs as fractions of the run needs it

    def __init__(self, ddp_model, compressor: str = "powersgd", *,
                 async_op: bool | None = None, check_levels: bool = True,
                 total_epochs: int | None = None, **options):
        """`total_epochs`: only for epochs given as fractions of the run (phase_rule).
        `async_op` (DDP only; default True): interleave the compressed reduction with backward."""
        who = type(self).__name__
        fsdp = is_fsdp_model(ddp_model)
        if not fsdp and not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError(f"{who} needs the DistributedDataParallel-wrapped model or a "
                            "model wrapped with fully_shard (it hooks their gradient "
                            f"communication), got {type(ddp_model).__name__}")
        if fsdp and async_op is not None:  # it would be accepted and do nothing
            raise TypeError(f"{who}(async_op=...) is DDP's only: under FSDP each unit's "
                            "reduce-scatter runs in FSDP's own stream; leave async_op out")
        async_op = True if async_op is None else async_op
        attached = getattr(ddp_model, ATTACHED, None)
        if attached is not None:  # torch would say only "register_comm_hook must be called once"
            raise ValueError(f"{who}: this model already has {attached} attached (one "
                             f"Accordion-family object per model: it owns the model's gradient "
                             f"communication); build the second one on another model")
        _check_compressor(compressor, who)
        self._compressor = compressor
        option = level_option(compressor)
        passed = _compressor_options(compressor, option)
        own = _schedule_arguments(self.SCHEDULE)
        detector_options = [o for o in DETECTOR_OPTIONS
                            if o in SCHEDULES[self.SCHEDULE].options()]
        if option in options:
            setters = " and ".join(a for a in own if a in ("low", "high")) or "the schedule"
            raise TypeError(f"{who}() takes no {option}=: {setters} set each "
                            f"layer's {option} (got {option}={options[option]!r})")
        unknown = sorted(set(options) - set(own) - set(detector_options) - set(passed))
        if unknown:
            detector_text = (f"the detector's {', '.join(detector_options)} and "
                             if detector_options else "")
            raise TypeError(
                f"{who}() got an unexpected keyword argument {unknown[0]!r}; it "
                f"takes {', '.join(own)}, async_op, check_levels, {detector_text}"
                f"{compressor}'s {', '.join(passed)}")
        schedule_options = {name: options.pop(name) for name in [*own, *detector_options]
                            if name in options}
        # Every rank must pass the same arguments (checked below, once, across the ranks):
        # the same names, in the same order, on every rank, whatever the compressor.
        compressor_defaults = defaults_of(COMPRESSORS[compressor].SETTINGS)
        schedule_defaults = defaults_of(SCHEDULES[self.SCHEDULE].Settings)
        arguments = {"compressor": compressor,
                     **{name: schedule_options.get(name, schedule_defaults.get(name))
                        for name in [*own, *detector_options]},
                     "async_op": async_op, "check_levels": check_levels,
                     **({"total_epochs": total_epochs} if self.TAKES_TOTAL_EPOCHS else {}),
                     **{name: options.get(name, compressor_defaults.get(name))
                        for name in _passed_options()}}
        # lr_decay_rule, for a schedule driven by Accordion's detector: True, False or a
        # relative drop (the detector itself is shown only the drops that count).
        self.lr_drop = (_lr_drop(schedule_options.get("lr_decay_rule", True))
                        if "lr_decay_rule" in detector_options else None)
        if "lr_decay_rule" in schedule_options:
            schedule_options["lr_decay_rule"] = self.lr_drop is not None
        try:
            Options(who, {"check_levels": check_levels}).flag("check_levels")
            start = {option: self._start_level(schedule_options), **options}
            # AccordionHookState refuses an async_op that is not a bool ("no" is truthy).
            # The level check runs in this object's forward pre-hook instead (below), where a
            # rank that calls end_epoch alone meets it before any gradient collective.
            if fsdp:
                self.state = FSDPReducerState(ddp_model, compressor, check_levels=False,
                                              **start)
                group = self.state.group
            else:
                group = ddp_model.process_group
                self.state = AccordionHookState(ddp_model.module, compressor, group=group,
                                                async_op=async_op, check_levels=False,
                                                **start)
            world_size = dist.get_world_size(group)
            schedule = build_schedule(
                self.SCHEDULE, num_layers=len(self.state.layer_names), compressor=compressor,
                default_level=start[option], base_global_batch=None, world_size=world_size,
                total_epochs=total_epochs, layer_shapes=self.state.reducer.matrix_shapes,
                **schedule_options)
        except ConfigError as exc:
            raise _in_callers_words(exc, option, self.LEVEL_FROM, own) from None
        _check_same_on_every_rank(arguments, self.state.reducer, who)
        self.rank = dist.get_rank(group)
        self._src = dist.get_global_rank(group, 0)  # the group's rank 0 decides
        self.check_levels = check_levels
        if compressor == "topk" and self.rank == 0:
            _warn_above_break_even({k: v for k, v in schedule_options.items()
                                    if k in ("low", "high")}, world_size)
        # The level check and rank 0's decision travel as CPU tensors on a gloo group over
        # the same ranks (comm/collectives.py control_group): no GPU sync, no current device.
        self._control = self.state.reducer.comm.control()
        # Rank 0's local gradients decide, as in the paper's code; the other ranks skip the sums.
        self.adapt = AdaptController(schedule, rank=self.rank, group=self._control, src=self._src,
                                     lr_drop=self.lr_drop, filter_lr_drops=True,
                                     name=type(self).__name__)
        if self.detector is not None:
            self.detector.prepare(self.state.layer_params)
            self.state.detector = self.detector
        self.state.set_levels(self.plan.levels)
        self.report: dict | None = None
        self._group = group
        if not fsdp:  # an FSDP state has set each unit's custom reduce-scatter already
            ddp_model.register_comm_hook(self.state, accordion_hook)
        setattr(ddp_model, ATTACHED, who)
        if self.check_levels:  # before FSDP's own pre-forward hook (its all-gather) too
            ddp_model.register_forward_pre_hook(self._check_before_forward, prepend=fsdp)
        if fsdp:
            self._watch_for_a_child_unit(ddp_model, who)
            if world_size == 1 and self.rank == 0:
                warnings.warn(f"{who}: this FSDP model is sharded over 1 rank, so no gradient "
                              "is reduced and Accordion compresses nothing; run it on 2 or more "
                              "ranks", AccordionWarning, stacklevel=2)

    @staticmethod
    def _watch_for_a_child_unit(model, who: str) -> None:
        """Refuse, at the first forward, a unit that is not FSDP's root (a child passed instead
        of the root would leave every other unit's gradients uncompressed). Which unit is the
        root is known only once the root's forward has set FSDP's state up (lazy init)."""
        def check(module, args):
            handle.remove()
            if module._get_fsdp_state()._is_root is False:
                raise FSDPSetupError(f"{who} was given an FSDP unit that is not the root of "
                                     f"its model ({type(module).__name__}): pass the module "
                                     "fully_shard was applied to last, the root, so that every "
                                     "unit's gradient goes through Accordion")
        handle = model.register_forward_pre_hook(check)

    def _start_level(self, schedule_options: dict):
        """The compressor's level before the first plan (each subclass's own argument)."""
        return schedule_options.get(self.LEVEL_FROM)

    @torch.compiler.disable
    def _check_before_forward(self, module, args) -> None:
        """One 16-byte all-reduce per training forward, before DDP's (FSDP's) own collectives
        (its buffer broadcast; its all-gather): the ranks hold the same levels and none is in
        end_epoch alone.

        A CPU tensor on the control group, so reading it waits for no GPU work. It runs on
        every forward, accumulation micro-batches under no_sync included, because DDP
        broadcasts its buffers on each of them: a rank in end_epoch alone must meet this check
        first. torch.compile leaves it out of the graph (compiler.disable) instead of breaking
        the graph at its host read with a warning on every rank (issue 37 item 15).
        """
        if module.training and torch.is_grad_enabled():
            check_agreement(self.state.reducer)

    # ---- what users read (and schedule, detector, plan: AdaptViews) ----------------------
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
        """Floats, bytes and collectives this rank sent since the last call (under FSDP also
        fsdp_reduce_scatter_bytes: what FSDP's own reduce-scatter would have sent)."""
        return self.state.pop_stats()

    # ---- end of an epoch ------------------------------------------------------------------
    def end_epoch(self, epoch: int, lr_now: float, lr_next: float) -> Plan:
        """Decide the levels from epoch + 1 on; call it on every rank at the end of `epoch`.

        `lr_now` is the learning rate used during `epoch`, `lr_next` the one scheduled for
        epoch + 1 (for Accordion's detector a decay between them sends every layer to `low`).
        Rank 0's measurement (the detector's flags, L-GreCo's error table) is broadcast on the
        control group and every rank's schedule turns it into the same plan; a schedule that
        measures nothing (phase_rule) plans from the epoch alone.
        """
        for name, value in (("lr_now", lr_now), ("lr_next", lr_next)):
            if not is_real(value):  # a str would be compared as text: "0.01" > "0.1"
                raise TypeError(f"end_epoch({name}=...) takes a number, got {value!r} "
                                f"({type(value).__name__})")
        if self.check_levels:  # every rank is here, at the same epoch (one line if not)
            check_agreement(self.state.reducer, ending_epoch=epoch)
        report = self.adapt.end_epoch(epoch, lr_now, lr_next)
        self.state.set_levels(self.plan.levels)
        self.report = {**report, "uncompressed_layers": self.uncompressed_layers,
                       "error_memory_bytes": self.state.reducer.memory_bytes()}
        return self.plan

    # ---- checkpoints ----------------------------------------------------------------------
    def state_dict(self) -> dict:
        """This rank's state: save it on every rank (each rank has its own error memory).

        Holds the reducer (error memory, warm-start Q, levels, draw counters), rank 0's
        detector (epoch sums and history), the schedule and the plan in force.
        """
        return {"version": _STATE_VERSION, "rank": self.rank,
                "reducer": self.state.reducer.state_dict(), **self.adapt.state_dict(),
                "report": self.report}

    def load_state_dict(self, state: dict) -> None:
        """Resume from this rank's state_dict; the next step computes as if never stopped."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"not an Accordion state (version {state.get('version')!r})")
        if state["rank"] != self.rank:
            raise ValueError(f"this state was saved by rank {state['rank']}, not rank "
                             f"{self.rank}: each rank loads its own (error memory differs)")
        self.state.reducer.load_state_dict(state["reducer"])
        self.adapt.load_state_dict(state)
        if self.detector is not None:
            self.detector.prepare(self.state.layer_params)  # back onto the parameters' device
        self.report = state["report"]

    # ---- manual control -------------------------------------------------------------------
    def set_levels(self, levels) -> None:
        """Override the plan's levels (one per layer_names entry), on every rank alike."""
        self.state.set_levels(levels)

    def set_level(self, layer_name: str, level) -> None:
        self.state.set_level(layer_name, level)


class Accordion(AdaptiveCompression):
    """Adaptive per-layer compression for a DistributedDataParallel model.

    `low` is the level inside critical regimes (PowerSGD rank, Top-K kept fraction, or the
    precision compressor's bits per value: 32, 16, 8) and `high` the level outside them; `eta`,
    `interval`, `lr_decay_rule` and `statistic` are the detector's (docs/schedules.md; their
    defaults are DetectorSettings'). Other keywords go to the compressor (error_feedback,
    warm_start, seed for PowerSGD; official_topk for Top-K; fp8_format, block_size,
    stochastic_rounding, seed for precision).
    `async_op` and `check_levels` go to AccordionHookState (comm/ddp_hook.py).
    """

    SCHEDULE = "accordion"
    LEVEL_FROM = "low"

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 low, high, async_op: bool | None = None, check_levels: bool = True, **options):
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
                 r0: int, async_op: bool | None = None, check_levels: bool = True, **options):
        super().__init__(ddp_model, compressor, r0=r0, async_op=async_op,
                         check_levels=check_levels, **options)


class LGreCoAccordion(AdaptiveCompression):
    """L-GreCo + Accordion (schedule=lgreco_accordion): Accordion's detector picks `low` or
    `high` per layer, and the error of that choice (times alpha) is L-GreCo's budget."""

    SCHEDULE = "lgreco_accordion"
    LEVEL_FROM = "low"

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 r0: int, low: int, high: int, async_op: bool | None = None,
                 check_levels: bool = True, **options):
        super().__init__(ddp_model, compressor, r0=r0, low=low, high=high, async_op=async_op,
                         check_levels=check_levels, **options)


class PhaseRule(AdaptiveCompression):
    """The zero-cost phase/size rule (schedule=phase_rule): levels[phase][size group], phases
    starting at `boundaries` (epochs, or fractions of `total_epochs`), size groups at `splits`
    (entries of a layer). No measurement and no broadcast at the end of an epoch."""

    SCHEDULE = "phase_rule"
    LEVEL_FROM = "levels"
    TAKES_TOTAL_EPOCHS = True

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 boundaries, splits, levels, total_epochs: int | None = None,
                 async_op: bool | None = None, check_levels: bool = True, **options):
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


def _check_compressor(compressor, who: str = "Accordion") -> None:
    """Only compressors with a level to adapt; an unknown name gets the valid ones."""
    adaptable = _adaptable()
    if compressor in adaptable:
        return
    valid = ", ".join(map(repr, adaptable[:-1])) + f" or {adaptable[-1]!r}"
    if compressor in COMPRESSORS:
        raise ConfigError("compressor", f"{compressor!r} has no compression level to adapt; "
                                        f"{who} takes {valid}")
    close = difflib.get_close_matches(str(compressor).lower(), adaptable, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError("compressor", f"unknown compressor {compressor!r}: {who} takes {valid} "
                                    f"(PowerSGD ranks, Top-K kept fractions or precision's bits){hint}")


def _lr_drop(rule) -> float | None:
    """lr_decay_rule as a threshold: None (off), 0.0 (any drop, the paper's rule) or the
    relative drop (lr_now - lr_next) / lr_now from which a drop counts as a decay."""
    if isinstance(rule, bool):
        return 0.0 if rule else None
    if is_real(rule) and 0 < rule <= 1:
        return float(rule)
    raise ConfigError("lr_decay_rule", "must be True (any LR drop is a decay), False, or the "
                                       "relative drop from which a drop counts, in (0, 1]; "
                                       f"got {rule!r}")


def _fingerprint(value) -> int:
    """The same number on every process for equal arguments (2 and 2.0 alike)."""
    text = repr(float(value)) if is_real(value) else repr(value)
    return zlib.crc32(text.encode())


def _check_same_on_every_rank(arguments: dict, reducer, who: str = "Accordion") -> None:
    """One small all-reduce at construction: every rank passed the same arguments. A rank
    with another `high` would otherwise train alike until the levels first diverge, and a
    rank with another `seed` would average unrelated Q's without any error."""
    differ = reducer.comm.differing([_fingerprint(v) for v in arguments.values()],
                                    reducer.device)
    names = [name for name, different in zip(arguments, differ) if different]
    if names:
        also = f" (also {', '.join(names[1:])})" if names[1:] else ""
        raise ConfigError(names[0], f"the ranks passed {who} different values{also}; rank "
                                    f"{reducer.comm.rank} passed {arguments[names[0]]!r}: every "
                                    "rank must pass the same arguments")


def lr_now_and_next(scheduler, group: int = 0) -> tuple[float, float]:
    """(lr_now, lr_next) of param group `group` for Accordion.end_epoch, from a torch LR
    scheduler stepped once per epoch: call it at the end of the epoch, before
    `scheduler.step()`. It steps the scheduler once and restores it (and the optimizer's
    param groups: LR, momentum, betas), so any schedule (chained, sequential, one-cycle)
    answers as its own step() will."""
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise TypeError("ReduceLROnPlateau decides its next LR from a metric passed to step(): "
                        "pass lr_now and lr_next to end_epoch yourself (lr_next = lr_now "
                        "unless the plateau rule will fire)")
    optimizer = scheduler.optimizer
    lr_now = optimizer.param_groups[group]["lr"]
    saved_scheduler = copy.deepcopy(scheduler.state_dict())
    saved_groups = [copy.deepcopy({k: v for k, v in g.items() if k != "params"})
                    for g in optimizer.param_groups]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "step() before optimizer.step()" and the like
            scheduler.step()
        lr_next = optimizer.param_groups[group]["lr"]
    finally:
        scheduler.load_state_dict(saved_scheduler)
        for param_group, saved in zip(optimizer.param_groups, saved_groups):
            param_group.update(saved)
    return float(lr_now), float(lr_next)


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


class AutoAccordion(AdaptiveCompression):
    """Accordion with its levels and eta chosen from the gradients (schedule=auto): per layer,
    `low` and `high` are the cheapest candidates (PowerSGD ranks 1, 2, 4, ... max_rank; Top-K
    fractions below 1 / (2 x world size) down to min_fraction) whose relative error on the
    epoch's gradient is within error_low and error_high, or `high` from a traffic (budget) or
    step-time budget (step_time, link_bps, latency_s, compute_time); with low_share, eta is the
    (1 - low_share) quantile of the layers' norm ratios at each check, floored at eta_floor and
    noise_z x the measured noise of the ratio (docs/schedules.md). Keywords: those, low and high
    (to pin one), bins, and the detector's eta, interval, lr_decay_rule, statistic."""

    SCHEDULE = "auto"
    LEVEL_FROM = "low"

    def _start_level(self, schedule_options: dict):
        """A pinned `low`, else the smallest Top-K candidate or the largest PowerSGD one; only
        a start: the schedule's initial plan (its own largest candidate) replaces it at once."""
        from accordion_repro.accordion.auto import AutoSettings

        if schedule_options.get("low") is not None:
            return schedule_options["low"]
        if level_kind(self._compressor) is float:  # Top-K's kept fractions
            return schedule_options.get("min_fraction", AutoSettings.min_fraction)
        return schedule_options.get("max_rank", AutoSettings.max_rank)


__all__ = ["AdaptiveCompression", "Accordion", "LGreCo", "LGreCoAccordion", "PhaseRule",
           "AutoAccordion", "AccordionWarning", "lr_now_and_next"]
