"""Rates and durations as people type them on a command line: 100mbit, 1gbit, 0.5ms."""

from __future__ import annotations

import re

from accordion_repro.errors import ConfigError

_RATE_UNITS = {"": 1.0, "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def _parse(text: str, units: dict[str, float], *, key: str, example: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in units:
        raise ConfigError(key, f"cannot read {text!r}; write e.g. {example}")
    return float(match.group(1)) * units[match.group(2)]


def parse_bandwidth(text: str, *, key: str = "bandwidth") -> float:
    """Bits per second from '100mbit', '1gbit', '2.5e9'."""
    return _parse(text, _RATE_UNITS, key=key, example="100mbit, 1gbit or 2.5e9 (bit/s)")


def parse_duration(text: str, *, key: str = "latency") -> float:
    """Seconds from '0.5ms', '200us', '0'."""
    return _parse(text, _TIME_UNITS, key=key, example="0.5ms, 200us or 0")
