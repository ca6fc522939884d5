"""Build a model by config name, checking the options before anything is allocated.

Bad names, options or values raise ConfigError naming the `model.*` key so the user can fix
the command line; defaults for the options live in conf/model/<name>.yaml.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from ..errors import ConfigError
from ..options import Options
from .cifar.densenet import DenseNet
from .cifar.googlenet import GoogLeNet
from .cifar.resnet import ResNet18
from .cifar.senet import SE_REDUCTION, SENet18
from .cifar.vgg import VGG19BN
from .lstm import LSTMLanguageModel


_width = Options.number


@dataclass(frozen=True)
class ModelSpec:
    constructor: Callable[..., nn.Module]
    input: str                                   # "num_classes" (image) or "vocab_size" (text)
    options: dict[str, Callable]                 # option name -> reader(Options, option) -> value


MODEL_SPECS: dict[str, ModelSpec] = {
    "resnet18": ModelSpec(ResNet18, "num_classes", {"width": _width}),
    "vgg19bn": ModelSpec(VGG19BN, "num_classes", {"width": _width}),
    "senet18": ModelSpec(SENet18, "num_classes", {
        "stage4_channels": lambda options, option: options.integer(option, minimum=SE_REDUCTION),
        "width": _width}),
    "densenet": ModelSpec(DenseNet, "num_classes", {"width": _width}),
    "googlenet": ModelSpec(GoogLeNet, "num_classes", {"width": _width}),
    "lstm": ModelSpec(LSTMLanguageModel, "vocab_size", {
        "num_layers": Options.integer,
        "hidden_size": Options.integer,
        "embedding_size": Options.integer,
        "tied": Options.flag,
        "dropout": lambda options, option: options.number(option, closed="low", high=1.0),
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
    reader = Options("model", options)
    reader.reject_unknown(spec.options, f"model {name!r}")
    checked = {option: spec.options[option](reader, option) for option in options}
    size = num_classes if spec.input == "num_classes" else vocab_size
    if size is None:
        kind = "an image dataset (num_classes)" if spec.input == "num_classes" else \
            "a text dataset (vocab_size)"
        raise ConfigError("model.name", f"model {name!r} needs {kind}, none was given; "
                                        "pair it with a matching dataset")
    size = Options("dataset", {spec.input: size}).integer(spec.input)
    return spec.constructor(size, **checked)


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once), the figure the paper's tables quote."""
    return sum(p.numel() for p in model.parameters())
