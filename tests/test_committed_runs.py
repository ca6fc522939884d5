"""What the committed studies must hold, read from their run directories (results/runs).

Figure 2 (b) at scale=cpu_long and scale=cpu_fp32 asks whether *where* rank 1 is applied matters more than *how
much*: its two arms must send the same floats, and the inside arm must run rank 1 in exactly
the epochs the detector held critical in the same seed's rank-2 run (analysis/regime_plan.py).
One test id per study and committed seed; none until a study has committed a pair.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from accordion_repro.analysis.regime_plan import (_random_pick, held_critical, lr_phases,
                                                  plan_from_run, quiet_epochs, random_seed_text)
from conftest import REPO, read_metrics

RUNS = Path(__file__).resolve().parents[1] / "results" / "runs"
STUDIES = ("cpu_long", "cpu_fp32")  # the studies whose Figure 2 (b) arms follow a plan
INSIDE, OUTSIDE = "fig2/resnet18_high_inside", "fig2/resnet18_high_outside"
CONTROLS = {"earliest": "fig2/resnet18_high_earliest", "random": "fig2/resnet18_high_random"}
REFERENCE = "table1/resnet18_powersgd_static_low"


def _committed_seeds() -> list[tuple[str, str]]:
    return sorted((study, path.parent.name) for study in STUDIES
                  for path in (RUNS / study).glob(f"{INSIDE}/seed*/summary.json")
                  if json.loads(path.read_text()).get("status") == "completed")


def _rank1_epochs(run_dir: Path) -> list[int]:
    return [m["epoch"] for m in read_metrics(run_dir) if set(m["layer_levels"]) == {1}]


@pytest.mark.parametrize("study, seed", _committed_seeds())
def test_figure2b_arms_send_equal_floats_and_inside_is_the_detected_critical_epochs(study, seed):
    study_dir = RUNS / study
    inside, outside, reference = (study_dir / name / seed for name in (INSIDE, OUTSIDE, REFERENCE))
    # the queue runs arm by arm (every seed's inside arm, then the control arms): the outside
    # arm is compared once it is committed
    arms = [("inside", inside)] + ([("outside", outside)]
                                   if (outside / "summary.json").exists() else [])
    plan = plan_from_run(reference)
    assert _rank1_epochs(inside) == plan.critical_epochs
    assert not set(plan.critical_epochs) & set(plan.outside_epochs)
    if len(arms) == 2:
        floats = {arm: sum(m["floats_sent"] for m in read_metrics(arm)) for arm in (inside, outside)}
        assert floats[inside] == floats[outside]
        assert _rank1_epochs(outside) == plan.outside_epochs
    committed = json.loads((study_dir / "fig2" / f"plan_{seed}.json").read_text())
    assert committed["critical_epochs"] == plan.critical_epochs
    for arm, run_dir in arms:
        config = yaml.safe_load((run_dir / "resolved.yaml").read_text())
        assert config["schedule"]["windows"] == committed[f"{arm}_windows"]
        assert config["seed"] == int(seed.removeprefix("seed"))


def _planned_seeds() -> list[tuple[str, str]]:
    return sorted((study, path.stem.removeprefix("plan_")) for study in STUDIES
                  for path in (RUNS / study / "fig2").glob("plan_seed*.json"))


@pytest.mark.parametrize("study, seed", _planned_seeds())
def test_each_plans_control_arms_take_as_many_non_critical_epochs_per_lr_phase(study, seed):
    """The earliest and random arms' epochs (issue 36): none held critical by the reference run,
    as many per LR phase as the inside arm's, and the random draw redone from the committed
    seed gives the committed epochs."""
    study_dir = RUNS / study
    reference = study_dir / REFERENCE / seed
    records = read_metrics(reference)
    held, phases = held_critical(records), lr_phases(records)
    committed = json.loads((study_dir / "fig2" / f"plan_{seed}.json").read_text())
    assert committed == json.loads(json.dumps(_plan_record(plan_from_run(reference), study_dir)))
    inside = committed["critical_epochs"]
    for arm in ("outside", "earliest", "random"):
        epochs = committed[f"{arm}_epochs"]
        assert not any(held[e] for e in epochs), f"{arm} arm has a critical epoch"
        assert sorted(phases[e] for e in epochs) == sorted(phases[e] for e in inside)
    number = int(seed.removeprefix("seed"))
    assert committed["random_seed"] == random_seed_text(number)
    assert committed["random_epochs"] == quiet_epochs(held, phases, _random_pick(number))


def _plan_record(plan, study_dir: Path) -> dict:
    from dataclasses import asdict
    record = asdict(plan)
    record["reference"] = Path(plan.reference).relative_to(study_dir).as_posix()
    return record


def _committed_controls() -> list[tuple[str, str, str]]:
    return sorted((study, arm, path.parent.name) for study in STUDIES
                  for arm, name in CONTROLS.items()
                  for path in (RUNS / study).glob(f"{name}/seed*/summary.json"))


@pytest.mark.parametrize("study, arm, seed", _committed_controls())
def test_a_committed_control_arm_ran_its_plans_epochs_at_the_inside_arms_floats(study, arm, seed):
    study_dir = RUNS / study
    run_dir, inside = study_dir / CONTROLS[arm] / seed, study_dir / INSIDE / seed
    committed = json.loads((study_dir / "fig2" / f"plan_{seed}.json").read_text())
    assert _rank1_epochs(run_dir) == committed[f"{arm}_epochs"]
    floats = [sum(m["floats_sent"] for m in read_metrics(d)) for d in (run_dir, inside)]
    assert floats[0] == floats[1]
    config = yaml.safe_load((run_dir / "resolved.yaml").read_text())
    assert config["schedule"]["windows"] == committed[f"{arm}_windows"]


# ---- results/tables/fig2_paired.csv, recomputed from the runs' metrics.jsonl ------------------
# Student-t two-sided 95 % quantiles from a printed table (df 1..6), and the t density
# integrated numerically for p: independent of analysis/stats.py's closed forms.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447}


def _two_sided_p(t: float, df: int) -> float:
    import math

    import numpy as np

    x = np.linspace(0.0, abs(t), 200_001)
    density = (math.gamma((df + 1) / 2) / (math.sqrt(df * math.pi) * math.gamma(df / 2))
               * (1 + x ** 2 / df) ** (-(df + 1) / 2))
    return float(1.0 - 2.0 * np.trapezoid(density, x))


def _paired_blocks() -> dict[tuple[str, str], dict]:
    import csv

    rows = csv.DictReader((RUNS.parent / "tables" / "fig2_paired.csv").open())
    blocks: dict[tuple[str, str], dict] = {}
    for row in rows:
        if row["kind"] == "run":
            continue
        entry = blocks.setdefault((row["scale"], row["name"]), {"seeds": {}})
        if row["kind"] == "difference":
            entry["seeds"][int(row["seed"])] = float(row["value"])
        else:
            entry[row["kind"]] = row["value"]
    return blocks


def _final_of(scale: str, label: str, seed: int) -> float:
    """A Figure 2 cell's final test accuracy for one seed, from its run's metrics.jsonl (the
    cell's own preset, else its twin's, as the build reads them)."""
    from accordion_repro.analysis.layout import FIGURES, TWINS

    cell = next(c for c in FIGURES["fig2"].cells if c.label == label)
    for preset in (cell.preset, TWINS.get(cell.preset)):
        run = RUNS / scale / str(preset) / f"seed{seed}"
        if (run / "summary.json").exists():
            return read_metrics(run)[-1]["test_acc"]
    raise AssertionError(f"no run of {label} seed {seed} at {scale}")


@pytest.mark.parametrize("scale, name", sorted(_paired_blocks()))
def test_a_committed_paired_row_is_what_its_runs_metrics_give(scale, name):
    """Each difference row of results/tables/fig2_paired.csv redone from metrics.jsonl: the
    per-seed differences, mean, sample std, 95 % t interval, paired-t p, k of n, and the
    "matches" reading (seed mean within the reference's mean ± 2 std, 3 seeds or more)."""
    import statistics

    row = _paired_blocks()[(scale, name)]
    first, second = name.split(" − ")
    seeds = sorted(row["seeds"])
    a = {s: _final_of(scale, first, s) for s in seeds}
    b = {s: _final_of(scale, second, s) for s in seeds}
    differences = [a[s] - b[s] for s in seeds]
    assert differences == pytest.approx([row["seeds"][s] for s in seeds], abs=1e-6)
    assert float(row["mean"]) == pytest.approx(statistics.fmean(differences), abs=1e-6)
    assert int(row["positive"]) == sum(d > 0 for d in differences) and int(row["n"]) == len(seeds)
    if len(seeds) >= 2:
        std = statistics.stdev(differences)
        half = T95[len(seeds) - 1] * std / len(seeds) ** 0.5
        assert float(row["std"]) == pytest.approx(std, abs=1e-6)
        assert float(row["ci95_low"]) == pytest.approx(statistics.fmean(differences) - half, abs=2e-3)
        assert float(row["ci95_high"]) == pytest.approx(statistics.fmean(differences) + half, abs=2e-3)
        t = statistics.fmean(differences) / (std / len(seeds) ** 0.5)
        assert float(row["p_paired_t"]) == pytest.approx(_two_sided_p(t, len(seeds) - 1), abs=1e-4)
    if len(seeds) >= 3:
        reference = list(b.values())
        within = abs(statistics.fmean(a.values()) - statistics.fmean(reference)) \
            <= 2 * statistics.stdev(reference)
        assert row["matches"] == ("yes" if within else "no")
    else:
        assert "matches" not in row


def test_the_committed_holm_column_adjusts_each_blocks_headline_p_values():
    """Holm's step-down over the headline rows of each block, redone from their raw p."""
    from accordion_repro.analysis.layout import FIGURES
    from accordion_repro.analysis.paired import HEADLINE

    labels = {cell.method: cell.label for cell in FIGURES["fig2"].cells}
    headline = {f"{labels[a]} − {labels[b]}" for a, b in HEADLINE}
    blocks = _paired_blocks()
    checked = 0
    for scale in sorted({scale for scale, _ in blocks}):
        rows = {name: row for (s, name), row in blocks.items() if s == scale
                and name in headline and "p_paired_t" in row}
        ordered = sorted(rows, key=lambda name: float(rows[name]["p_paired_t"]))
        running = 0.0
        for rank, name in enumerate(ordered):
            running = max(running, min(1.0, (len(ordered) - rank) * float(rows[name]["p_paired_t"])))
            assert float(rows[name]["p_holm"]) == pytest.approx(running, abs=1e-5)  # csv: 6 digits
            checked += 1
        assert all("p_holm" not in row for (s, name), row in blocks.items()
                   if s == scale and name not in headline)
    assert checked >= 4


def test_every_committed_run_directory_holds_a_finished_run():
    """A run directory is committed once its run has ended (the study runner's commit_run); one
    committed while it still ran is resumed by nobody on a clone and read by no table."""
    import subprocess

    listed = subprocess.run(["git", "ls-files", "results/runs"], cwd=REPO, capture_output=True,
                            text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    summaries = [REPO / p for p in listed.stdout.splitlines() if p.endswith("/summary.json")]
    assert len(summaries) > 50
    unfinished = [str(p.parent.relative_to(REPO)) for p in summaries
                  if json.loads(p.read_text())["status"] != "completed"]
    assert unfinished == []
