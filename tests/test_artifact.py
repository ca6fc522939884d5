"""The artifact's claims (issue 60, item 4): docs/claims.yaml, checked by `make check-claims`
(accordion_repro/analysis/claims.py), listed in docs/artifact.md."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from accordion_repro.analysis.claims import load_claims, markdown
from conftest import REPO

CLAIMS = REPO / "docs" / "claims.yaml"


def _check(*args: str, claims: Path = CLAIMS) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accordion_repro.analysis.claims",
                           "--claims", str(claims), *args], cwd=REPO, capture_output=True,
                          text=True, timeout=600)


def _lines(out: str) -> dict[str, str]:
    return {line.split()[0]: line for line in out.splitlines() if re.match(r"C\d+ ", line)}


@pytest.mark.slow
def test_every_claim_holds_on_the_committed_runs():
    done = _check()
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    lines = _lines(done.stdout)
    assert list(lines) == [c.id for c in load_claims()]
    assert all(line.split()[1] == "PASS" for line in lines.values()), done.stdout


@pytest.mark.slow
def test_a_changed_committed_accuracy_fails_its_claim_with_the_difference(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(REPO / "results" / "runs" / "cpu_long", runs / "cpu_long",
                    ignore=shutil.ignore_patterns("checkpoints", "wandb"))
    metrics = runs / "cpu_long/table1/resnet18_powersgd_static_low/seed42/metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    records[-1]["test_acc"] += 0.51  # one seed's final accuracy: the mean moves by 0.17
    metrics.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = _check("--runs", str(runs), "--only", "C1", "C2")
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    lines = _lines(done.stdout)
    assert lines["C1"].split()[1] == "PASS"  # dense: another cell, untouched
    assert lines["C2"].split()[1] == "FAIL"
    assert "mean 85.10 vs 85.2733 (diff 0.1733 > 0.005)" in lines["C2"], lines["C2"]
    assert done.stdout.splitlines()[-1] == "1 of 2 claims hold; 1 FAIL"


def test_a_stated_number_the_benchmark_did_not_measure_fails(tmp_path):
    claims = yaml.safe_load(CLAIMS.read_text())
    [ratio] = [c for c in claims if c.get("select") == {"config": "ours powersgd r2"}]
    ratio["values"]["ours_over_theirs"] = "0.29"
    changed = tmp_path / "claims.yaml"
    changed.write_text(yaml.safe_dump(claims, allow_unicode=True))
    done = _check("--only", ratio["id"], claims=changed)
    assert done.returncode == 1
    assert _lines(done.stdout)[ratio["id"]].split(None, 2)[1:] == [
        "FAIL", "ours_over_theirs 0.29 vs 0.1869 (diff 0.1031 > 0.005)"]


MALFORMED = {
    "unknown_key": (lambda c: c[0].update(expect="1"), "claim C1: unknown keys ['expect']"),
    "unknown_check": (lambda c: c[0].update(check="eyeball"), "check must be one of runs, bench, tests"),
    "numbering": (lambda c: c[1].update(id="C7"), "must be numbered C1..C"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_claims_file_is_refused_in_one_line(tmp_path, case):
    change, message = MALFORMED[case]
    claims = yaml.safe_load(CLAIMS.read_text())
    change(claims)
    changed = tmp_path / "claims.yaml"
    changed.write_text(yaml.safe_dump(claims, allow_unicode=True))
    with pytest.raises(ValueError, match=re.escape(message)):
        load_claims(changed)


def test_an_unknown_claim_id_is_refused_before_any_check():
    done = _check("--only", "C99")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == f"error: --only: no claim C99 in {CLAIMS}"


def test_artifact_md_lists_exactly_the_claims_the_checker_checks():
    text = (REPO / "docs" / "artifact.md").read_text()
    assert markdown(load_claims()) in text


def _run_with(tmp_path: Path, name: str, change) -> Path:
    """A copy of a committed run's metrics.jsonl with `change` applied to its records."""
    source = REPO / "results/runs/cpu_long/table1/resnet18_powersgd_static_low/seed42/metrics.jsonl"
    records = [json.loads(line) for line in source.read_text().splitlines()]
    change(records)
    (tmp_path / name).mkdir()
    (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path / name


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accordion_repro.compare_runs", str(a), str(b)],
                          capture_output=True, text=True, timeout=120)


def test_compare_runs_ignores_wall_clock_times_only(tmp_path):
    same = _run_with(tmp_path, "a", lambda r: None)
    slower = _run_with(tmp_path, "b", lambda r: r[3].update(epoch_time_s=r[3]["epoch_time_s"] * 2))
    done = _compare(same, slower)
    assert done.returncode == 0 and done.stdout.startswith("identical metrics over 30 epochs")
    off = _run_with(tmp_path, "c", lambda r: r[7].update(test_acc=r[7]["test_acc"] + 0.01))
    done = _compare(same, off)
    assert done.returncode == 1 and done.stdout.startswith("different: epoch 7: test_acc is ")
    short = _run_with(tmp_path, "d", lambda r: r.pop())
    assert "logged 30 epochs" in _compare(same, short).stdout


@pytest.mark.skipif(not Path("/usr/bin/time").exists(), reason="GNU time is not installed")
def test_the_resources_of_a_command_are_measured_by_gnu_time(tmp_path):
    """A command that holds 200 MiB and burns CPU for a moment: the row says so."""
    from accordion_repro.benchmarks import artifact_resources

    out = tmp_path / "resources.csv"
    work = (f"{sys.executable} -c \"import time; b = bytearray(200 * 2**20); t = time.process_time(); "
            f"exec('while time.process_time() - t < 0.3: pass')\"")
    assert artifact_resources.main(["--commands", work, f"{sys.executable} -c 'raise SystemExit(3)'",
                                    "--out", str(out)]) == 1  # the second command failed
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [int(r["exit_status"]) for r in rows] == [0, 3]
    first = rows[0]
    assert float(first["max_rss_mib"]) >= 200 and float(first["cpu_s"]) >= 0.3
    assert float(first["wall_s"]) >= 0.3 and Path(first["report"]).name.endswith(".txt")
    assert (tmp_path / "resources" / Path(first["report"]).name).is_file()
