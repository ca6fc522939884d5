"""Gradient reducers: dense all-reduce, PowerSGD and Top-K with per-layer levels.

`build_reducer(name, params, group=..., **options)` is what the engine calls, with the options
of conf/compressor/<name>.yaml. comm/ knows no training loop and no schedule: it takes levels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import torch

from .base import DenseReducer, Reducer
from .config import compressor_level, level_kind, level_option, validate_compressor
from .powersgd import PowerSGDReducer
from .stats import CommStats
from .topk import TopKReducer

_REDUCERS = {"none": DenseReducer, "powersgd": PowerSGDReducer, "topk": TopKReducer}


def build_reducer(name: str, params: Sequence[torch.Tensor], *, group=None, **options) -> Reducer:
    """The reducer `name` over `params` (tensors or parameters; only their shapes are used)."""
    settings = validate_compressor(name, options)
    return _REDUCERS[name](list(params), group=group, **asdict(settings))


# Last: ddp_hook imports build_reducer from this module.
from .ddp_hook import (AccordionHookState, EpochMismatchError, LevelMismatchError,  # noqa: E402
                       accordion_hook)

__all__ = [
    "AccordionHookState", "accordion_hook", "LevelMismatchError", "EpochMismatchError",
    "CommStats", "Reducer", "DenseReducer", "PowerSGDReducer", "TopKReducer",
    "build_reducer", "validate_compressor", "level_kind", "level_option", "compressor_level",
]
