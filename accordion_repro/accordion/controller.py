"""The end of an epoch, one way for the trainer (engine/trainer.py) and for the own-code objects
(ddp.py): rank 0 measures, the measurement is broadcast, every rank's schedule plans from it.

Broadcasting the measurement rather than rank 0's plan keeps every rank's schedule in the same
state (so any rank's `schedule.state_dict()` is the run's), and a schedule that measures nothing
(static, phase_rule, a fixed-epoch batch switch) plans on every rank without a collective.
"""

from __future__ import annotations

from ..comm.collectives import broadcast_object
from .schedules import Plan, Schedule


class EpochDecision:
    """`decide(epoch, lr_now, lr_next)` -> (the plan from epoch + 1 on, the detector's report).

    `detector` is rank 0's (None elsewhere); `group` a CPU-capable group over the ranks
    (comm/collectives.py control_group) and `src` the global rank of its rank 0. The report is
    {} where nothing was measured.
    """

    def __init__(self, schedule: Schedule, detector, *, group=None, src: int = 0):
        self.schedule, self.detector, self.group, self.src = schedule, detector, group, src

    def __call__(self, epoch: int, lr_now: float, lr_next: float) -> tuple[Plan, dict]:
        decision = None
        if self.detector is not None:
            measured = self.detector.end_epoch(epoch, lr_now, lr_next)
            decision = {"measured": measured, "report": self.detector.report}
        if self.schedule.needs_detector:
            decision = broadcast_object(decision, src=self.src, group=self.group)
        measured, report = (decision["measured"], decision["report"]) if decision else (None, {})
        return self.schedule.on_epoch_end(epoch, measured), report
