"""The builder of a reducer, which the engine and the hook use (the compressors by name:
comm/registry.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

import torch

from ..options import Settings, require_settings
from .base import Reducer
from .registry import COMPRESSORS, name_of, validate_compressor


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
    return COMPRESSORS[name_of(settings)](list(params), group=group, **asdict(settings))
