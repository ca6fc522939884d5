"""The one table of reducers by compressor name, and the builder the engine and the hook use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import torch

from .acp import ACPPowerSGDReducer
from .base import DenseReducer, Reducer
from ..options import Settings
from ..options import require_settings
from .config import name_of, validate_compressor
from .powersgd import PowerSGDReducer
from .precision import PrecisionReducer
from .topk import TopKReducer

_REDUCERS = {"none": DenseReducer, "powersgd": PowerSGDReducer,
             "acp_powersgd": ACPPowerSGDReducer, "topk": TopKReducer,
             "precision": PrecisionReducer}


def build_reducer(compressor, params: Sequence[torch.Tensor], *, group=None, **options) -> Reducer:
    """The reducer over `params` (tensors or parameters; only their shapes are used).

    `compressor` is a name with its options as keywords (own code: `build_reducer("powersgd",
    params, rank=4)`), or a compressor settings object already checked (the trainer's
    RunSettings.compressor), which is not read again. A config node is refused (TypeError).
    """
    if isinstance(compressor, str):
        settings = validate_compressor(compressor, options)
    else:
        settings = require_settings(compressor, Settings, "build_reducer",
                                    "RunSettings.compressor, or a compressor name and keywords")
        if options:
            raise TypeError("build_reducer takes a settings object or keywords, not both")
    return _REDUCERS[name_of(settings)](list(params), group=group, **asdict(settings))
