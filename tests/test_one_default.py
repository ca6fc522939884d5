"""Every option of every compressor and schedule has exactly one default.

The default lives in the settings dataclass (comm/config.py, accordion/schedules.py,
accordion/detector.py); conf/ reaches it through `_defaults/<group>/<name>` (config.py
register_defaults) and may set only options the dataclass leaves without a default (a level,
a batch bound) or tie one to another key (`${seed}`, `${scale.detector_interval}`). No other
code path (a reducer's or the detector's constructor, the DDP API) holds a default of its own.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from accordion_repro.accordion import SCHEDULES, CriticalRegimeDetector, DetectorSettings
from accordion_repro.comm import DenseReducer, PowerSGDReducer, TopKReducer
from accordion_repro.comm.config import SETTINGS as COMPRESSORS
from accordion_repro.ddp import Accordion
from accordion_repro.options import defaults_of
from conftest import compose_cfg

CONF = Path(__file__).resolve().parents[1] / "conf"
CASES = [("compressor", name, cls) for name, cls in COMPRESSORS.items()] + \
        [("schedule", name, cls.Settings) for name, cls in SCHEDULES.items()]


def _ties_to_another_key(value) -> bool:
    return isinstance(value, str) and value.startswith("${")


@pytest.mark.parametrize("group, name, settings", CASES, ids=[f"{g}={n}" for g, n, _ in CASES])
def test_conf_sets_no_option_the_dataclass_defaults(group, name, settings):
    raw = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"))
    assert raw.pop("name") == name
    defaulted = defaults_of(settings)
    repeated = [key for key, value in raw.items()
                if key in defaulted and not _ties_to_another_key(value)]
    assert not repeated, f"conf/{group}/{name}.yaml repeats the dataclass default of {repeated}"


@pytest.mark.parametrize("group, name, settings", CASES, ids=[f"{g}={n}" for g, n, _ in CASES])
def test_every_option_reaches_conf_with_the_dataclass_default(group, name, settings):
    cfg = compose_cfg([f"{group}={name}", "dataset=synthetic_cifar10"])
    node = OmegaConf.to_container(cfg[group])
    raw = OmegaConf.to_container(OmegaConf.load(CONF / group / f"{name}.yaml"))
    options = [f for f in inspect.signature(settings).parameters]
    assert list(node)[0] == "name" and sorted(node) == sorted(["name", *options])
    for option, default in defaults_of(settings).items():
        if option not in raw:
            assert node[option] == default, option
        # every defaulted option can be overridden on the command line as it stands
        overridden = compose_cfg([f"{group}={name}", "dataset=synthetic_cifar10",
                                  f"{group}.{option}={str(default).lower() if isinstance(default, bool) else default}"])
        assert overridden[group][option] == default


@pytest.mark.parametrize("code", [PowerSGDReducer, TopKReducer, DenseReducer,
                                  CriticalRegimeDetector, Accordion],
                         ids=lambda c: c.__name__)
def test_no_constructor_holds_an_option_default_of_its_own(code):
    options = set()
    for settings in [*COMPRESSORS.values(), DetectorSettings]:
        options |= set(inspect.signature(settings).parameters)
    own = [name for name, p in inspect.signature(code).parameters.items()
           if name in options and p.default is not inspect.Parameter.empty]
    assert not own, f"{code.__name__} has its own default for {own}"
