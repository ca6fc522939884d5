"""Reading one config node into typed values, with errors that name `<section>.<option>`.

Every package reads its node through `Options` into a frozen settings object of its own, so a
typo or an out-of-range value is refused with the same wording wherever it is, before any rank
starts: `compressor.rank: the PowerSGD rank must be an integer >= 1, got 0`.

An option absent from the node takes its settings object's default when it has one (the
dataclass is the one place a default lives; conf/ gets it through `register_defaults`), and is
otherwise required.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from numbers import Integral, Real
from typing import ClassVar

from .errors import ConfigError

_NO_DEFAULT = object()


def is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def defaults_of(settings: type) -> dict:
    """The options a settings dataclass gives a default, with that default."""
    return {f.name: f.default for f in dataclasses.fields(settings)
            if f.default is not dataclasses.MISSING}


class Options:
    """The values of config node `section`, read one option at a time."""

    def __init__(self, section: str, values: Mapping, settings: type | None = None):
        self.section, self.values = section, dict(values)
        self.defaults = defaults_of(settings) if settings is not None else {}

    def key(self, option: str) -> str:
        return f"{self.section}.{option}" if self.section else option  # "": the top level

    def error(self, option: str, message: str) -> ConfigError:
        return ConfigError(self.key(option), message)

    def reject_unknown(self, allowed, owner: str) -> None:
        """Refuse options `owner` (e.g. "schedule 'accordion'") does not take."""
        unknown = sorted(set(self.values) - set(allowed))
        if unknown:
            known = ", ".join(sorted(allowed)) or "none"
            raise self.error(unknown[0], f"{owner} has no option {unknown[0]!r} (it takes: {known})")

    def get(self, option: str, default=_NO_DEFAULT):
        """The raw value: given, else the settings default, else `default`, else required."""
        value = self.values.get(option)
        if value is None and option not in self.values:
            value = self.defaults.get(option, default)
        if value is _NO_DEFAULT:
            raise self.error(option, "is required")
        return value

    def flag(self, option: str) -> bool:
        value = self.get(option)
        if not isinstance(value, bool):
            raise self.error(option, f"must be true or false, got {value!r}")
        return value

    def integer(self, option: str, *, minimum: int = 1, optional: bool = False,
                what: str = "") -> int | None:
        """An integer >= minimum; None passes when `optional` (an unset limit)."""
        value = self.get(option, None if optional else _NO_DEFAULT)
        if value is None and optional:
            return None
        if not is_int(value) or value < minimum:
            raise self.error(option, f"{what + ' ' if what else ''}must be an integer >= "
                                     f"{minimum}, got {value!r}")
        return int(value)

    def number(self, option: str, *, low: float = 0.0, high: float | None = None,
               closed: str = "", optional: bool = False, what: str = "") -> float | None:
        """A number in (low, high): `closed` holds "low" and/or "high" for a closed end."""
        value = self.get(option, None if optional else _NO_DEFAULT)
        if value is None and optional:
            return None
        ok = is_real(value)
        if ok:
            ok = (value >= low if "low" in closed else value > low) and \
                (high is None or (value <= high if "high" in closed else value < high))
        if not ok:
            left = "[" if "low" in closed else "("
            right = "]" if "high" in closed else ")"
            wanted = (f"{'>=' if 'low' in closed else '>'} {low:g}" if high is None
                      else f"in {left}{low:g}, {high:g}{right}")
            raise self.error(option, f"{what + ' ' if what else ''}must be a number {wanted}, "
                                     f"got {value!r}")
        return float(value)

    def choice(self, option: str, choices) -> str:
        value = self.get(option)
        if value not in choices:
            raise self.error(option, f"must be one of {', '.join(map(str, choices))}; got {value!r}")
        return value


# What a resumed run may do with an option (rundir.py): "fixed" must match the run in the
# directory; "free" says where or how visibly a run happens, not what it computes, and may change
# freely; "changeable" may change under trainer.allow_config_change, from the first resumed epoch.
ON_RESUME = ("fixed", "free", "changeable")
NOT_ADDED = object()  # option(added=...) not given: the option is as old as the run directories


def option(read, *args, default=dataclasses.MISSING, help: str, on_resume: str = "fixed",
           added=NOT_ADDED, **kwargs):
    """A settings field read by `read(options, name, *args, **kwargs)` (an Options method).

    `default`, when given, is the option's one default; `help` says what it does (listed in
    docs/options.md); `on_resume` is one of ON_RESUME; `added`, for an option added after runs
    were made, is the value a run directory without it ran as.
    """
    if on_resume not in ON_RESUME:
        raise ValueError(f"on_resume must be one of {ON_RESUME}, got {on_resume!r}")
    if not help.strip():
        raise ValueError("every option says what it does: give help=")
    return dataclasses.field(default=default, metadata={
        "read": lambda o, name: read(o, name, *args, **kwargs), "help": help,
        "on_resume": on_resume, "added": added})


class Settings:
    """Base of a frozen dataclass of `option` fields: the options of config node SECTION."""

    SECTION: ClassVar[str]

    @classmethod
    def from_config(cls, node: Mapping, owner: str | None = None):
        """Read `node`; with `owner`, options the class does not have are refused first."""
        o = Options(cls.SECTION, node, cls)
        if owner is not None:
            o.reject_unknown([f.name for f in dataclasses.fields(cls)], owner)
        return cls.read(o)

    @classmethod
    def read(cls, o: Options):
        return cls(**{f.name: f.metadata["read"](o, f.name) for f in dataclasses.fields(cls)})


def as_epoch(value, key: str, total_epochs: int | None) -> int:
    """An epoch given as an int, or as a float fraction in [0, 1] of the run's total epochs.

    Fractions let `scale=cpu` shrink a paper-scale epoch (150 of 300 -> 0.5) without a
    second preset; they are rounded to the nearest epoch.
    """
    if is_int(value):
        if value < 0:
            raise ConfigError(key, f"an epoch must be >= 0, got {value!r}")
        return int(value)
    if is_real(value) and 0.0 <= float(value) <= 1.0:
        if total_epochs is None:
            raise ConfigError(key, f"{value!r} is a fraction of the total epochs, but the total "
                                   "epochs were not given (build_schedule(total_epochs=...))")
        return int(float(value) * total_epochs + 0.5)
    raise ConfigError(key, f"must be an epoch (integer >= 0) or a fraction in [0, 1] of the "
                           f"total epochs, got {value!r}")


def require_settings(value, cls: type, who: str, how: str):
    """`value` when it is a `cls`; else TypeError naming `who` and how to build one, so that a
    component handed a raw config node fails at once rather than reading it a second way."""
    if isinstance(value, cls):
        return value
    what = "a config dict" if isinstance(value, Mapping) else type(value).__name__
    raise TypeError(f"{who} takes {cls.__name__} ({how}), not {what}")
