"""Schedules: their plans, their validation errors, their restore, and the conf defaults."""

import io
import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from accordion_repro.accordion import (SCHEDULE_NAMES, Plan, build_schedule, compact_levels,
                                       validate_schedule)
from accordion_repro.errors import ConfigError

torch.set_num_threads(1)
CONF = Path(__file__).resolve().parents[1] / "conf" / "schedule"
RUN = dict(compressor="powersgd", default_level=2, base_global_batch=512, world_size=4)
DETECTOR = dict(eta=0.5, interval=1, lr_decay_rule=True, statistic="mean")


def make(name, /, num_layers=3, run=None, **options):
    # the (n, m) of each layer, which the size-aware schedules (lgreco, phase_rule) need
    shapes = {"layer_shapes": [(8, 27 * (i + 1)) for i in range(num_layers)]}
    return build_schedule(name, num_layers=num_layers, **{**RUN, **shapes, **(run or {})},
                          **options)


def check(name, options, run=None):
    """validate_schedule with RUN's arguments it takes (not the level and batch, which only
    build_schedule needs)."""
    run = {k: v for k, v in {**RUN, **(run or {})}.items()
           if k not in ("default_level", "base_global_batch")}
    return validate_schedule(name, options, **run)


def conf(name, *overrides) -> dict:
    """The schedule node as a run composes it (its interval comes from the scale)."""
    from conftest import compose_cfg

    cfg = compose_cfg([f"schedule={name}", "dataset=synthetic_cifar10", *overrides])
    return OmegaConf.to_container(cfg.schedule, resolve=True)


# ---- plans ---------------------------------------------------------------------------------
def test_static_keeps_the_compressor_default():
    schedule = make("static")
    assert not schedule.needs_detector and schedule.make_detector() is None
    assert schedule.initial_plan() == Plan(levels=None, global_batch=None, lr_scale=1.0)
    assert schedule.on_epoch_end(0, None) == schedule.initial_plan()
    info = schedule.info()
    assert info["levels"] == {"2": 3} and info["global_batch"] == 512
    assert info["critical_layers"] is None


def test_accordion_maps_flags_to_levels_from_the_next_epoch():
    schedule = make("accordion", low=2, high=1, **DETECTOR)
    assert schedule.needs_detector
    assert schedule.initial_plan().levels == [2, 2, 2]
    plan = schedule.on_epoch_end(10, [True, False, False])
    assert plan == Plan(levels=[2, 1, 1], global_batch=None, lr_scale=1.0)
    info = schedule.info()
    assert info["levels"] == {"2": 1, "1": 2}
    assert info["layer_levels"] == [2, 1, 1] and info["critical_layers"] == 1


def test_accordion_topk_levels_are_ratios():
    schedule = make("accordion", run={"compressor": "topk", "default_level": 0.99},
                    low=0.99, high=0.1, **DETECTOR)
    assert schedule.on_epoch_end(0, [False, True, False]).levels == [0.1, 0.99, 0.1]
    assert schedule.info()["levels"] == {"0.99": 1, "0.1": 2}


def test_accordion_with_its_detector_on_crafted_norms():
    schedule = make("accordion", num_layers=2, low=4, high=1, eta=0.5, interval=2,
                    lr_decay_rule=True, statistic="sum")
    detector = schedule.make_detector()
    layer_norms = [[4.0, 4.0], [1.0, 1.0], [4.0, 1.0], [9.0, 9.0], [4.0, 1.5]]
    levels = [schedule.initial_plan().levels]
    for epoch, norms in enumerate(layer_norms):
        detector.accumulate([torch.tensor([[n, 0.0]]) for n in norms])
        levels.append(schedule.on_epoch_end(epoch, detector.end_epoch(epoch, 0.1, 0.1)).levels)
    # levels[e] is what epoch e runs with; checks at 0, 2, 4 (4 vs 4 calm, 1 vs 4 critical;
    # then 4 vs 4 calm, 1.5 vs 1 critical)
    assert levels == [[4, 4], [4, 4], [4, 4], [1, 4], [1, 4], [1, 4]]


def test_accordion_refuses_flags_of_the_wrong_length():
    schedule = make("accordion", low=2, high=1, **DETECTOR)
    with pytest.raises(ValueError, match="make_detector"):
        schedule.on_epoch_end(0, [True])
    with pytest.raises(ValueError, match="make_detector"):
        schedule.on_epoch_end(0, None)


@pytest.mark.parametrize("rule, scale", [("linear", 8.0), ("sqrt", 8.0 ** 0.5), ("none", 1.0)])
def test_batch_accordion_detector_mode(rule, scale):
    schedule = make("batch_accordion", low=512, high=4096, lr_scaling=rule, mode="detector",
                    switch_epoch=20, decision="model_norm", **DETECTOR)
    detector = schedule.make_detector()
    assert detector.granularity == "model" and detector.num_units == 1
    assert schedule.initial_plan() == Plan(levels=None, global_batch=512, lr_scale=1.0)
    assert schedule.on_epoch_end(3, [False]) == Plan(levels=None, global_batch=4096,
                                                     lr_scale=pytest.approx(scale))
    assert schedule.info()["critical_model"] is False
    assert schedule.on_epoch_end(4, [True]).global_batch == 512


@pytest.mark.parametrize("decision, flags, batch", [
    ("any", [False, False, True], 512), ("any", [False, False, False], 4096),
    ("majority", [True, False, False], 4096), ("majority", [True, True, False], 512)])
def test_batch_accordion_from_per_layer_flags(decision, flags, batch):
    schedule = make("batch_accordion", low=512, high=4096, lr_scaling="linear", mode="detector",
                    switch_epoch=20, decision=decision, **DETECTOR)
    assert schedule.make_detector().num_units == 3
    assert schedule.on_epoch_end(0, flags).global_batch == batch
    assert schedule.info()["critical_layers"] == sum(flags)


def test_batch_accordion_fixed_epoch_switches_as_the_released_runs():
    schedule = make("batch_accordion", run={"total_epochs": 300}, low=512, high=4096,
                    lr_scaling="linear", mode="fixed_epoch", switch_epoch=20,
                    decision="model_norm", **DETECTOR)
    assert not schedule.needs_detector and schedule.make_detector() is None
    batches = [schedule.initial_plan().global_batch]
    batches += [schedule.on_epoch_end(e, None).global_batch for e in range(299)]
    assert batches == [512] * 20 + [4096] * 280      # batches[e] is epoch e's batch
    assert schedule.plan.lr_scale == 8.0


def test_fixed_epoch_switch_given_as_a_fraction_shrinks_with_the_run():
    schedule = make("batch_accordion", run={"total_epochs": 30}, low=512, high=4096,
                    lr_scaling="linear", mode="fixed_epoch", switch_epoch=20 / 300,
                    decision="model_norm", **DETECTOR)
    assert schedule.settings.switch_epoch == 2
    assert [schedule.on_epoch_end(e, None).global_batch for e in range(3)] == [512, 4096, 4096]


def test_joint_drives_levels_and_batch_from_one_detector():
    schedule = make("joint", low=2, high=1, batch_low=512, batch_high=2048,
                    lr_scaling="linear", decision="model_norm", **DETECTOR)
    assert schedule.make_detector().granularity == "layer+model"
    assert schedule.initial_plan() == Plan(levels=[2, 2, 2], global_batch=512, lr_scale=1.0)
    plan = schedule.on_epoch_end(0, [True, False, False, False])
    assert plan == Plan(levels=[2, 1, 1], global_batch=2048, lr_scale=4.0)
    info = schedule.info()
    assert info["critical_layers"] == 1 and info["critical_model"] is False
    assert schedule.on_epoch_end(1, [False, False, False, True]).global_batch == 512


def test_regime_windows_inside_and_outside():
    windows = [[0, 2], [5, 6]]
    inside_high = make("regime_windows", windows=windows, inside=1, outside=2)
    levels = [inside_high.initial_plan().levels[0]]
    levels += [inside_high.on_epoch_end(e, None).levels[0] for e in range(7)]
    assert levels == [1, 1, 2, 2, 2, 1, 2, 2]
    assert inside_high.info()["critical_layers"] == 0
    outside_high = make("regime_windows", windows=windows, inside=2, outside=1)
    assert outside_high.initial_plan().levels == [2, 2, 2]


def test_regime_window_fractions_follow_total_epochs():
    options = conf("regime_windows")
    paper = make("regime_windows", run={"total_epochs": 300}, **options)
    cpu = make("regime_windows", run={"total_epochs": 30}, **options)
    assert paper.settings.windows == [(0, 20), (150, 160), (250, 260)]
    assert cpu.settings.windows == [(0, 2), (15, 16), (25, 26)]


def test_compact_levels():
    assert compact_levels([2] * 20 + [1]) == {"2": 20, "1": 1}
    assert list(compact_levels([1, 2, 1, 4])) == ["4", "2", "1"]
    assert compact_levels([0.1, 0.99, 0.1]) == {"0.99": 1, "0.1": 2}
    assert compact_levels([None, None]) == {"none": 2}
    json.dumps(compact_levels([2, 1]))


# ---- validation ----------------------------------------------------------------------------
ACCORDION = dict(low=2, high=1, **DETECTOR)
BATCH = dict(low=512, high=4096, lr_scaling="linear", mode="detector", switch_epoch=20,
             decision="model_norm", **DETECTOR)


@pytest.mark.parametrize("name, run, options, key", [
    ("accordion", {}, {**ACCORDION, "eta": 0}, "schedule.eta"),
    ("accordion", {}, {**ACCORDION, "eta": -0.5}, "schedule.eta"),
    ("accordion", {}, {**ACCORDION, "interval": 0}, "schedule.interval"),
    ("accordion", {}, {**ACCORDION, "interval": 2.5}, "schedule.interval"),
    ("accordion", {}, {**ACCORDION, "low": 2.5}, "schedule.low"),
    ("accordion", {}, {**ACCORDION, "high": 0}, "schedule.high"),
    ("accordion", {}, {**ACCORDION, "low": 1, "high": 2}, "schedule.high"),
    ("accordion", {"compressor": "topk"}, {**ACCORDION, "low": 0.99, "high": 2},
     "schedule.high"),
    ("accordion", {"compressor": "topk"}, {**ACCORDION, "low": 1.5, "high": 0.1},
     "schedule.low"),
    ("accordion", {"compressor": "topk"}, {**ACCORDION, "low": 0.1, "high": 0.99},
     "schedule.high"),
    ("accordion", {"compressor": "none", "default_level": None}, ACCORDION, "schedule.name"),
    ("accordion", {}, {**ACCORDION, "lr_decay_rule": "yes"}, "schedule.lr_decay_rule"),
    ("accordion", {}, {**ACCORDION, "statistic": "median"}, "schedule.statistic"),
    ("accordion", {}, {**ACCORDION, "threshold": 0.5}, "schedule.threshold"),
    ("accordion", {}, {k: v for k, v in ACCORDION.items() if k != "high"}, "schedule.high"),
    ("batch_accordion", {}, {**BATCH, "high": 256}, "schedule.high"),
    ("batch_accordion", {}, {**BATCH, "low": 510}, "schedule.low"),
    ("batch_accordion", {"world_size": 3}, BATCH, "schedule.low"),
    ("batch_accordion", {}, {**BATCH, "lr_scaling": "cubic"}, "schedule.lr_scaling"),
    ("batch_accordion", {}, {**BATCH, "mode": "auto"}, "schedule.mode"),
    ("batch_accordion", {}, {**BATCH, "decision": "all"}, "schedule.decision"),
    ("batch_accordion", {}, {**BATCH, "switch_epoch": 0.1}, "schedule.switch_epoch"),
    ("batch_accordion", {}, {**BATCH, "switch_epoch": -1}, "schedule.switch_epoch"),
    ("joint", {}, {**ACCORDION, **BATCH, "batch_low": 512, "batch_high": 256},
     "schedule.mode"),
    ("joint", {}, dict(low=2, high=1, batch_low=4096, batch_high=512, lr_scaling="linear",
                       decision="model_norm", **DETECTOR), "schedule.batch_high"),
    ("joint", {"compressor": "none", "default_level": None},
     dict(low=2, high=1, batch_low=512, batch_high=4096, lr_scaling="linear",
          decision="model_norm", **DETECTOR), "schedule.name"),
    ("regime_windows", {}, dict(windows=[[0, 0.1]], inside=1, outside=2),
     "schedule.windows[0]"),
    ("regime_windows", {"total_epochs": 30}, dict(windows=[[5, 5]], inside=1, outside=2),
     "schedule.windows[0]"),
    ("regime_windows", {"total_epochs": 30}, dict(windows=[[0, 2], [150, 160]], inside=1,
                                                  outside=2), "schedule.windows[1]"),
    ("regime_windows", {}, dict(windows=[0, 20], inside=1, outside=2), "schedule.windows[0]"),
    ("regime_windows", {}, dict(windows=[[0, 20]], inside=0.5, outside=2), "schedule.inside"),
    ("cosine", {}, {}, "schedule.name"),
])
def test_invalid_settings_name_the_key(name, run, options, key):
    with pytest.raises(ConfigError) as caught:
        check(name, options, run)
    assert caught.value.key == key
    assert str(caught.value).startswith(key)
    with pytest.raises(ConfigError):
        make(name, run=run, **options)


def test_equal_low_and_high_are_allowed_and_topk_accepts_an_integer_one():
    check("accordion", {**ACCORDION, "low": 2, "high": 2})
    schedule = make("accordion", run={"compressor": "topk"}, **{**ACCORDION, "low": 1,
                                                                 "high": 0.5})
    assert schedule.initial_plan().levels == [1.0, 1.0, 1.0]
    assert isinstance(schedule.settings.low, float)


def test_batch_schedules_work_without_a_compressor():
    check("batch_accordion", BATCH, {"compressor": "none"})
    info = make("batch_accordion", run={"compressor": "none", "default_level": None},
                **BATCH).info()
    assert info["levels"] == {"none": 3} and info["global_batch"] == 512


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_conf_defaults_are_valid_and_name_comes_first(name):
    text = (CONF / f"{name}.yaml").read_text().splitlines()
    assert [line for line in text if line and not line.startswith("#")][0] == f"name: {name}"
    options = conf(name)
    check(name, options, {"total_epochs": 300})
    schedule = make(name, run={"total_epochs": 300}, **options)
    json.dumps(schedule.info())


@pytest.mark.parametrize("name", SCHEDULE_NAMES)
def test_sets_levels_says_whether_the_plans_leave_the_compressors_own_level_unread(name):
    """`sets_levels` decides whether the config refuses compressor.rank / ratio (config.py
    check_level_owner): it must be true exactly where the plan gives every layer a level."""
    schedule = make(name, run={"total_epochs": 300}, **conf(name))
    levels = schedule.initial_plan().levels
    assert schedule.sets_levels == (levels is not None)
    assert levels is None or None not in levels


def test_accordion_conf_defaults_match_the_paper():
    assert conf("accordion") == {"name": "accordion", "low": 2, "high": 1, "eta": 0.5,
                                 "interval": 10, "lr_decay_rule": True, "statistic": "mean"}
    assert conf("accordion", "model=lstm", "dataset=synthetic_text")["interval"] == 5
    assert conf("accordion", "scale=cpu")["interval"] == 1


# ---- restore -------------------------------------------------------------------------------
def _through_checkpoint(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


@pytest.mark.parametrize("name, options", [
    ("accordion", dict(ACCORDION, interval=3)),
    ("joint", dict(low=2, high=1, batch_low=512, batch_high=4096, lr_scaling="sqrt",
                   decision="model_norm", **{**DETECTOR, "interval": 2, "eta": 0.3})),
    ("batch_accordion", dict(BATCH, decision="majority", interval=2)),
    ("regime_windows", dict(windows=[[0, 3], [7, 9]], inside=2, outside=1)),
])
def test_restored_schedule_and_detector_make_the_same_decisions(name, options):
    generator = torch.Generator().manual_seed(1)
    grads = [[torch.randn(3, 2, generator=generator) * (1 + (e * 5) % 4) for _ in range(3)]
             for e in range(12)]
    lrs = [0.4] * 6 + [0.04] * 7

    def play(schedule, detector, epochs):
        plans = []
        for epoch in epochs:
            flags = None
            if detector is not None:
                detector.accumulate(grads[epoch])
                flags = detector.end_epoch(epoch, lrs[epoch], lrs[epoch + 1])
            plans.append((schedule.on_epoch_end(epoch, flags), schedule.info()))
        return plans

    reference_schedule = make(name, **options)
    reference = play(reference_schedule, reference_schedule.make_detector(), range(12))

    first = make(name, **options)
    first_detector = first.make_detector()
    before = play(first, first_detector, range(5))
    state = _through_checkpoint({"schedule": first.state_dict(), "detector":
                                 None if first_detector is None else first_detector.state_dict()})
    restored = make(name, **options)
    detector = restored.make_detector()
    restored.load_state_dict(state["schedule"])
    if detector is not None:
        detector.load_state_dict(state["detector"])
    assert restored.plan == before[-1][0]
    assert before + play(restored, detector, range(5, 12)) == reference


def test_restore_refuses_another_schedule():
    with pytest.raises(ValueError, match="checkpoint holds"):
        make("static").load_state_dict(make("accordion", **ACCORDION).state_dict())


def test_static_with_detect_logs_the_detectors_flags_and_never_changes_the_plan():
    """schedule.detect=true: the detector watches a fixed level (per layer and for the whole
    model) and its flags are reported, but the plan stays the compressor's own level."""
    schedule = build_schedule("static", num_layers=3, compressor="powersgd", default_level=2,
                              base_global_batch=128, world_size=2, detect=True, interval=1)
    detector = schedule.make_detector()
    assert schedule.needs_detector and detector.granularity == "layer+model"
    assert schedule.info()["critical_layers"] == 3 and schedule.info()["critical_model"] is True
    plan = schedule.on_epoch_end(0, [True, False, False, False])
    assert plan.levels is None and schedule.info()["layer_levels"] == [2, 2, 2]
    assert schedule.info()["critical_layers"] == 1 and schedule.info()["critical_model"] is False
    plain = build_schedule("static", num_layers=3, compressor="powersgd", default_level=2,
                           base_global_batch=128, world_size=2)
    assert not plain.needs_detector and plain.make_detector() is None
    assert plain.info()["critical_layers"] is None


@pytest.mark.parametrize("value", ["maybe", 1])
def test_static_detect_must_be_true_or_false(value):
    with pytest.raises(ConfigError, match=r"schedule\.detect: must be true or false"):
        validate_schedule("static", {"detect": value}, compressor="powersgd", world_size=2)
