"""The CPU reproduction's run list: every preset exists and composes with the real-data overrides."""

from __future__ import annotations

import pytest

from conftest import compose_cfg, load_script


def _script():
    return load_script("reproduce_cpu")


def test_every_reproduction_run_is_a_preset_that_composes_at_cpu_scale(tmp_path):
    script = _script()
    for preset in script.CIFAR_PRESETS + script.LSTM_PRESETS + [script.TRACE_PRESET]:
        argv = script.command(preset, 42, tmp_path / "data", tmp_path / "out", [])
        overrides = [a for a in argv[3:] if not a.startswith("hydra.")]
        cfg = compose_cfg(overrides)
        assert cfg.scale.name == "cpu" and cfg.run.name == preset and cfg.seed == 42
        assert cfg.dataset.name == ("wikitext2" if "lstm" in preset else "npz")


def test_several_only_patterns_run_pattern_by_pattern_each_run_once():
    script = _script()
    order = script.run_order("cpu_full", [42], ["fig10/*", "fig9/*", "*"])
    presets = [preset for preset, _ in order]
    fig10 = [p for p in script.FULL_EXTRA if p.startswith("fig10/")]
    fig9 = [p for p in script.FULL_EXTRA if p.startswith("fig9/")]
    assert fig10 and fig9 and presets[:len(fig10) + len(fig9)] == fig10 + fig9
    assert len(presets) == len(set(presets)) == (len(script.FULL_CORE) + len(script.FULL_EXTRA)
                                                 + len(script.VARIANTS))
    assert script.run_order("cpu_full", [42], ["*"]) == script.run_order("cpu_full", [42], ["*", "*"])


def test_the_whole_cifar_study_runs_each_configuration_once():
    """A cell whose configuration another table's cell already runs (analysis/layout.py TWINS)
    is not run again; the run standing in for a ResNet-18 cell (the study's model) is one the
    study runs for every seed."""
    from accordion_repro.analysis.layout import TWINS

    script = _script()
    presets = script.FULL_CORE + script.FULL_EXTRA
    assert not set(presets) & set(TWINS)
    assert {TWINS[p] for p in TWINS if "/resnet18_" in p} <= set(script.FULL_CORE)


def _eta_sweep_names():
    return sorted(_script().ETA_SWEEP)



@pytest.mark.parametrize("name", _eta_sweep_names())
def test_each_eta_sweep_run_is_table1_accordion_with_its_eta_and_in_no_table(tmp_path, name):
    script = _script()
    argv = script.command(name, 42, tmp_path / "data", tmp_path / "out", [], "cpu_full")
    cfg = compose_cfg([a for a in argv[3:] if not a.startswith("hydra.")])
    eta = float(name.rsplit("eta", 1)[1])
    assert cfg.run.name == name and cfg.run.table is None and cfg.run.figure is None
    assert cfg.schedule.name == "accordion" and cfg.schedule.eta == eta
    assert cfg.scale.name == "cpu_full" and f"eta {eta:g}" in cfg.run.label
