"""The CPU reproduction's run list: every preset exists and composes with the real-data overrides."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from accordion_repro import reproduce_cpu as script
from conftest import compose_cfg


@pytest.mark.slow
def test_every_reproduction_run_is_a_preset_that_composes_at_cpu_scale(tmp_path):
    for preset in script.CIFAR_PRESETS + script.LSTM_PRESETS + [script.TRACE_PRESET]:
        argv = script.command(preset, 42, tmp_path / "data", tmp_path / "out", [])
        overrides = [a for a in argv[3:] if not a.startswith("hydra.")]
        cfg = compose_cfg(overrides)
        assert cfg.scale.name == "cpu" and cfg.run.name == preset and cfg.seed == 42
        assert cfg.dataset.name == ("wikitext2" if "lstm" in preset else "npz")


def test_several_only_patterns_run_pattern_by_pattern_each_run_once():
    order = script.run_order("cpu_full", [42], ["fig10/*", "fig9/*", "*"])
    presets = [preset for preset, _ in order]
    fig10 = [p for p in script.FULL_EXTRA if p.startswith("fig10/")]
    fig9 = [p for p in script.FULL_EXTRA if p.startswith("fig9/")]
    assert fig10 and fig9 and presets[:len(fig10) + len(fig9)] == fig10 + fig9
    assert len(presets) == len(set(presets)) == (len(script.FULL_CORE) + len(script.FULL_EXTRA)
                                                 + len(script.ETA_SWEEP) + len(script.PRECISION_CHECK))
    assert script.run_order("cpu_full", [42], ["*"]) == script.run_order("cpu_full", [42], ["*", "*"])
    # cpu_long: its core, the extra cells, Figure 2 (b)'s control arms with the ablation, then
    # the successors, each group for every seed; the eta sweep and precision check are cpu_full's
    long = [p for p, _ in script.run_order("cpu_long", [42, 43], ["*"])]
    groups = (script.LONG_CORE, script.LONG_EXTRA, script.LONG_CONTROLS, script.LONG_SUCCESSORS)
    assert long == [p for group in groups for _ in (42, 43) for p in group]
    assert not set(long) & (set(script.ETA_SWEEP) | set(script.PRECISION_CHECK))


def test_the_whole_cifar_study_runs_each_configuration_once():
    """A cell whose configuration another table's cell already runs (analysis/layout.py TWINS)
    is not run again; the run standing in for a ResNet-18 cell (the study's model) is one the
    study runs for every seed."""
    from accordion_repro.analysis.layout import TWINS

    presets = script.FULL_CORE + script.FULL_EXTRA
    assert not set(presets) & set(TWINS)
    assert {TWINS[p] for p in TWINS if "/resnet18_" in p} <= set(script.FULL_CORE)


@pytest.mark.slow
def test_the_successors_are_queued_at_cpu_long_with_the_compared_settings(tmp_path):
    """L-GreCo r0 = 2 (ranks 1..4, alpha 1), L-GreCo + Accordion 2<->1, ACP-SGD rank 2 and the
    phase rule, after the study's own runs, for every seed, on the whole CIFAR-10."""
    from accordion_repro.analysis.layout import SUCCESSORS

    assert script.LONG_SUCCESSORS == list(SUCCESSORS.own_presets)
    order = script.run_order("cpu_long", [42, 43, 44], ["*"])
    tail = 3 * len(script.LONG_SUCCESSORS)
    assert order[-tail:] == [(p, s) for s in (42, 43, 44) for p in script.LONG_SUCCESSORS]
    settings = {}
    for preset in script.LONG_SUCCESSORS:
        argv = script.command(preset, 42, tmp_path / "data", tmp_path / "out", [], "cpu_long")
        cfg = compose_cfg([a for a in argv[3:] if not a.startswith("hydra.")])
        assert cfg.scale.name == "cpu_long" and cfg.dataset.name == "npz"
        assert cfg.run.name == preset and cfg.run.table == "successors"
        settings[preset.split("/resnet18_")[1]] = (cfg.compressor.name, cfg.compressor.rank,
                                                   dict(cfg.schedule))
    name, rank, lgreco = settings["lgreco"]
    assert (name, lgreco["r0"], lgreco["gamma"], lgreco["beta"], lgreco["alpha"]) == \
        ("powersgd", 2, 0.5, 2.0, 1.0)
    assert (settings["lgreco_accordion"][2]["low"], settings["lgreco_accordion"][2]["high"]) == (2, 1)
    assert settings["acp_powersgd"][:2] == ("acp_powersgd", 2)
    acp_accordion = settings["acp_accordion"]  # ACP-SGD under Accordion 2<->1 (issue 59)
    assert acp_accordion[0] == "acp_powersgd" and acp_accordion[2]["name"] == "accordion"
    assert (acp_accordion[2]["low"], acp_accordion[2]["high"]) == (2, 1)
    assert settings["phase_rule"][2]["name"] == "phase_rule"


@pytest.mark.parametrize("name", sorted(script.ETA_SWEEP))
def test_each_eta_sweep_run_is_table1_accordion_with_its_eta_and_in_no_table(tmp_path, name):
    argv = script.command(name, 42, tmp_path / "data", tmp_path / "out", [], "cpu_full")
    cfg = compose_cfg([a for a in argv[3:] if not a.startswith("hydra.")])
    eta = float(name.rsplit("eta", 1)[1])
    assert cfg.run.name == name and cfg.run.table is None and cfg.run.figure is None
    assert cfg.schedule.name == "accordion" and cfg.schedule.eta == eta
    assert cfg.scale.name == "cpu_full" and f"eta {eta:g}" in cfg.run.label


@pytest.mark.parametrize("name", sorted(script.ABLATION))
def test_each_detector_ablation_run_is_named_apart_and_changes_only_its_rule(tmp_path, name):
    """Issue 36's ablation at scale=cpu_long: Accordion without the LR-decay rule, with eta
    0.1, and the LR-decay rule alone; none lands in a table or figure."""
    argv = script.command(name, 42, tmp_path / "data", tmp_path / "out", [], "cpu_long")
    cfg = compose_cfg([a for a in argv[3:] if not a.startswith(("hydra.", "paths."))])
    assert cfg.run.name == name and cfg.run.table is None and cfg.run.figure is None
    assert cfg.scale.name == "cpu_long" and cfg.compressor.name == "powersgd"
    if name.endswith("lr_rule_only"):
        assert cfg.schedule.name == "regime_windows"
        assert (cfg.schedule.inside, cfg.schedule.outside) == (2, 1)
        # rank 2 where the first check and the LR-decay rule hold epochs critical at this
        # scale's interval of one epoch: 0 (start), 1 (first check) and each decay's first epoch
        decays = [e for e in range(1, 30) if e in (15, 25)]
        assert cfg.schedule.windows == [[0, 2], *[[d, d + 1] for d in decays]]
        assert cfg.schedule.windows == cfg.scale.fig2_windows
    else:
        assert cfg.schedule.name == "accordion" and (cfg.schedule.low, cfg.schedule.high) == (2, 1)
        assert (cfg.schedule.eta, cfg.schedule.lr_decay_rule) == (
            (0.5, False) if name.endswith("no_lr_rule") else (0.1, True))


def _detect_run(run_dir: Path, critical_epochs: set[int], epochs: int = 30) -> None:
    """A finished rank-2 detect run as the trainer writes it, holding `critical_epochs` critical
    (the flags logged at the end of epoch e hold for e + 1; epoch 0 starts critical)."""
    run_dir.mkdir(parents=True)
    lines = []
    for epoch in range(epochs):
        lr = 0.1 if epoch < 15 else 0.01 if epoch < 25 else 0.001
        flag = epoch + 1 in critical_epochs
        lines.append(json.dumps({
            "epoch": epoch, "lr": lr, "steps": 391, "floats_sent": 1, "bytes_sent": 4,
            "collectives": 1, "epoch_time_s": 1.0, "compute_time_s": 1.0, "test_acc": 50.0,
            "detector": {"granularity": "layer+model", "critical": [flag] * 22}}))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    (run_dir / "summary.json").write_text(json.dumps({"status": "completed"}))
    (run_dir / "resolved.yaml").write_text("seed: 42\n")


@pytest.mark.parametrize("arm", ["fig2/resnet18_high_inside", "fig2/resnet18_high_outside",
                                 "fig2/resnet18_high_earliest", "fig2/resnet18_high_random"])
def test_cpu_long_figure2b_arms_wait_for_and_follow_their_seeds_detect_run(tmp_path, arm):
    """At scale=cpu_long the rank-2 cell watches its critical regimes (schedule.detect=true);
    each Figure 2 (b) arm waits for it, then puts rank 1 into the epochs the plan gives and
    writes the plan beside the runs."""
    runs = tmp_path / "runs"
    reference = script.command(script.FIG2_REFERENCE, 42, tmp_path / "data", tmp_path / "ref",
                               [], "cpu_long", runs)
    assert "schedule.detect=true" in reference and "scale=cpu_long" in reference
    with pytest.raises(script.PlanNotReady, match="static_low seed 42 first"):
        script.command(arm, 42, tmp_path / "data", tmp_path / "out", [], "cpu_long", runs)
    _detect_run(script.run_dir(runs, script.FIG2_REFERENCE, 42), {0, 1, 15, 25, 26})
    argv = script.command(arm, 42, tmp_path / "data", tmp_path / "out", [], "cpu_long", runs)
    cfg = compose_cfg([a for a in argv[3:] if not a.startswith(("hydra.", "paths."))])
    expected = {"inside": [[0, 2], [15, 16], [25, 27]], "outside": [[13, 15], [24, 25], [28, 30]],
                "earliest": [[2, 4], [16, 17], [27, 29]]}
    plan = json.loads((runs / "fig2" / "plan_seed42.json").read_text())
    name = arm.rsplit("_", 1)[1]
    assert cfg.schedule.windows == expected.get(name, plan["random_windows"])
    assert cfg.run.method == f"high_{name}" and cfg.run.figure == "fig2"
    assert (cfg.schedule.inside, cfg.schedule.outside, cfg.scale.name) == (1, 2, "cpu_long")
    plan = json.loads((runs / "fig2" / "plan_seed42.json").read_text())
    assert plan["reference"] == f"{script.FIG2_REFERENCE}/seed42"
    assert plan["critical_epochs"] == [0, 1, 15, 25, 26]


def test_a_resumed_runs_wall_time_counts_every_attempt(tmp_path):
    """An attempt stopped mid-run (a SIGTERM, a crash) keeps its seconds until the attempt that
    finishes the run, whose timings.csv row is their sum; a finished run's row is replaced."""
    add = script.add_wall_time
    assert add(tmp_path, "table1/x", 42, 100.0, finished=False) == 100.0
    assert not (tmp_path / "timings.csv").exists()
    assert add(tmp_path, "table1/x", 42, 50.5, finished=False) == 150.5
    assert add(tmp_path, "table1/y", 42, 7.0, finished=True) == 7.0
    assert add(tmp_path, "table1/x", 42, 30.0, finished=True) == 180.5
    assert (tmp_path / "timings.csv").read_text().splitlines() == [
        "preset,seed,wall_s", "table1/y,42,7.0", "table1/x,42,180.5"]
    assert not (tmp_path / "timings_partial.json").exists()


def test_a_stopped_runner_stops_its_trainer_and_says_so(tmp_path):
    """SIGTERM to the runner reaches the trainer (which saves and exits) instead of leaving it
    training on unwatched; the runner learns that it was told to stop."""
    ready = tmp_path / "ready"
    child = ("import pathlib, signal, sys, time\n"
             "signal.signal(signal.SIGTERM, lambda *a: sys.exit(3))\n"
             f"pathlib.Path({str(ready)!r}).touch()\n"
             "time.sleep(60)\n")

    def stop_when_ready():
        while not ready.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=stop_when_ready, daemon=True).start()
    previous = signal.getsignal(signal.SIGTERM)
    assert script.run_trainer([sys.executable, "-c", child]) == (3, True)
    assert signal.getsignal(signal.SIGTERM) is previous


# ---- the fp32 study (issue 55) -------------------------------------------------------------
def test_the_fp32_study_queues_each_central_arm_for_every_seed_then_topk_and_successors(tmp_path):
    order = script.run_order("cpu_fp32", script.FP32_SEEDS, ["*"], tmp_path / "runs")
    central = [(p, s) for p in script.FP32_CENTRAL for s in script.FP32_SEEDS]
    assert order[:len(central)] == central and order[0] == (script.FIG2_REFERENCE, 42)
    assert [p for p, _ in central[:9:3]] == [script.FIG2_REFERENCE,
                                            "table1/resnet18_powersgd_static_high",
                                            "fig2/resnet18_high_inside"]
    rest = order[len(central):]
    assert rest == [(p, s) for group in (script.FP32_TOPK, script.FP32_SUCCESSORS,
                                         script.FP32_PRECISION)
                    for p in group for s in script.FP32_SEEDS]
    assert not {s for _, s in order} & set(script.FP32_MORE_SEEDS)  # nothing decided yet


def _finished(runs: Path, preset: str, seed: int, final: float) -> None:
    run = script.run_dir(runs, preset, seed)
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"epoch": 0, "test_acc": final}) + "\n")
    (run / "summary.json").write_text(json.dumps({"status": "completed"}))


def test_seeds_45_and_46_join_for_the_arms_of_the_contrasts_still_undecided(tmp_path):
    """After seeds 42-44 of every headline contrast: latest minus inside +0.9..+1.1 (its 95 %
    interval excludes zero) and random minus inside likewise stay at three seeds; Accordion
    minus rank 2 (+0.5, -0.5, +0.1) spans zero, so Accordion and rank 2 (the detect run every
    plan needs) run for seeds 45 and 46, before the Top-K cells."""
    runs = tmp_path / "runs"
    finals = {"fig2/resnet18_high_inside": (84.0, 84.2, 84.1),
              "fig2/resnet18_high_outside": (85.0, 85.3, 85.0),
              "fig2/resnet18_high_random": (85.1, 85.2, 85.0),
              script.FIG2_REFERENCE: (85.0, 85.0, 85.0),
              "table1/resnet18_powersgd_accordion": (85.5, 84.5, 85.1)}
    for preset, values in finals.items():
        for seed, final in zip(script.FP32_SEEDS, values):
            _finished(runs, preset, seed, final)
    assert script.undecided_arms(runs, script.FP32_SEEDS) == {
        "table1/resnet18_powersgd_accordion", script.FIG2_REFERENCE}
    order = script.run_order("cpu_fp32", script.FP32_SEEDS, ["*"], runs)
    extra = [(p, s) for p, s in order if s in script.FP32_MORE_SEEDS]
    assert extra == [(p, s) for p in (script.FIG2_REFERENCE, "table1/resnet18_powersgd_accordion")
                     for s in script.FP32_MORE_SEEDS]
    assert order.index(extra[-1]) < order.index((script.FP32_TOPK[0], 42))
    # one run short of the three seeds: nothing is decided, nothing is added
    (script.run_dir(runs, "fig2/resnet18_high_random", 44) / "summary.json").unlink()
    assert script.undecided_arms(runs, script.FP32_SEEDS) == set()


@pytest.mark.slow
def test_the_fp32_study_runs_fp32_under_the_avx2_cap_at_its_scale(tmp_path):
    argv = script.command(script.LR_RULE_ONLY, 42, tmp_path / "data", tmp_path / "out", [],
                          "cpu_fp32")
    cfg = compose_cfg([a for a in argv[3:] if not a.startswith(("hydra.", "paths."))])
    assert (cfg.scale.name, cfg.trainer.precision, cfg.trainer.channels_last) == \
        ("cpu_fp32", "fp32", True)
    assert (cfg.trainer.epochs, cfg.model.width, cfg.dataset.name) == (30, 0.125, "npz")
    assert cfg.schedule.windows == cfg.scale.fig2_windows == [[0, 2], [15, 16], [25, 26]]
    assert script.study_env("cpu_fp32")["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert script.STUDIES["cpu_fp32"]["env"] == script.AVX2_CAP


def test_a_bf16_study_is_refused_where_bf16_is_emulated(monkeypatch):
    """scale=cpu_long is bf16; under an AVX2 cap oneDNN reports no native bf16, so its runs
    would be emulated at 8-12x fp32's cost: the runner refuses before any run. fp32 studies and
    an explicit trainer.precision=fp32 pass."""
    monkeypatch.setitem(script.STUDIES["cpu_long"], "env", script.AVX2_CAP)
    why = script.bf16_refusal("cpu_long", [])
    assert why and "no native bf16" in why and "--study cpu_fp32" in why
    assert script.bf16_refusal("cpu_long", ["trainer.precision=fp32"]) is None
    assert script.bf16_refusal("cpu_fp32", []) is None


def test_a_second_queue_on_one_runs_folder_is_refused_naming_the_first(tmp_path):
    import subprocess

    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "queue.pid").write_text(f"{holder.pid}\n")
        with pytest.raises(SystemExit, match=rf"a queue already runs on .* \(pid {holder.pid}\)"):
            script.queue_lock(tmp_path).__enter__()
    finally:
        holder.kill()
        holder.wait()
    with script.queue_lock(tmp_path):  # its process gone (a killed machine): taken over
        assert script.queue_holder(tmp_path) == os.getpid()
    assert not (tmp_path / "queue.pid").exists()


def test_study_status_lists_done_running_and_queued_runs_with_an_eta(tmp_path, capsys):
    from accordion_repro.study_status import print_status

    runs = tmp_path / "runs"
    _finished(runs, script.FIG2_REFERENCE, 42, 85.0)
    script.add_wall_time(runs, script.FIG2_REFERENCE, 42, 1500.0, finished=True)
    stopped = script.run_dir(runs, script.FIG2_REFERENCE, 43)
    stopped.mkdir(parents=True)
    (stopped / "summary.json").write_text(json.dumps({"status": "stopped"}))
    (stopped / "resolved.yaml").write_text("trainer:\n  epochs: 30\n")
    (stopped / "metrics.jsonl").write_text("{}\n" * 10)
    assert print_status("cpu_fp32", script.FP32_SEEDS, runs, ["table1/*"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("(queue not running)")
    assert f"  done     {script.FIG2_REFERENCE} seed 42   25.0 min" in out
    assert f"  stopped  {script.FIG2_REFERENCE} seed 43  epoch 10/30" in out
    assert f"  queued   {script.FIG2_REFERENCE} seed 44  " in out
    # table1/*: rank 2, rank 1, Accordion and (for the precision arms' pairing) dense for 3
    # seeds; 10 queued and 2/3 of the stopped one at the only median there is (25 min):
    # 266.7 min, 4.4 h
    assert out[-1].startswith("1 done, 0 running, 1 stopped, 10 queued; about 4.4 h of runs left")


def test_commit_run_commits_the_run_its_plans_and_rebuilt_tables_and_nothing_else_staged(
        tmp_path, monkeypatch):
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True,
                              capture_output=True, text=True).stdout

    git("init", "-q")
    git("config", "user.email", "t@example.com")
    git("config", "user.name", "t")
    (tmp_path / "unrelated.py").write_text("x = 1\n")
    git("add", "unrelated.py")  # staged by someone else: not the runner's to commit
    runs = tmp_path / "results" / "runs" / "cpu_fp32"
    out = script.run_dir(runs, script.FIG2_REFERENCE, 42)
    out.mkdir(parents=True)
    (out / "metrics.jsonl").write_text("{}\n")
    (runs / "timings.csv").write_text("preset,seed,wall_s\n")
    monkeypatch.setattr(script, "REPO", tmp_path)
    script.commit_run(runs, out, "cpu_fp32: one run")
    committed = git("show", "--name-only", "--format=%s", "HEAD").split()
    assert committed[:2] == ["cpu_fp32:", "one"]
    assert f"results/runs/cpu_fp32/{script.FIG2_REFERENCE}/seed42/metrics.jsonl" in committed
    assert "results/runs/cpu_fp32/timings.csv" in committed
    assert "results/tables/table1.md" in committed  # rebuilt (here: every cell to run)
    assert "unrelated.py" not in committed and git("diff", "--cached", "--name-only") == \
        "unrelated.py\n"
