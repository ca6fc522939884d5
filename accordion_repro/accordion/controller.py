"""What adapts the compression from epoch to epoch, held once for the trainer (engine/trainer.py)
and for the own-code objects (ddp.py): the schedule, rank 0's detector, the plan in force, the
LR-drop rule, their save and restore, and the end of an epoch: rank 0 measures, the measurement
is broadcast, every rank's schedule plans from it.

Broadcasting the measurement rather than rank 0's plan keeps every rank's schedule in the same
state (so any rank's `schedule.state_dict()` is the run's), and a schedule that measures nothing
(static, phase_rule, a fixed-epoch batch switch) plans on every rank without a collective.
"""

from __future__ import annotations

import warnings

from ..comm.collectives import broadcast_object
from ..errors import AccordionWarning
from .schedules import Plan, Schedule


class AdaptController:
    """The schedule, rank 0's detector (None elsewhere), the plan in force and the end-of-epoch
    decision. `group` is a CPU-capable group over the ranks (comm/collectives.py control_group)
    and `src` the global rank of its rank 0.

    `lr_drop` (own code's lr_decay_rule, as ddp.py parses it; None: the trainer's, which shows
    the detector every LR as it is): with a schedule that takes lr_decay_rule, a drop counts as
    a decay only from this relative size on (0.0: any drop; a drop below it is shown to the
    detector as no drop), and the rule firing at two epochs in a row warns once (a continuous
    LR schedule would hold every layer at `low`).
    """

    def __init__(self, schedule: Schedule, *, rank: int, group=None, src: int = 0,
                 lr_drop: float | None = None, filter_lr_drops: bool = False,
                 name: str = "Accordion"):
        self.schedule, self.group, self.src, self.name = schedule, group, src, name
        self.detector = schedule.make_detector() if rank == 0 else None
        self.plan: Plan = schedule.initial_plan()
        self.lr_drop = lr_drop
        self._filter = filter_lr_drops and "lr_decay_rule" in schedule.options()
        self._fired_at: int | None = None  # the last epoch whose LR drop made all layers critical
        self._warned_continuous = False

    def end_epoch(self, epoch: int, lr_now: float, lr_next: float) -> dict:
        """Decide the plan from epoch + 1 on (every rank, at the end of `epoch`); returns the
        detector's report ({} where nothing was measured)."""
        shown_next = lr_next
        if self._filter:
            shown_next = lr_next if self._counts_as_decay(lr_now, lr_next) else lr_now
        decision = None
        if self.detector is not None:
            measured = self.detector.end_epoch(epoch, lr_now, shown_next)
            decision = {"measured": measured, "report": self.detector.report}
        if self.schedule.needs_detector:
            decision = broadcast_object(decision, src=self.src, group=self.group)
        measured, report = (decision["measured"], decision["report"]) if decision else (None, {})
        self.plan = self.schedule.on_epoch_end(epoch, measured)
        if self._filter and self.detector is not None and self.lr_drop is not None:
            self._warn_if_continuous(epoch, lr_now, lr_next)
        return report

    def _counts_as_decay(self, lr_now: float, lr_next: float) -> bool:
        """lr_decay_rule=True: any drop; a number: a relative drop of at least that much."""
        if self.lr_drop is None or not lr_next < lr_now:
            return False
        return self.lr_drop == 0.0 or lr_now > 0 and (lr_now - lr_next) / lr_now >= self.lr_drop

    def _warn_if_continuous(self, epoch: int, lr_now: float, lr_next: float) -> None:
        """Rank 0, once: the rule fired at two epochs in a row. A step schedule decays a few
        times in a run; a continuous one (cosine, exponential, linear) lowers the LR every
        epoch, and with lr_decay_rule=True every layer would stay at `low` for good."""
        if not self.detector.report.get("lr_rule_fired"):
            return
        if self._fired_at == epoch - 1 and self.lr_drop == 0.0 and not self._warned_continuous:
            self._warned_continuous = True
            warnings.warn(
                f"{self.name}: the LR dropped at the end of epochs {epoch - 1} and "
                f"{epoch} (now {lr_now:.4g} -> {lr_next:.4g}, "
                f"{100 * (lr_now - lr_next) / lr_now:.2g} %): "
                "lr_decay_rule=True counts every drop as a decay and holds every layer at low "
                "in the epoch after it, so a continuous schedule (cosine, exponential, linear) "
                "never compresses at high; pass lr_decay_rule=0.5 (a drop of half or more "
                "counts) or False", AccordionWarning, stacklevel=4)
        self._fired_at = epoch

    # ---- save and restore -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The schedule's state, rank 0's detector's (None elsewhere) and the plan in force."""
        return {"schedule": self.schedule.state_dict(),
                "detector": None if self.detector is None else self.detector.state_dict(),
                "plan": self.plan.to_dict()}

    def load_state_dict(self, state: dict, *, strict: bool = True,
                        replan_from: int | None = None) -> None:
        """Resume; `strict=False` lets the detector take settings changed on resume, and
        `replan_from` (an allowed config change) plans that epoch from the new settings
        instead of restoring the saved plan. A plan saved as a Plan (checkpoints before the
        controller held it) is read too."""
        self.schedule.load_state_dict(state["schedule"])
        if self.detector is not None and state.get("detector") is not None:
            self.detector.load_state_dict(state["detector"], strict=strict)
        plan = state["plan"]
        self.plan = plan if isinstance(plan, Plan) else Plan.from_dict(plan)
        if replan_from is not None:
            self.plan = self.schedule.replan(replan_from)


class AdaptViews:
    """Read-only views of an `adapt` controller, for the objects that hold one (the trainer,
    ddp.py's AdaptiveCompression): what users and the loop read, written once."""

    adapt: AdaptController

    @property
    def schedule(self) -> Schedule:
        """The schedule that plans each epoch's levels."""
        return self.adapt.schedule

    @property
    def detector(self):
        """Rank 0's critical-regime detector (None on the other ranks and without one)."""
        return self.adapt.detector

    @property
    def plan(self) -> Plan:
        """The plan in force: each layer's level (and batch scale) until the next decision."""
        return self.adapt.plan
