"""Reading schedule options with errors that name the `schedule.<key>` at fault.

Every check runs before any rank starts (train.py calls validate_schedule), so a typo on the
command line costs a second, not a queued job.
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral, Real

from ..errors import ConfigError


def key_of(option: str) -> str:
    return f"schedule.{option}"


def reject_unknown(name: str, options: Mapping, allowed) -> None:
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        known = ", ".join(sorted(allowed)) or "none"
        raise ConfigError(key_of(unknown[0]),
                          f"schedule {name!r} has no option {unknown[0]!r} (it takes: {known})")


def required(options: Mapping, option: str):
    if option not in options or options[option] is None:
        raise ConfigError(key_of(option), "is required")
    return options[option]


def is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def as_bool(options: Mapping, option: str) -> bool:
    value = required(options, option)
    if not isinstance(value, bool):
        raise ConfigError(key_of(option), f"must be true or false, got {value!r}")
    return value


def as_int(options: Mapping, option: str, *, minimum: int) -> int:
    value = required(options, option)
    if not is_int(value) or value < minimum:
        raise ConfigError(key_of(option), f"must be an integer >= {minimum}, got {value!r}")
    return int(value)


def as_positive_real(options: Mapping, option: str) -> float:
    value = required(options, option)
    if not is_real(value) or not float(value) > 0.0:
        raise ConfigError(key_of(option), f"must be a number > 0, got {value!r}")
    return float(value)


def as_choice(options: Mapping, option: str, choices) -> str:
    value = required(options, option)
    if value not in choices:
        raise ConfigError(key_of(option), f"must be one of {', '.join(choices)}; got {value!r}")
    return value


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
