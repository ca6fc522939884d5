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

from dataclasses import fields

import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from .accordion import DetectorSettings, Plan, build_schedule
from .comm import level_option
from .comm.collectives import broadcast_object
from .comm.ddp_hook import AccordionHookState, accordion_hook
from .comm.stats import CommStats

_STATE_VERSION = 1


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
        option = level_option(compressor)
        if option is None:
            raise ValueError(f"Accordion adapts a compression level; compressor {compressor!r} "
                             "has none (use powersgd or topk)")
        group = ddp_model.process_group
        detector = {f.name: options.pop(f.name) for f in fields(DetectorSettings) if f.name in options}
        options = {option: low, **options}
        self.state = AccordionHookState(ddp_model.module, compressor, group=group,
                                        async_op=async_op, check_levels=check_levels, **options)
        self.rank = dist.get_rank(group)
        self._src = dist.get_global_rank(group, 0)  # the group's rank 0 decides
        self.schedule = build_schedule(
            "accordion", num_layers=len(self.state.layer_names), compressor=compressor,
            default_level=options[option], base_global_batch=None,
            world_size=dist.get_world_size(group), low=low, high=high, **detector)
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

    # ---- what users read ------------------------------------------------------------------
    @property
    def layer_names(self) -> list[str]:
        """The compressible parameters (2 or more dimensions), in the order of `levels`."""
        return self.state.layer_names

    @property
    def levels(self) -> list:
        """The level of each layer in force now."""
        return self.state.levels

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
        decision = None
        if self.detector is not None:
            critical = self.detector.end_epoch(epoch, lr_now, lr_next)
            decision = {"critical": critical, "report": self.detector.report}
        decision = broadcast_object(decision, src=self._src, group=self._group)
        self.report = decision["report"]
        self.plan = self.schedule.on_epoch_end(epoch, decision["critical"])
        self.state.set_levels(self.plan.levels)
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


__all__ = ["Accordion"]
