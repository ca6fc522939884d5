"""Parse once: config.validate returns one RunSettings; the ranks and every component take its
parts, never the config dict, and nothing reads an option again after validate."""

from __future__ import annotations

import pickle

import pytest
import torch

from accordion_repro.config import validate
from accordion_repro.engine.settings import DistSettings, OptimSettings, TrainerSettings
from accordion_repro.options import Settings
from accordion_repro.run_settings import RunSettings
from conftest import compose_cfg

SMALL = ["model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10",
         "dataset.train_size=64", "dataset.test_size=32", "compressor=powersgd",
         "schedule=accordion", "schedule.low=2", "schedule.high=1",
         "trainer.epochs=1", "trainer.batch_size=8", "trainer.max_steps_per_epoch=3",
         "trainer.max_eval_steps=1", "trainer.checkpoint=false", "trainer.progress=never",
         "logger.wandb.mode=disabled"]


@pytest.fixture(scope="module")
def run() -> RunSettings:
    return validate(compose_cfg(SMALL))


def test_validate_returns_one_typed_frozen_tree(run):
    assert isinstance(run.trainer, TrainerSettings) and isinstance(run.optim, OptimSettings)
    assert isinstance(run.dist, DistSettings)
    assert run.model_name == "resnet18" and run.model.width == 0.125
    assert run.dataset.name == "synthetic_cifar10"
    assert (run.compressor_name, run.compressor.rank) == ("powersgd", None)  # the schedule's
    assert (run.schedule_name, run.schedule.low, run.schedule.high) == ("accordion", 2, 1)
    assert run.schedule.eta == 0.5 and run.seed == 42 and run.scale == "paper"
    assert run.resolved["compressor"]["rank"] is None  # the record, written as it is
    with pytest.raises(AttributeError):  # frozen, all the way down
        run.trainer.epochs = 2  # type: ignore[misc]
    with pytest.raises(AttributeError):
        run.seed = 1  # type: ignore[misc]


def test_run_settings_pickle_for_the_ranks(run):
    """mp.spawn and Hydra's submitit launcher pickle what the ranks get."""
    copy = pickle.loads(pickle.dumps(run))
    assert copy == run and copy.resolved == run.resolved
    assert type(copy.schedule) is type(run.schedule)


@pytest.mark.parametrize("component", ["Trainer", "launch", "build_reducer", "build_model",
                                       "build_schedule", "build_epoch_lr", "detector"])
def test_a_component_handed_a_raw_config_dict_refuses_it(run, tmp_path, component):
    from accordion_repro.accordion import CriticalRegimeDetector, build_schedule
    from accordion_repro.comm import build_reducer
    from accordion_repro.engine.lr import build_epoch_lr
    from accordion_repro.engine.trainer import Trainer
    from accordion_repro.launch import launch
    from accordion_repro.models import build_model

    node = run.resolved
    calls = {
        "Trainer": lambda: Trainer(node, tmp_path),
        "launch": lambda: launch(node, tmp_path),
        "build_reducer": lambda: build_reducer(node["compressor"], [torch.zeros(4, 4)]),
        "build_model": lambda: build_model("resnet18", num_classes=10, settings=node["model"]),
        "build_schedule": lambda: build_schedule(
            "accordion", num_layers=1, compressor="powersgd", default_level=2,
            base_global_batch=8, world_size=1, settings=node["schedule"]),
        "build_epoch_lr": lambda: build_epoch_lr(node["optim"], total_epochs=1, world_size=1,
                                                 batch_size=8),
        "detector": lambda: CriticalRegimeDetector(2, settings=node["schedule"]),
    }
    with pytest.raises(TypeError, match=r"takes \w+ \(.+\), not a config dict"):
        calls[component]()


def test_the_trainer_reads_no_option_again(tmp_path, monkeypatch):
    """Building the trainer and training steps parse nothing: no Settings.from_config, no
    schedule parse, and a compressor level is checked once per change, not per layer and step."""
    from accordion_repro.accordion import registry
    from accordion_repro.comm import base
    from accordion_repro.engine.trainer import Trainer

    lstm = validate(compose_cfg(
        ["model=lstm", "model.num_layers=1", "model.hidden_size=8", "model.embedding_size=8",
         "dataset=synthetic_text", "dataset.vocab_size=50", "dataset.train_tokens=2000",
         "dataset.eval_tokens=200", "optim=lstm",
         *[o for o in SMALL if o.split(".")[0].split("=")[0] not in ("model", "dataset")]]))

    def parsed(*args, **kwargs):
        raise AssertionError("an option was read again after config.validate")

    monkeypatch.setattr(Settings, "from_config", classmethod(parsed))
    monkeypatch.setattr(registry, "_parse", parsed)
    checks = []
    original = base.check_level
    monkeypatch.setattr(base, "check_level", lambda *a: checks.append(a) or original(*a))
    trainer = Trainer(lstm, tmp_path)
    trainer._train_epoch(0)
    layers = len(trainer.compressible)
    assert trainer.reducer.levels == [2] * layers
    # the epoch's levels once (not per layer and step); under schedule=accordion the reducer
    # has no level of its own to check
    assert len(checks) == layers


def test_a_config_change_reaches_the_trainer_in_the_settings(run):
    import dataclasses

    changed = dataclasses.replace(run, config_change={"optim.lr": [0.1, 0.2]})
    assert changed.config_change == {"optim.lr": [0.1, 0.2]} and changed.trainer is run.trainer


# ---- help text on every option, listed in docs/options.md ----------------------------------
def test_docs_options_page_is_generated_from_the_help_of_every_option():
    """docs/options.md is `python -m accordion_repro.settings`'s output, as committed."""
    import dataclasses

    from accordion_repro.settings import options_page, settings_classes
    from conftest import REPO

    page = options_page()
    assert (REPO / "docs" / "options.md").read_text() == page, (
        "docs/options.md is stale: python -m accordion_repro.settings > docs/options.md")
    for section, choice, cls in settings_classes():
        for f in dataclasses.fields(cls):
            assert f.metadata["help"].strip() and f.metadata["help"] in page.replace("\\|", "|")
    assert "| `eta` | `0.5` | changeable | a layer is critical when" in page


def test_an_option_without_help_is_refused_where_it_is_declared():
    from accordion_repro.options import Options, option

    with pytest.raises(TypeError, match="help"):
        option(Options.integer)
    with pytest.raises(ValueError, match="give help="):
        option(Options.integer, help=" ")
    with pytest.raises(ValueError, match="on_resume"):
        option(Options.integer, help="x", on_resume="sometimes")


# ---- the key lists of rundir.py and analysis/consistency.py come from the classes -----------
# (A snapshot of those lists as literals stood here; issue 57 dropped it: it restated what the
# classes' on_resume / added marks say, and failed on every new option, such as
# schedule.no_plan. The marks' effects are tested where they act: tests/test_run_integrity.py.)


def test_a_key_named_through_its_class_breaks_when_the_option_is_renamed():
    from accordion_repro.accordion.detector import DetectorSettings
    from accordion_repro.settings import key_of

    assert key_of(DetectorSettings, "eta") == "schedule.eta"
    with pytest.raises(KeyError, match="DetectorSettings has no option 'etta'"):
        key_of(DetectorSettings, "etta")
