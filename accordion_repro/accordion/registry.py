"""The schedules by name, and the config-facing entry points of accordion/.

Its own module, above schedules.py, successors.py and auto.py: the successors and `auto` build on
the base classes of schedules.py, and the table of every schedule imports them all, so the
table living in schedules.py made an import circle (issue 57).
"""

from __future__ import annotations

from collections.abc import Mapping

from ..comm.registry import level_kind
from ..errors import ConfigError
from ..options import require_settings
from .auto import AutoSchedule
from .schedules import (AccordionSchedule, BatchAccordionSchedule, JointSchedule,
                        RegimeWindowsSchedule, Schedule, ScheduleContext, ScheduleOptions,
                        StaticSchedule)
from .successors import SUCCESSOR_SCHEDULES

SCHEDULES: dict[str, type[Schedule]] = {
    cls.name: cls for cls in (StaticSchedule, AccordionSchedule, BatchAccordionSchedule,
                              JointSchedule, RegimeWindowsSchedule, *SUCCESSOR_SCHEDULES,
                              AutoSchedule)
}
SCHEDULE_NAMES = tuple(SCHEDULES)


def _context(name: str, compressor: str, world_size: int,
             total_epochs: int | None) -> ScheduleContext:
    # The compressor's kind of level comes from comm/, the one table of compressors.
    return ScheduleContext(name, compressor, level_kind(compressor), world_size, total_epochs)


def _parse(name, options: Mapping, compressor: str, world_size: int,
           total_epochs: int | None) -> tuple[type[Schedule], object, ScheduleContext]:
    if name not in SCHEDULES:
        raise ConfigError("schedule.name",
                          f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULE_NAMES)}")
    cls = SCHEDULES[name]
    options = dict(options)
    if options.pop("name", name) != name:
        raise ConfigError("schedule.name", f"two names given: {name!r} and options['name']")
    context = _context(name, compressor, world_size, total_epochs)
    reader = ScheduleOptions(options, cls.Settings, context)
    reader.reject_unknown(cls.options(), f"schedule {name!r}")
    return cls, cls.Settings.read(reader), context


def validate_schedule(name, options: Mapping, /, *, compressor: str, world_size: int,
                      total_epochs: int | None = None):
    """The schedule's checked Settings; ConfigError naming `schedule.<key>` for anything
    build_schedule would refuse.

    `options` is the schedule config node (its `name` key, if present, is ignored).
    `total_epochs` is needed only when an epoch is given as a fraction.
    """
    return _parse(name, options, compressor, world_size, total_epochs)[1]


def build_schedule(name: str, /, *, num_layers: int, compressor: str, default_level,
                   base_global_batch: int, world_size: int, total_epochs: int | None = None,
                   layer_shapes=None, settings=None, **options) -> Schedule:
    """A ready schedule; the engine gets its detector from `schedule.make_detector()`.

    `options` may be the whole schedule config node, `name` included (`**cfg.schedule`); or
    `settings` is the schedule's Settings, already checked (the trainer's RunSettings.schedule,
    which validate_schedule made with the same compressor, world size and epochs).
    `default_level` is the compressor's own level, reported for layers no plan sets.
    `layer_shapes`: the (n, m) of each compressible layer (the reducer's `matrix_shapes`),
    needed by the schedules that weigh layers by size (lgreco, lgreco_accordion, phase_rule,
    auto); auto also gets the context (its candidates depend on the compressor and world size).
    """
    if settings is None:
        cls, settings, context = _parse(name, options, compressor, world_size, total_epochs)
    else:
        cls = SCHEDULES[name]
        require_settings(settings, cls.Settings, f"build_schedule({name!r})",
                         "RunSettings.schedule, or the options as keywords")
        if options:
            raise TypeError(f"build_schedule({name!r}) takes settings= or keywords, not both")
        context = _context(name, compressor, world_size, total_epochs)
    extra = {"layer_shapes": layer_shapes} if hasattr(cls, "layer_shapes_needed") else {}
    if getattr(cls, "context_needed", False):
        extra["context"] = context
    return cls(num_layers, settings, default_level=default_level,
               base_global_batch=base_global_batch, **extra)
