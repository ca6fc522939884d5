"""scripts/gpu_check.py: one line without a GPU; the whole check, tiny, on the CPU."""

from __future__ import annotations

import csv
import subprocess
import sys

import pytest
import torch

from conftest import REPO, load_script


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the check would run")
def test_without_a_gpu_the_check_says_so_in_one_line_and_exits_0():
    done = subprocess.run([sys.executable, "scripts/gpu_check.py"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == ""
    assert done.stdout.splitlines() == ["gpu-check: no CUDA GPU found (torch.cuda.is_available() "
                                        "is False); nothing run"]


@pytest.mark.slow
@pytest.mark.distributed
def test_the_tiny_check_runs_every_part_and_writes_its_results(tmp_path):
    out = tmp_path / "gpu"
    done = subprocess.run([sys.executable, "scripts/gpu_check.py", "--tiny", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f"results in {out}") and "4 of 4 checks passed" in done.stdout
    checks = list(csv.DictReader((out / "checks.csv").open()))
    assert [c["check"] for c in checks] == ["trainer powersgd accordion", "trainer topk accordion",
                                             "stop after epoch 0 and resume",
                                             "DDP hook under bf16 and step times"]
    assert all(c["ok"] == "True" for c in checks)
    assert "metrics equal: True" in checks[2]["detail"]
    steps = list(csv.DictReader((out / "steps.csv").open()))
    script = load_script("gpu_check")
    assert {(r["layout"], r["config"]) for r in steps} == {
        (layout, name) for layout in script.LAYOUTS for name in script.STEP_CONFIGS}
    assert all(float(r["median_ms"]) > 0 for r in steps)
    summary = (out / "summary.md").read_text()
    assert "| stop after epoch 0 and resume | yes |" in summary and "gradients torch.float32" in summary
