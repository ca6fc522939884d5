"""build_schedule / validate_schedule: the config-facing entry points of accordion/."""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ConfigError
from .options import reject_unknown
from .schedules import (AccordionSchedule, BatchAccordionSchedule, JointSchedule,
                        RegimeWindowsSchedule, Schedule, ScheduleContext, StaticSchedule)

SCHEDULES: dict[str, type[Schedule]] = {
    cls.name: cls for cls in (StaticSchedule, AccordionSchedule, BatchAccordionSchedule,
                              JointSchedule, RegimeWindowsSchedule)
}
SCHEDULE_NAMES = tuple(SCHEDULES)


def _parse(name, options: Mapping, context: ScheduleContext) -> tuple[type[Schedule], dict]:
    if name not in SCHEDULES:
        raise ConfigError("schedule.name",
                          f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    cls = SCHEDULES[name]
    options = dict(options)
    if options.pop("name", name) != name:
        raise ConfigError("schedule.name", f"two names given: {name!r} and options['name']")
    reject_unknown(name, options, cls.OPTIONS)
    return cls, cls.parse(options, context)


def validate_schedule(name, options: Mapping, /, *, compressor: str, default_level,
                      base_global_batch: int, world_size: int,
                      total_epochs: int | None = None) -> None:
    """Raise ConfigError naming `schedule.<key>` for anything build_schedule would refuse.

    `options` is the schedule config node (its `name` key, if present, is ignored).
    `total_epochs` is needed only when an epoch is given as a fraction.
    """
    _parse(name, options, ScheduleContext(compressor, base_global_batch, world_size, total_epochs))


def build_schedule(name: str, /, *, num_layers: int, compressor: str, default_level,
                   base_global_batch: int, world_size: int, total_epochs: int | None = None,
                   **options) -> Schedule:
    """A ready schedule; the engine gets its detector from `schedule.make_detector()`.

    `options` may be the whole schedule config node, `name` included (`**cfg.schedule`).
    """
    context = ScheduleContext(compressor, base_global_batch, world_size, total_epochs)
    cls, kwargs = _parse(name, options, context)
    return cls(num_layers, default_level=default_level, base_global_batch=base_global_batch,
               **kwargs)
