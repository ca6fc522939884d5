"""Build a model by config name, checking the options before anything is allocated.

Bad names, options or values raise ConfigError naming the `model.*` key so the user can fix
the command line; defaults for the options live in conf/model/<name>.yaml.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Callable

from torch import nn

from ..errors import ConfigError
from .cifar.densenet import DenseNet
from .cifar.googlenet import GoogLeNet
from .cifar.resnet import ResNet18
from .cifar.senet import SE_REDUCTION, SENet18
from .cifar.vgg import VGG19BN
from .lstm import LSTMLanguageModel


def _positive_number(key, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
        raise ConfigError(key, f"must be a positive number, got {value!r}")
    return float(value)


def _positive_int(key, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ConfigError(key, f"must be a positive integer, got {value!r}")
    return int(value)


def _boolean(key, value):
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {value!r}")
    return value


def _probability(key, value):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < 1:
        raise ConfigError(key, f"must be a dropout probability in [0, 1), got {value!r}")
    return float(value)


def _se_width(key, value):
    value = _positive_int(key, value)
    if value < SE_REDUCTION:
        raise ConfigError(key, f"must be at least {SE_REDUCTION} (the SE reduction), got {value}")
    return value


@dataclass(frozen=True)
class ModelSpec:
    constructor: Callable[..., nn.Module]
    input: str                                   # "num_classes" (image) or "vocab_size" (text)
    options: dict[str, Callable]                 # option name -> validator(key, value) -> value


MODEL_SPECS: dict[str, ModelSpec] = {
    "resnet18": ModelSpec(ResNet18, "num_classes", {"width": _positive_number}),
    "vgg19bn": ModelSpec(VGG19BN, "num_classes", {"width": _positive_number}),
    "senet18": ModelSpec(SENet18, "num_classes", {"stage4_channels": _se_width,
                                                  "width": _positive_number}),
    "densenet": ModelSpec(DenseNet, "num_classes", {"width": _positive_number}),
    "googlenet": ModelSpec(GoogLeNet, "num_classes", {"width": _positive_number}),
    "lstm": ModelSpec(LSTMLanguageModel, "vocab_size", {
        "num_layers": _positive_int,
        "hidden_size": _positive_int,
        "embedding_size": _positive_int,
        "tied": _boolean,
        "dropout": _probability,
    }),
}

MODEL_NAMES: tuple[str, ...] = tuple(MODEL_SPECS)


def build_model(name: str, *, num_classes: int | None = None, vocab_size: int | None = None,
                **options) -> nn.Module:
    """Image models need `num_classes`, the LSTM needs `vocab_size`; the other one is ignored
    so the engine can pass both from its DataBundle."""
    spec = MODEL_SPECS.get(name)
    if spec is None:
        raise ConfigError("model.name",
                          f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    checked = {}
    for option, value in options.items():
        validate = spec.options.get(option)
        if validate is None:
            allowed = ", ".join(spec.options) or "none"
            raise ConfigError(f"model.{option}",
                              f"unknown option for model {name!r} (its options: {allowed})")
        checked[option] = validate(f"model.{option}", value)
    size = num_classes if spec.input == "num_classes" else vocab_size
    if size is None:
        kind = "an image dataset (num_classes)" if spec.input == "num_classes" else \
            "a text dataset (vocab_size)"
        raise ConfigError("model.name", f"model {name!r} needs {kind}, none was given; "
                                        "pair it with a matching dataset")
    size = _positive_int("dataset." + spec.input, size)
    return spec.constructor(size, **checked)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once), the figure the paper's tables quote."""
    return sum(p.numel() for p in model.parameters())
