"""build_schedule / validate_schedule: the config-facing entry points of accordion/."""

from __future__ import annotations

from collections.abc import Mapping

from ..comm.config import level_kind
from ..errors import ConfigError
from ..options import Options
from .schedules import (AccordionSchedule, BatchAccordionSchedule, JointSchedule,
                        RegimeWindowsSchedule, Schedule, ScheduleContext, StaticSchedule)

SCHEDULES: dict[str, type[Schedule]] = {
    cls.name: cls for cls in (StaticSchedule, AccordionSchedule, BatchAccordionSchedule,
                              JointSchedule, RegimeWindowsSchedule)
}
SCHEDULE_NAMES = tuple(SCHEDULES)


def _parse(name, options: Mapping, compressor: str, world_size: int,
           total_epochs: int | None) -> tuple[type[Schedule], object]:
    if name not in SCHEDULES:
        raise ConfigError("schedule.name",
                          f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    cls = SCHEDULES[name]
    options = dict(options)
    if options.pop("name", name) != name:
        raise ConfigError("schedule.name", f"two names given: {name!r} and options['name']")
    reader = Options("schedule", options, cls.Settings)
    reader.reject_unknown(cls.options(), f"schedule {name!r}")
    # The compressor's kind of level comes from comm/, the one table of compressors.
    context = ScheduleContext(compressor, level_kind(compressor), world_size, total_epochs)
    return cls, cls.parse(reader, context)


def validate_schedule(name, options: Mapping, /, *, compressor: str, default_level=None,
                      base_global_batch: int, world_size: int,
                      total_epochs: int | None = None):
    """The schedule's checked Settings; ConfigError naming `schedule.<key>` for anything
    build_schedule would refuse.

    `options` is the schedule config node (its `name` key, if present, is ignored).
    `total_epochs` is needed only when an epoch is given as a fraction.
    """
    return _parse(name, options, compressor, world_size, total_epochs)[1]


def build_schedule(name: str, /, *, num_layers: int, compressor: str, default_level,
                   base_global_batch: int, world_size: int, total_epochs: int | None = None,
                   **options) -> Schedule:
    """A ready schedule; the engine gets its detector from `schedule.make_detector()`.

    `options` may be the whole schedule config node, `name` included (`**cfg.schedule`).
    `default_level` is the compressor's own level, reported for layers no plan sets.
    """
    cls, settings = _parse(name, options, compressor, world_size, total_epochs)
    return cls(num_layers, settings, default_level=default_level,
               base_global_batch=base_global_batch)
