"""The one table of reducers by compressor name, and the builder the engine and the hook use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import torch

from .acp import ACPPowerSGDReducer
from .base import DenseReducer, Reducer
from .config import validate_compressor
from .powersgd import PowerSGDReducer
from .topk import TopKReducer

_REDUCERS = {"none": DenseReducer, "powersgd": PowerSGDReducer,
             "acp_powersgd": ACPPowerSGDReducer, "topk": TopKReducer}


def build_reducer(name: str, params: Sequence[torch.Tensor], *, group=None, **options) -> Reducer:
    """The reducer `name` over `params` (tensors or parameters; only their shapes are used)."""
    settings = validate_compressor(name, options)
    return _REDUCERS[name](list(params), group=group, **asdict(settings))
