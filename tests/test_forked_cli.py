"""tests/harness/forked_cli.py, which test_run_integrity's `cli` runs on, against the CLI a user
starts: the same answers, so the guards tested through it are the CLI's."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, read_metrics
from test_run_integrity import TINY, cli, without_timing


@pytest.mark.slow
def test_the_forked_cli_answers_as_python_dash_m_does(tmp_path):
    """`cli` (harness/forked_cli.py) against `python -m accordion_repro.train`: the same refusal
    line and exit code; a finished run's same metrics and same printed lines (seconds aside)."""
    def real(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "accordion_repro.train", *TINY, *overrides,
                               f"hydra.run.dir={run_dir}"], cwd=REPO, capture_output=True,
                              text=True, timeout=240)

    refused = [run(tmp_path / "refused", "compressor.rank=0") for run in (cli, real)]
    assert [r.returncode for r in refused] == [2, 2]
    assert refused[0].stderr == refused[1].stderr and refused[0].stderr.startswith("error: ")
    runs = {name: run(tmp_path / name, "trainer.epochs=2") for name, run in
            (("forked", cli), ("real", real))}
    assert [r.returncode for r in runs.values()] == [0, 0], runs["real"].stderr
    assert (without_timing(read_metrics(tmp_path / "forked"))
            == without_timing(read_metrics(tmp_path / "real")))

    def printed(name: str) -> str:  # the clock (log stamps, seconds) and the directory aside
        text = runs[name].stdout.replace(str(tmp_path / name), "RUN")
        text = re.sub(r"^\[[\d-]+ [\d:,]+\]", "[T]", text, flags=re.M)
        return re.sub(r"\b\d+(\.\d+)?s\b", "Ts", text)

    assert printed("forked") == printed("real") and "done: test_acc" in printed("real")
