"""Build a model by config name, checking the options before anything is allocated.

Bad names, options or values raise ConfigError naming the `model.*` key so the user can fix
the command line; each option and its default is declared once, in models/settings.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Callable

from torch import nn

from ..errors import ConfigError
from ..options import Options, Settings
from ..options import require_settings
from .cifar.densenet import DenseNet
from .cifar.googlenet import GoogLeNet
from .cifar.resnet import ResNet18
from .cifar.senet import SENet18
from .cifar.vgg import VGG19BN
from .lstm import LSTMLanguageModel
from .settings import LSTMSettings, SENetSettings, WidthSettings

# name -> (constructor, the size its first argument takes from the dataset, its options)
MODELS: dict[str, tuple[Callable[..., nn.Module], str, type]] = {
    "resnet18": (ResNet18, "num_classes", WidthSettings),
    "vgg19bn": (VGG19BN, "num_classes", WidthSettings),
    "senet18": (SENet18, "num_classes", SENetSettings),
    "densenet": (DenseNet, "num_classes", WidthSettings),
    "googlenet": (GoogLeNet, "num_classes", WidthSettings),
    "lstm": (LSTMLanguageModel, "vocab_size", LSTMSettings),
}
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)
SETTINGS = {name: options for name, (_, _, options) in MODELS.items()}


def _entry(name: str) -> tuple[Callable[..., nn.Module], str, type]:
    if name not in MODELS:
        raise ConfigError("model.name",
                          f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
    return MODELS[name]


def model_settings(name: str, options: Mapping):
    """Model `name`'s checked options (the one place they are read); ConfigError naming the key."""
    return _entry(name)[2].from_config(options, owner=f"model {name!r}")


def build_model(name: str, *, num_classes: int | None = None, vocab_size: int | None = None,
                settings: Settings | None = None, **options) -> nn.Module:
    """Image models need `num_classes`, the LSTM needs `vocab_size`; the other one is ignored
    so the engine can pass both from its DataBundle. The options are keywords (own code) or
    `settings`, already checked (the trainer's RunSettings.model), not both."""
    if settings is None:
        settings = model_settings(name, options)
    else:
        require_settings(settings, _entry(name)[2], f"build_model({name!r})",
                         "RunSettings.model, or the options as keywords")
        if options:
            raise TypeError(f"build_model({name!r}) takes settings= or keywords, not both")
    constructor, size_of, _ = MODELS[name]
    size = num_classes if size_of == "num_classes" else vocab_size
    if size is None:
        kind = "an image dataset (num_classes)" if size_of == "num_classes" else \
            "a text dataset (vocab_size)"
        raise ConfigError("model.name", f"model {name!r} needs {kind}, none was given; "
                                        "pair it with a matching dataset")
    size = Options("dataset", {size_of: size}).integer(size_of)
    return constructor(size, **asdict(settings))


def count_parameters(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix counts once), the figure the paper's tables quote."""
    return sum(p.numel() for p in model.parameters())
