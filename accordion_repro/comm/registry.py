"""The compressors by name: the one table the config layer, the builders, the cost model's
callers, the own-code API and the docs read.

Each entry is its reducer class, which carries every fact of its compressor: `name` (the
`compressor.name` that selects it), `SETTINGS` (its options, defaults and level option:
comm/config.py), `STEP_COLLECTIVES` and `WIRE_OP` (what a step puts on the wire, for
schedule=auto's pricing and the analysis' predicted times) and `floats_per_step` (its wire cost
at given levels). Adding a compressor is its module and one `register_compressor` line; with
`plugins=[its module]` it is `compressor=<name>` on the command line, a
conf/compressor/<name>.yaml optional (config.register_defaults). tests/test_compressor_contract.py
runs the contract on every registered compressor, and on the toy of tests/toy_compressor.py.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..costmodel import OPS
from ..errors import ConfigError
from ..options import Settings
from .acp import ACPPowerSGDReducer
from .base import DenseReducer, Reducer
from .powersgd import PowerSGDReducer
from .precision import PrecisionReducer
from .topk import TopKReducer

COMPRESSORS: dict[str, type[Reducer]] = {}


def register_compressor(reducer: type[Reducer]) -> type[Reducer]:
    """Add a compressor (a Reducer subclass carrying its facts) under `reducer.name`; returns it,
    so it also serves as a class decorator. A name is registered once."""
    if not (isinstance(reducer, type) and issubclass(reducer, Reducer)):
        raise TypeError(f"a compressor is a Reducer subclass, got {reducer!r}")
    name = reducer.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"{reducer.__name__}.name must be an identifier, got {name!r}")
    if COMPRESSORS.get(name, reducer) is not reducer:
        raise ValueError(f"compressor {name!r} is registered already ({COMPRESSORS[name].__name__})")
    if not (isinstance(reducer.SETTINGS, type) and issubclass(reducer.SETTINGS, Settings)):
        raise TypeError(f"{reducer.__name__}.SETTINGS must be a Settings class")
    if reducer.WIRE_OP not in OPS or len(reducer.STEP_COLLECTIVES) != 2:
        raise ValueError(f"{reducer.__name__}: WIRE_OP must be one of {OPS} and STEP_COLLECTIVES "
                         f"a (collectives, of them all-gathers) pair")
    COMPRESSORS[name] = reducer
    return reducer


for _reducer in (DenseReducer, PowerSGDReducer, ACPPowerSGDReducer, TopKReducer, PrecisionReducer):
    register_compressor(_reducer)


def compressor(name: str) -> type[Reducer]:
    """The registered compressor `name`; ConfigError naming compressor.name otherwise."""
    if name not in COMPRESSORS:
        known = ", ".join(sorted(COMPRESSORS))
        raise ConfigError("compressor.name", f"unknown compressor {name!r}; choose one of {known}")
    return COMPRESSORS[name]


def compressor_settings() -> dict[str, type[Settings]]:
    """Each compressor's settings class by name."""
    return {name: reducer.SETTINGS for name, reducer in COMPRESSORS.items()}


def validate_compressor(name: str, options: Mapping):
    """The compressor's settings; ConfigError naming the key for an unknown name, option or value."""
    return compressor(name).SETTINGS.from_config(options, owner=f"compressor {name!r}")


def name_of(settings: Settings) -> str:
    """The compressor a settings object belongs to ('powersgd' for PowerSGDSettings)."""
    for name, reducer in COMPRESSORS.items():
        if type(settings) is reducer.SETTINGS:
            return name
    raise TypeError(f"{type(settings).__name__} is not a compressor's settings "
                    f"(those of {', '.join(sorted(COMPRESSORS))})")


def level_kind(name: str) -> type | None:
    """int for (ACP-)PowerSGD ranks, float for Top-K kept fractions, None for dense all-reduce."""
    return compressor(name).SETTINGS.LEVEL[1]


def level_option(name: str) -> str | None:
    """The option that holds the compressor's own level: `rank`, `ratio`, or None."""
    return compressor(name).SETTINGS.LEVEL[0]
