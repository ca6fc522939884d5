"""The critical-regime detector and the schedules built on it (docs/schedules.md)."""

from .detector import CriticalRegimeDetector, DetectorSettings
from .registry import SCHEDULE_NAMES, SCHEDULES, build_schedule, validate_schedule
from .schedules import (AccordionSchedule, BatchAccordionSchedule, JointSchedule, Plan,
                        RegimeWindowsSchedule, Schedule, StaticSchedule, compact_levels)

__all__ = [
    "CriticalRegimeDetector", "Plan", "compact_levels", "Schedule", "StaticSchedule",
    "AccordionSchedule", "BatchAccordionSchedule", "JointSchedule", "RegimeWindowsSchedule",
    "DetectorSettings", "SCHEDULES", "SCHEDULE_NAMES", "build_schedule", "validate_schedule",
]
