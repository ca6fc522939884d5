"""Compressor names, their options and level types, checked before any rank starts."""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Integral, Real

from ..errors import ConfigError

# Option keys each compressor accepts (the yaml in conf/compressor/ holds their defaults).
COMPRESSOR_OPTIONS: dict[str, frozenset[str]] = {
    "none": frozenset(),
    "powersgd": frozenset({"rank", "error_feedback", "warm_start", "seed"}),
    "topk": frozenset({"ratio", "error_feedback", "official_topk"}),
}

_LEVEL_KIND = {"none": None, "powersgd": int, "topk": float}


def _check_name(name) -> None:
    if name not in COMPRESSOR_OPTIONS:
        known = ", ".join(sorted(COMPRESSOR_OPTIONS))
        raise ConfigError("compressor.name", f"unknown compressor {name!r}; choose one of {known}")


def level_kind(name: str) -> type | None:
    """int for PowerSGD ranks, float for Top-K kept fractions, None for dense all-reduce."""
    _check_name(name)
    return _LEVEL_KIND[name]


def check_rank(rank, key: str = "compressor.rank") -> int:
    if isinstance(rank, bool) or not isinstance(rank, Integral) or rank < 1:
        raise ConfigError(key, f"the PowerSGD rank must be an integer >= 1, got {rank!r}")
    return int(rank)


def check_ratio(ratio, key: str = "compressor.ratio") -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, Real) or not 0.0 < float(ratio) <= 1.0:
        raise ConfigError(key, f"the Top-K kept fraction must be in (0, 1], got {ratio!r}")
    return float(ratio)


def _check_bool(options: Mapping, key: str) -> None:
    if key in options and not isinstance(options[key], bool):
        raise ConfigError(f"compressor.{key}", f"must be true or false, got {options[key]!r}")


def validate_compressor(name: str, options: Mapping) -> None:
    """Raise ConfigError naming the key for an unknown name, unknown option or bad value."""
    _check_name(name)
    unknown = sorted(set(options) - COMPRESSOR_OPTIONS[name])
    if unknown:
        allowed = ", ".join(sorted(COMPRESSOR_OPTIONS[name])) or "none"
        raise ConfigError(
            f"compressor.{unknown[0]}",
            f"compressor {name!r} has no option {unknown[0]!r} (allowed: {allowed})",
        )
    if name == "powersgd":
        check_rank(options.get("rank"))
        seed = options.get("seed", 0)
        if isinstance(seed, bool) or not isinstance(seed, Integral) or seed < 0:
            raise ConfigError("compressor.seed", f"must be an integer >= 0, got {seed!r}")
    if name == "topk":
        check_ratio(options.get("ratio"))
    for key in ("error_feedback", "warm_start", "official_topk"):
        _check_bool(options, key)
