"""benchmarks/gpu_check.py: one line without a GPU and no install; the whole check, tiny, on the
CPU; a hung part stopped within its limit and named; the offline node without Hydra & co."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
import time

import pytest
import torch

from accordion_repro.benchmarks import gpu_check, gpu_parts
from conftest import REPO, load_script

NO_GPU = "gpu-check: no CUDA GPU found (torch.cuda.is_available() is False); nothing run"
BLOCKED = ("hydra", "omegaconf", "submitit", "wandb")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine's CUDA works")
def test_a_gpu_that_cuda_cannot_use_fails_the_check_in_one_line(monkeypatch, capsys):
    """Issue 60: with a GPU present but CUDA unusable (a driver too old, a CPU-only torch),
    gpu-check said "no CUDA GPU found" and exited 0, so a broken node looked like a CPU one."""
    from accordion_repro.benchmarks import gpu_check

    monkeypatch.setattr(gpu_check, "gpu_present", lambda: "1 in /proc/driver/nvidia/gpus")
    assert gpu_check.main([]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and out[0].startswith("gpu-check: a GPU is present (1 in /proc/")
    assert "but CUDA is not usable" in out[0]
    monkeypatch.setattr(gpu_check, "gpu_present", lambda: None)
    assert gpu_check.main([]) == 0 and capsys.readouterr().out.splitlines() == [NO_GPU]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run")
@pytest.mark.slow
def test_make_gpu_check_installs_nothing_and_says_no_gpu_in_one_line():
    # the recipe names no pip and no $(STAMP): the given interpreter runs the script, alone
    recipe = subprocess.run(["make", "--no-print-directory", "--always-make", "--dry-run", "gpu-check",
                             f"PYTHON={sys.executable}"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert recipe.returncode == 0 and recipe.stdout.splitlines() == [
        f"{sys.executable} -m benchmarks.gpu_check"]
    done = subprocess.run(["make", "--no-print-directory", "gpu-check",
                           f"PYTHON={sys.executable}"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stderr == "" and done.stdout.splitlines() == [NO_GPU]


def _blocker(tmp_path):
    """A PYTHONPATH entry under which Hydra, omegaconf, submitit and wandb are not installed."""
    for name in BLOCKED:
        (tmp_path / f"{name}.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}'\", name={name!r})\n")
    return {**os.environ, "PYTHONPATH": str(tmp_path)}


@pytest.mark.slow
def test_the_check_and_its_parts_import_nothing_of_hydra_omegaconf_submitit_wandb(tmp_path):
    env = _blocker(tmp_path)
    code = ("import benchmarks.gpu_check as gpu_check, benchmarks.gpu_parts; "
            "import accordion_repro.ddp, accordion_repro.comm.ddp_hook, accordion_repro.data, "
            "benchmarks.step_options, torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook; "
            "print(gpu_check._trainer_missing())")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ("skipped: hydra is not installed (the trainer's entry point "
                                   "needs Hydra and omegaconf; docs/gpu.md installs them offline)")


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1500)  # seven parts, ~6.5 min on 2 loaded cores; the check's --tiny budget
def test_the_tiny_check_runs_every_part_and_writes_its_results(tmp_path):
    out = tmp_path / "gpu"
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--tiny",
                           "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr
    assert f"results in {out}" in done.stdout and "9 of 9 checks passed, 0 skipped" in done.stdout
    checks = list(csv.DictReader((out / "checks.csv").open()))
    assert [c["part"] for c in checks] == [gpu_check.PARTS[0]] + [gpu_check.PARTS[1]] * 3 + gpu_check.PARTS[2:]
    assert [c["check"] for c in checks[1:4]] == [
        "async hook = sync hook, bit for bit", "non-compressing levels = plain DDP",
        "Top-K replicas identical after 2 steps"]
    assert all(c["status"] == "ok" for c in checks), checks
    assert "3 ranks" in checks[3]["detail"] and "metrics equal: True" in checks[-1]["detail"]
    steps = list(csv.DictReader((out / "steps.csv").open()))
    assert {(r["layout"], r["config"]) for r in steps} == {
        (layout, name) for layout in gpu_parts.LAYOUTS for name in gpu_parts.STEP_CONFIGS}
    assert all(float(r["median_ms"]) > 0 for r in steps)
    models = list(csv.DictReader((out / "models.csv").open()))
    assert {(r["model"], r["layout"]) for r in models} == {
        (m, layout) for m in gpu_parts.CIFAR_MODELS for layout in gpu_parts.LAYOUTS}
    pipelines = list(csv.DictReader((out / "pipeline.csv").open()))
    assert [r["pipeline"] for r in pipelines] == ["pil", "device"]
    assert all(float(r["images_per_s"]) > 0 for r in models + pipelines)
    summary = (out / "summary.md").read_text()
    assert "| stop after epoch 0 and resume | stop after epoch 0 and resume | ok |" in summary
    assert "gradients torch.float32" in summary and "| resnet18 | bf16 |" in summary


@pytest.mark.slow
def test_a_hung_part_is_stopped_within_its_limit_and_named(tmp_path):
    env = {**os.environ, "ACCORDION_GPU_CHECK_HANG": "models"}
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--tiny", "--only",
                           "models", "pipeline", "--budget-s", "20", "--out", str(tmp_path)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    assert done.returncode == 1
    # stopped at the 20 s budget (not at the part's own 120 s limit): the check's own clock,
    # which starts after its imports (a minute of this test's time under a load of 13)
    stopped = re.search(r"gpu-check: DID NOT FINISH: models \(stopped after (\d+) s", done.stdout)
    assert stopped and int(stopped.group(1)) <= 20, done.stdout
    # the budget spent, the next part is not started, and says so
    assert "gpu-check: DID NOT FINISH: pipeline (the 20 s budget ran out)" in done.stdout
    total = re.search(r", in (\d+) s; results in ", done.stdout)
    assert total and int(total.group(1)) < 20 + 30, (f"the check took {took:.0f} s", done.stdout)
    rows = list(csv.DictReader((tmp_path / "checks.csv").open()))
    assert [(r["part"], r["status"]) for r in rows] == [("models", "timeout"),
                                                        ("pipeline", "not started")]


@pytest.mark.slow
def test_without_hydra_the_trainer_parts_are_skipped_with_the_reason_and_the_rest_runs(tmp_path):
    (tmp_path / "blocked").mkdir()
    env = _blocker(tmp_path / "blocked")
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "--tiny", "--only",
                           "pipeline", "trainer topk accordion", "--out", str(tmp_path / "out")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 of 2 checks passed, 1 skipped" in done.stdout
    assert ("gpu-check: skipped trainer topk accordion: hydra is not installed (the trainer's "
            "entry point needs Hydra and omegaconf; docs/gpu.md installs them offline)") in done.stdout


def test_the_wheelhouse_asks_for_every_non_torch_dependency_and_the_build_backend():
    wheelhouse = load_script("wheelhouse")
    everything = wheelhouse.requirements(set())
    names = {wheelhouse._name(r) for r in everything}
    assert not names & {"torch", "torchvision"}
    assert {"hydra-core", "omegaconf", "wandb", "setuptools", "pandas"} <= names  # setuptools>=70.1
    # builds wheels alone: the build backend is setuptools only (pyproject.toml's build-system)
    default = {wheelhouse._name(r) for r in wheelhouse.requirements({"numpy", "pandas",
                                                                      "matplotlib", "pillow"})}
    assert names - default == {"numpy", "pandas", "matplotlib", "pillow"}
    assert not any(wheelhouse._name(pin) in ("torch", "torchvision")
                   for pin in wheelhouse.constraints())
    assert "--only-binary=:all:" in wheelhouse._target("3.12") and "cp312" in wheelhouse._target("3.12")
