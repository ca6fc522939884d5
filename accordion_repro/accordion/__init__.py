"""The critical-regime detector and the schedules built on it (docs/schedules.md)."""

from .detector import CriticalRegimeDetector, DetectorSettings
from .schedules import (SCHEDULE_NAMES, SCHEDULES, AccordionSchedule, BatchAccordionSchedule,
                        JointSchedule, Plan, RegimeWindowsSchedule, Schedule, StaticSchedule,
                        build_schedule, compact_levels, validate_schedule)

__all__ = [
    "CriticalRegimeDetector", "Plan", "compact_levels", "Schedule", "StaticSchedule",
    "AccordionSchedule", "BatchAccordionSchedule", "JointSchedule", "RegimeWindowsSchedule",
    "DetectorSettings", "SCHEDULES", "SCHEDULE_NAMES", "build_schedule", "validate_schedule",
]
