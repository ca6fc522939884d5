"""Each compressor's settings, read once from its config node, and the kind of level it takes.
(Which settings class belongs to which compressor name: comm/registry.py.)

The dataclasses are where the compressors' defaults live (the reducers are used without Hydra,
through build_reducer and AccordionHookState); conf/compressor/*.yaml repeats none of them and
gets them through config.register_defaults. The level option (`rank`, `ratio`) has no default
here: conf/ gives it (null under a schedule that sets every layer's level), and a caller of
build_reducer must.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from ..errors import ConfigError
from ..options import Options, Settings, is_int, is_real, option


def _level(kind: type):
    """The reader of a compressor's level option (`rank` or `ratio`). null: no level of its own,
    for a reducer whose every layer's level a schedule sets (the reducer then refuses to reduce
    before set_levels; config.check_level_owner requires a level under any other schedule)."""
    def read(options, name):
        value = options.get(name)
        return None if value is None else check_level(kind, value, options.key(name))
    return read


@dataclass(frozen=True)
class DenseSettings(Settings):
    """Plain all-reduce: no options, no levels."""

    SECTION = "compressor"
    LEVEL: ClassVar[tuple] = (None, None)


@dataclass(frozen=True)
class LowRankSettings(Settings):
    """What PowerSGD and ACP-SGD share: a rank per layer, error feedback, the seed of the random
    Q's they start from."""

    SECTION = "compressor"
    LEVEL: ClassVar[tuple] = ("rank", int)
    rank: int | None = option(
        _level(int),
        help="rank of every layer (PowerSGD's, ACP-SGD's), unless a schedule sets levels")
    error_feedback: bool = option(
        Options.flag, default=True,
        help="error feedback: M = grad + memory, memory = M - what was sent")
    seed: int = option(
        Options.integer, minimum=0, default=0,
        help="seeds the random Q's the factors start from (conf ties it to ${seed})")


@dataclass(frozen=True)
class PowerSGDSettings(LowRankSettings):
    warm_start: bool = option(
        Options.flag, default=True,
        help="start each step's power iteration from the previous step's averaged Q")


@dataclass(frozen=True)
class ACPPowerSGDSettings(LowRankSettings):
    """ACP-SGD (comm/acp.py): PowerSGD sending P and Q on alternate steps. Always warm-started
    (the factor kept from the last step is the whole method), so warm_start is no option."""


@dataclass(frozen=True)
class TopKSettings(Settings):
    SECTION = "compressor"
    LEVEL: ClassVar[tuple] = ("ratio", float)
    ratio: float | None = option(
        _level(float),
        help="Top-K: the fraction of each layer's entries kept, in (0, 1], unless a schedule sets "
             "levels")
    error_feedback: bool = option(
        Options.flag, default=True,
        help="error feedback: memory = M - what was sent")
    official_topk: bool = option(
        Options.flag, default=False,
        help="the released code's Top-K: sum the selections, no memory")


def level_of(settings: Settings):
    """The compressor's own level from its checked settings: a rank, a ratio, or None."""
    option = type(settings).LEVEL[0]
    return None if option is None else getattr(settings, option)


def check_level(kind: type, value, key: str) -> int | float:
    """A rank is an int >= 1; a Top-K ratio a number in (0, 1] (returned as float)."""
    if kind is int:
        if not is_int(value) or value < 1:
            raise ConfigError(key, f"the PowerSGD rank must be an integer >= 1, got {value!r}")
        return int(value)
    if not is_real(value) or not 0.0 < float(value) <= 1.0:
        raise ConfigError(key, f"the Top-K kept fraction must be in (0, 1], got {value!r}")
    return float(value)


def kept_entries(shape: tuple[int, int], ratio: float, official_topk: bool = False) -> int:
    """Entries each worker sends for an (n, m) layer at Top-K `ratio`: max(1, floor(ratio n m)),
    or floor(ratio n m) with `official_topk` (comm/topk.py; schedule=auto prices a Top-K
    candidate with it, accordion/candidates.py)."""
    n, m = shape
    k = int(ratio * n * m)
    return k if official_topk else max(1, k)


def topk_sends_dense(shape: tuple[int, int], ratio: float, official_topk: bool = False) -> bool:
    """Whether Top-K at `ratio` sends an (n, m) layer whole (all-reduced): a ratio of 1, or a k
    of every entry (comm/topk.py, and schedule=auto's pricing, accordion/candidates.py)."""
    return ratio >= 1.0 or kept_entries(shape, ratio, official_topk) >= shape[0] * shape[1]
