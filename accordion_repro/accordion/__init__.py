"""The critical-regime detector and the schedules built on it (docs/schedules.md)."""

from .detector import CriticalRegimeDetector, DetectorSettings
from .factory import SCHEDULE_NAMES, SCHEDULES, build_schedule, validate_schedule
from .plan import Plan, compact_levels
from .schedules import (AccordionSchedule, BatchAccordionSchedule, JointSchedule,
                        RegimeWindowsSchedule, Schedule, StaticSchedule)

__all__ = [
    "CriticalRegimeDetector", "Plan", "compact_levels", "Schedule", "StaticSchedule",
    "AccordionSchedule", "BatchAccordionSchedule", "JointSchedule", "RegimeWindowsSchedule",
    "DetectorSettings", "SCHEDULES", "SCHEDULE_NAMES", "build_schedule", "validate_schedule",
]
