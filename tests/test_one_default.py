"""Every option of every compressor, schedule, model and dataset has exactly one default.

The default lives in the settings dataclass (comm/config.py, accordion/schedules.py,
accordion/detector.py, models/settings.py, data/settings.py); conf/ reaches it through
`_defaults/<group>/<name>` (config.py register_defaults) and may set only options the dataclass
leaves without a default (a level, a batch bound, a file) or tie one to another key (`${seed}`,
`${scale.detector_interval}`, `${paths.data_dir}`). No other code path (a reducer's, the
detector's or a model's constructor, a data generator, the DDP API) holds a default of its own.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from accordion_repro.accordion import SCHEDULES, CriticalRegimeDetector, DetectorSettings
from accordion_repro.comm import DenseReducer, PowerSGDReducer, TopKReducer
from accordion_repro.comm.registry import compressor_settings
from accordion_repro.data.registry import SETTINGS as DATASETS
from accordion_repro.data.synthetic import markov_tokens, synthetic_images
from accordion_repro.ddp import Accordion
from accordion_repro.models.cifar.densenet import DenseNet
from accordion_repro.models.cifar.googlenet import GoogLeNet
from accordion_repro.models.cifar.resnet import ResNet18
from accordion_repro.models.cifar.senet import SENet18
from accordion_repro.models.cifar.vgg import VGG19BN
from accordion_repro.models.lstm import LSTMLanguageModel
from accordion_repro.models.factory import SETTINGS as MODELS
from accordion_repro.options import defaults_of
from conftest import compose_cfg

CONF = Path(__file__).resolve().parents[1] / "conf"
CASES = [("compressor", name, cls) for name, cls in compressor_settings().items()] + \
        [("schedule", name, cls.Settings) for name, cls in SCHEDULES.items()] + \
        [("model", name, cls) for name, cls in MODELS.items()] + \
        [("dataset", name, cls) for name, cls in DATASETS.items()]


def _raw(group: str, name: str) -> dict:
    """conf/<group>/<name>.yaml as written, without its defaults list."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"))
    raw.pop("defaults", None)
    return raw


def _override(value) -> str:
    """A default as the command line spells it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value)


def _ties_to_another_key(value) -> bool:
    return isinstance(value, str) and value.startswith("${")


@pytest.mark.parametrize("group, name, settings", CASES, ids=[f"{g}={n}" for g, n, _ in CASES])
def test_conf_sets_no_option_the_dataclass_defaults(group, name, settings):
    raw = _raw(group, name)
    assert raw.pop("name") == name
    defaulted = defaults_of(settings)
    repeated = [key for key, value in raw.items()
                if key in defaulted and not _ties_to_another_key(value)]
    assert not repeated, f"conf/{group}/{name}.yaml repeats the dataclass default of {repeated}"


@pytest.mark.slow
@pytest.mark.parametrize("group, name, settings", CASES, ids=[f"{g}={n}" for g, n, _ in CASES])
def test_every_option_reaches_conf_with_the_dataclass_default(group, name, settings):
    chosen = [f"{group}={name}"] + (["dataset=synthetic_cifar10"] if group != "dataset" else [])
    node = OmegaConf.to_container(compose_cfg(chosen)[group])
    raw = _raw(group, name)
    options = [f for f in inspect.signature(settings).parameters if f != "name"]
    assert list(node)[0] == "name" and sorted(node) == sorted(["name", *options])
    defaults = {option: list(default) if isinstance(default, tuple) else default
                for option, default in defaults_of(settings).items()}
    for option, expected in defaults.items():
        if option not in raw:
            assert node[option] == expected, option
    # every defaulted option can be overridden on the command line as it stands (all in one
    # composition: one compose per option cost ~0.15 s each)
    overridden = OmegaConf.to_container(compose_cfg(
        [*chosen, *(f"{group}.{option}={_override(default)}"
                    for option, default in defaults_of(settings).items())])[group])
    assert {option: overridden[option] for option in defaults} == defaults


@pytest.mark.parametrize("code", [PowerSGDReducer, TopKReducer, DenseReducer,
                                  CriticalRegimeDetector, Accordion, ResNet18, VGG19BN, SENet18,
                                  DenseNet, GoogLeNet, LSTMLanguageModel, synthetic_images,
                                  markov_tokens],
                         ids=lambda c: c.__name__)
def test_no_constructor_holds_an_option_default_of_its_own(code):
    options = set()
    for settings in [*compressor_settings().values(), DetectorSettings, *MODELS.values(), *DATASETS.values()]:
        options |= set(inspect.signature(settings).parameters)
    own = [name for name, p in inspect.signature(code).parameters.items()
           if name in options and p.default is not inspect.Parameter.empty]
    assert not own, f"{code.__name__} has its own default for {own}"
