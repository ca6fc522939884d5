"""The trainer's, optimiser's and launcher's settings objects refuse a bad value by its key."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from accordion_repro.engine.settings import DistSettings, OptimSettings, TrainerSettings
from accordion_repro.errors import ConfigError
from conftest import CONF_DIR

SETTINGS = {"trainer": (TrainerSettings, "trainer/default"), "optim": (OptimSettings, "optim/sgd"),
            "dist": (DistSettings, "dist/default")}


def node(section: str, **overrides) -> dict:
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{SETTINGS[section][1]}.yaml"))
    return {**values, **overrides}


@pytest.mark.parametrize("section", sorted(SETTINGS))
def test_every_conf_file_is_read_whole(section):
    keys = set()
    for path in sorted((CONF_DIR / section).glob("*.yaml")):
        values = OmegaConf.to_container(OmegaConf.load(path))
        SETTINGS[section][0].from_config(values)
        keys |= set(values)
    assert keys == set(vars(SETTINGS[section][0].from_config(node(section))))


BAD = [
    ("trainer", "batch_size", 0, "must be an integer >= 1, got 0"),
    ("trainer", "max_micro_batch", 0, "must be an integer >= 1, got 0"),
    ("trainer", "stop_after_epoch", -1, "must be an integer >= 0, got -1"),
    ("trainer", "num_workers", "many", "must be an integer >= 0, got 'many'"),
    ("trainer", "resume", "maybe", "must be one of auto, never; got 'maybe'"),
    ("trainer", "allow_config_change", "yes", "must be true or false, got 'yes'"),
    ("optim", "name", "adam", "must be one of sgd, lstm_momentum; got 'adam'"),
    ("optim", "lr", 0, "must be a number > 0, got 0"),
    ("optim", "momentum", 1.0, "must be a number in [0, 1), got 1.0"),
    ("optim", "decay_factor", 0, "must be a number in (0, 1], got 0"),
    ("optim", "clip_grad_norm", -1.0, "must be a number > 0, got -1.0"),
    ("optim", "clip_point", "before", "must be one of local, averaged; got 'before'"),
    ("dist", "nproc_per_node", 0, "must be an integer >= 1, got 0"),
    ("dist", "backend", "mpi", "must be one of auto, gloo, nccl; got 'mpi'"),
    ("dist", "launcher", "ssh", "must be one of auto, spawn, env; got 'ssh'"),
]


@pytest.mark.parametrize("section, option, value, message",
                         [pytest.param(*case, id=f"{case[0]}.{case[1]}") for case in BAD])
def test_a_bad_value_is_refused_with_its_key(section, option, value, message):
    with pytest.raises(ConfigError) as caught:
        SETTINGS[section][0].from_config(node(section, **{option: value}))
    assert caught.value.key == f"{section}.{option}"
    assert str(caught.value) == f"{section}.{option}: {message}"


def test_a_missing_option_is_required():
    values = node("trainer")
    del values["epochs"]
    with pytest.raises(ConfigError, match="trainer.epochs: is required"):
        TrainerSettings.from_config(values)
