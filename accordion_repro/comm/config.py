"""Each compressor's settings, read once from its config node, and the kind of level it takes.

The dataclasses are where the compressors' defaults live (the reducers are used without Hydra,
through build_reducer and AccordionHookState); conf/compressor/*.yaml repeats none of them and
gets them through config.register_defaults. The level option (`rank`, `ratio`) has no default
here: conf/ gives it, and a caller of build_reducer must.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import ClassVar

from ..errors import ConfigError
from ..options import Options, is_int, is_real


@dataclass(frozen=True)
class DenseSettings:
    """Plain all-reduce: no options, no levels."""

    LEVEL: ClassVar[tuple] = (None, None)

    @classmethod
    def read(cls, options: Options) -> DenseSettings:
        return cls()


@dataclass(frozen=True)
class PowerSGDSettings:
    rank: int                    # per-layer rank unless a schedule sets levels
    error_feedback: bool = True  # compress M = grad + memory, memory = M - output
    warm_start: bool = True      # reuse the averaged Q of the previous step
    seed: int = 0                # seeds the random Q's (conf ties it to the run's seed)

    LEVEL: ClassVar[tuple] = ("rank", int)

    @classmethod
    def read(cls, options: Options) -> PowerSGDSettings:
        return cls(rank=check_level(int, options.get("rank"), options.key("rank")),
                   error_feedback=options.flag("error_feedback"),
                   warm_start=options.flag("warm_start"),
                   seed=options.integer("seed", minimum=0))


@dataclass(frozen=True)
class TopKSettings:
    ratio: float                 # kept fraction of each layer, in (0, 1]
    error_feedback: bool = True  # memory = M - what this worker sent
    official_topk: bool = False  # the released code: sum without dividing, no memory

    LEVEL: ClassVar[tuple] = ("ratio", float)

    @classmethod
    def read(cls, options: Options) -> TopKSettings:
        return cls(ratio=check_level(float, options.get("ratio"), options.key("ratio")),
                   error_feedback=options.flag("error_feedback"),
                   official_topk=options.flag("official_topk"))


SETTINGS: dict[str, type] = {"none": DenseSettings, "powersgd": PowerSGDSettings,
                             "topk": TopKSettings}


def _settings_class(name) -> type:
    if name not in SETTINGS:
        known = ", ".join(sorted(SETTINGS))
        raise ConfigError("compressor.name", f"unknown compressor {name!r}; choose one of {known}")
    return SETTINGS[name]


def validate_compressor(name: str, options: Mapping):
    """The compressor's settings; ConfigError naming the key for an unknown name, option or value."""
    cls = _settings_class(name)
    reader = Options("compressor", options, cls)
    reader.reject_unknown([f.name for f in fields(cls)], f"compressor {name!r}")
    return cls.read(reader)


def level_kind(name: str) -> type | None:
    """int for PowerSGD ranks, float for Top-K kept fractions, None for dense all-reduce."""
    return _settings_class(name).LEVEL[1]


def level_option(name: str) -> str | None:
    """The option that holds the compressor's own level: `rank`, `ratio`, or None."""
    return _settings_class(name).LEVEL[0]


def compressor_level(name: str, options: Mapping):
    """The compressor's own level: a PowerSGD rank, a Top-K ratio, or None for dense."""
    option = level_option(name)
    return None if option is None else options.get(option)


def check_level(kind: type, value, key: str) -> int | float:
    """A rank is an int >= 1; a Top-K ratio a number in (0, 1] (returned as float)."""
    if kind is int:
        if not is_int(value) or value < 1:
            raise ConfigError(key, f"the PowerSGD rank must be an integer >= 1, got {value!r}")
        return int(value)
    if not is_real(value) or not 0.0 < float(value) <= 1.0:
        raise ConfigError(key, f"the Top-K kept fraction must be in (0, 1], got {value!r}")
    return float(value)
