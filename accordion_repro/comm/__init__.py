"""Gradient reducers: dense all-reduce, PowerSGD, ACP-SGD, Top-K and transport precision (fp32,
bf16, fp8) with per-layer levels.

`build_reducer(settings, params, group=...)` is what the engine calls, with the compressor's
checked settings (RunSettings.compressor, comm/config.py); own code may pass a name and keywords. comm/ knows no training loop and no schedule: it takes levels.
"""

from __future__ import annotations

from .acp import ACPPowerSGDReducer
from .base import DenseReducer, Reducer
from .build import build_reducer
from .config import level_kind, level_of, level_option, validate_compressor
from .ddp_hook import AccordionHookState, EpochMismatchError, LevelMismatchError, accordion_hook
from .powersgd import PowerSGDReducer
from .precision import PrecisionReducer
from .stats import CommStats
from .topk import TopKReducer

__all__ = [
    "AccordionHookState", "accordion_hook", "LevelMismatchError", "EpochMismatchError",
    "CommStats", "Reducer", "DenseReducer", "PowerSGDReducer", "ACPPowerSGDReducer", "TopKReducer",
    "PrecisionReducer",
    "build_reducer", "validate_compressor", "level_kind", "level_option", "level_of",
]
