"""Gradient reducers: dense all-reduce, PowerSGD, ACP-SGD, Top-K and transport precision (fp32,
bf16, fp8) with per-layer levels.

`build_reducer(settings, params, group=...)` is what the engine calls, with the compressor's
checked settings (RunSettings.compressor, comm/config.py); own code may pass a name and keywords.
The compressors by name, and how to add one: comm/registry.py. comm/ knows no training loop and no schedule: it takes levels.
"""

from __future__ import annotations

from .acp import ACPPowerSGDReducer
from .base import DenseReducer, Reducer
from .build import build_reducer
from .config import level_of
from .ddp_hook import AccordionHookState, EpochMismatchError, LevelMismatchError, accordion_hook
from .powersgd import PowerSGDReducer
from .precision import PrecisionReducer
from .registry import (COMPRESSORS, level_kind, level_option, register_compressor,
                       validate_compressor)
from .stats import CommStats
from .topk import TopKReducer

__all__ = [
    "AccordionHookState", "accordion_hook", "LevelMismatchError", "EpochMismatchError",
    "CommStats", "Reducer", "DenseReducer", "PowerSGDReducer", "ACPPowerSGDReducer", "TopKReducer",
    "PrecisionReducer",
    "build_reducer", "validate_compressor", "level_kind", "level_option", "level_of",
    "COMPRESSORS", "register_compressor",
]
