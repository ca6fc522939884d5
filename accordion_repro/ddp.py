"""Accordion on your own DistributedDataParallel model, in one object.

    acc = Accordion(ddp_model, compressor="powersgd", low=2, high=1, eta=0.5, interval=10)
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

from .accordion import DetectorSettings, Plan, build_schedule
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


def _in_callers_words(exc: ConfigError, level: str) -> ConfigError:
    """A ConfigError of the pieces underneath, naming Accordion's own argument, not a config key
    (`compressor.ratio` is `low`, `schedule.high` is `high`, `schedule.eta` is `eta`)."""
    names = {f"compressor.{level}": "low", "schedule.low": "low", "schedule.high": "high"}
    argument = names.get(exc.key, exc.key.split(".")[-1])
    message = str(exc).removeprefix(f"{exc.key}: ")
    for key, name in names.items():
        message = message.replace(key, name)
    return ConfigError(argument, message)


class Accordion:
    """Adaptive per-layer compression for a DistributedDataParallel model.

    `low` is the level inside critical regimes (PowerSGD rank, or Top-K kept fraction) and
    `high` the level outside them; `eta`, `interval`, `lr_decay_rule` and `statistic` are the
    detector's (docs/schedules.md; their defaults are DetectorSettings'). Other keywords go to
    the compressor (error_feedback, warm_start, seed for PowerSGD; official_topk for Top-K).
    `async_op` and `check_levels` go to AccordionHookState (comm/ddp_hook.py).
    """

    def __init__(self, ddp_model: DistributedDataParallel, compressor: str = "powersgd", *,
                 low, high, async_op: bool = True, check_levels: bool = True, **options):
        if not isinstance(ddp_model, DistributedDataParallel):
            raise TypeError("Accordion needs the DistributedDataParallel-wrapped model (it "
                            "registers a communication hook on it), got "
                            f"{type(ddp_model).__name__}")
        if compressor not in COMPRESSOR_SETTINGS or level_option(compressor) is None:
            raise ValueError(f"Accordion adapts a compression level; compressor {compressor!r} "
                             "has none (use powersgd or topk)")
        option = level_option(compressor)
        passed = _compressor_options(compressor, option)
        if option in options:
            raise TypeError(f"Accordion() takes no {option}=: low and high set each layer's "
                            f"{option} (got {option}={options[option]!r})")
        unknown = sorted(set(options) - set(DETECTOR_OPTIONS) - set(passed))
        if unknown:
            raise TypeError(
                f"Accordion() got an unexpected keyword argument {unknown[0]!r}; it takes low, "
                f"high, async_op, check_levels, the detector's {', '.join(DETECTOR_OPTIONS)} "
                f"and {compressor}'s {', '.join(passed)}")
        group = ddp_model.process_group
        detector = {name: options.pop(name) for name in DETECTOR_OPTIONS if name in options}
        options = {option: low, **options}
        world_size = dist.get_world_size(group)
        try:
            # The level check runs in this object's forward pre-hook instead (below), where a
            # rank that calls end_epoch alone meets it before any gradient collective.
            self.state = AccordionHookState(ddp_model.module, compressor, group=group,
                                            async_op=async_op, check_levels=False, **options)
            self.schedule = build_schedule(
                "accordion", num_layers=len(self.state.layer_names), compressor=compressor,
                default_level=options[option], base_global_batch=None,
                world_size=world_size, low=low, high=high, **detector)
        except ConfigError as exc:
            raise _in_callers_words(exc, option) from None
        self.rank = dist.get_rank(group)
        self._src = dist.get_global_rank(group, 0)  # the group's rank 0 decides
        self.check_levels = bool(check_levels)
        if compressor == "topk" and self.rank == 0:
            _warn_above_break_even({"low": low, "high": high}, world_size)
        # Rank 0's local gradients decide, as in the paper's code; the other ranks skip the sums.
        self.detector = self.schedule.make_detector() if self.rank == 0 else None
        if self.detector is not None:
            self.detector.prepare(self.state.layer_params)
            self.state.detector = self.detector
        self.plan: Plan = self.schedule.initial_plan()
        self.state.set_levels(self.plan.levels)
        self.report: dict | None = None
        # The level check and rank 0's decision travel as CPU tensors on a gloo group over
        # the same ranks (comm/collectives.py control_group): no GPU sync, no current device.
        self._control = self.state.reducer.comm.control()
        ddp_model.register_comm_hook(self.state, accordion_hook)
        if self.check_levels:
            ddp_model.register_forward_pre_hook(self._check_before_forward)

    @torch.compiler.disable
    def _check_before_forward(self, module, args) -> None:
        """One 16-byte all-reduce per training forward, before DDP's own collectives (its
        buffer broadcast): the ranks hold the same levels and none is in end_epoch alone.

        A CPU tensor on the control group, so reading it waits for no GPU work. It runs on
        every forward, accumulation micro-batches under no_sync included, because DDP
        broadcasts its buffers on each of them: a rank in end_epoch alone must meet this check
        first. torch.compile leaves it out of the graph (compiler.disable) instead of breaking
        the graph at its host read with a warning on every rank (issue 37 item 15).
        """
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
        epoch + 1 (a decay between them sends every layer to `low`). Rank 0's detector decides;
        the decision is broadcast and every rank's schedule turns it into the same plan.
        """
        if self.check_levels:  # every rank is here, at the same epoch (one line if not)
            check_agreement(self.state.reducer, ending_epoch=epoch)
        decision = None
        if self.detector is not None:
            critical = self.detector.end_epoch(epoch, lr_now, lr_next)
            decision = {"critical": critical, "report": self.detector.report}
        decision = broadcast_object(decision, src=self._src, group=self._control)
        self.plan = self.schedule.on_epoch_end(epoch, decision["critical"])
        self.state.set_levels(self.plan.levels)
        self.report = {**decision["report"], "uncompressed_layers": self.uncompressed_layers}
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


__all__ = ["Accordion", "AccordionWarning"]
