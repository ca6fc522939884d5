"""What the committed studies must hold, read from their run directories (results/runs).

Figure 2 (b) at scale=cpu_long asks whether *where* rank 1 is applied matters more than *how
much*: its two arms must send the same floats, and the inside arm must run rank 1 in exactly
the epochs the detector held critical in the same seed's rank-2 run (analysis/regime_plan.py).
One test id per committed seed; none until the study has committed a pair.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from accordion_repro.analysis.regime_plan import (_random_pick, held_critical, lr_phases,
                                                  plan_from_run, quiet_epochs, random_seed_text)
from conftest import read_metrics

STUDY = Path(__file__).resolve().parents[1] / "results" / "runs" / "cpu_long"
INSIDE, OUTSIDE = "fig2/resnet18_high_inside", "fig2/resnet18_high_outside"
CONTROLS = {"earliest": "fig2/resnet18_high_earliest", "random": "fig2/resnet18_high_random"}
REFERENCE = "table1/resnet18_powersgd_static_low"


def _committed_seeds() -> list[str]:
    return sorted(path.parent.name for path in STUDY.glob(f"{INSIDE}/seed*/summary.json"))


def _rank1_epochs(run_dir: Path) -> list[int]:
    return [m["epoch"] for m in read_metrics(run_dir) if set(m["layer_levels"]) == {1}]


@pytest.mark.parametrize("seed", _committed_seeds())
def test_figure2b_arms_send_equal_floats_and_inside_is_the_detected_critical_epochs(seed):
    inside, outside, reference = (STUDY / name / seed for name in (INSIDE, OUTSIDE, REFERENCE))
    assert (outside / "summary.json").exists(), f"the outside arm of {seed} is not committed"
    floats = {arm: sum(m["floats_sent"] for m in read_metrics(arm)) for arm in (inside, outside)}
    assert floats[inside] == floats[outside]
    plan = plan_from_run(reference)
    assert _rank1_epochs(inside) == plan.critical_epochs
    assert _rank1_epochs(outside) == plan.outside_epochs
    assert not set(plan.critical_epochs) & set(plan.outside_epochs)
    committed = json.loads((STUDY / "fig2" / f"plan_{seed}.json").read_text())
    assert committed["critical_epochs"] == plan.critical_epochs
    for arm, run_dir in (("inside", inside), ("outside", outside)):
        config = yaml.safe_load((run_dir / "resolved.yaml").read_text())
        assert config["schedule"]["windows"] == committed[f"{arm}_windows"]
        assert config["seed"] == int(seed.removeprefix("seed"))


def _planned_seeds() -> list[str]:
    return sorted(path.stem.removeprefix("plan_") for path in (STUDY / "fig2").glob("plan_seed*.json"))


@pytest.mark.parametrize("seed", _planned_seeds())
def test_each_plans_control_arms_take_as_many_non_critical_epochs_per_lr_phase(seed):
    """The earliest and random arms' epochs (issue 36): none held critical by the reference run,
    as many per LR phase as the inside arm's, and the random draw redone from the committed
    seed gives the committed epochs."""
    reference = STUDY / REFERENCE / seed
    records = read_metrics(reference)
    held, phases = held_critical(records), lr_phases(records)
    committed = json.loads((STUDY / "fig2" / f"plan_{seed}.json").read_text())
    assert committed == json.loads(json.dumps(_plan_record(plan_from_run(reference))))
    inside = committed["critical_epochs"]
    for arm in ("outside", "earliest", "random"):
        epochs = committed[f"{arm}_epochs"]
        assert not any(held[e] for e in epochs), f"{arm} arm has a critical epoch"
        assert sorted(phases[e] for e in epochs) == sorted(phases[e] for e in inside)
    number = int(seed.removeprefix("seed"))
    assert committed["random_seed"] == random_seed_text(number)
    assert committed["random_epochs"] == quiet_epochs(held, phases, _random_pick(number))


def _plan_record(plan) -> dict:
    from dataclasses import asdict
    record = asdict(plan)
    record["reference"] = Path(plan.reference).relative_to(STUDY).as_posix()
    return record


def _committed_controls() -> list[tuple[str, str]]:
    return sorted((arm, path.parent.name) for arm, name in CONTROLS.items()
                  for path in STUDY.glob(f"{name}/seed*/summary.json"))


@pytest.mark.parametrize("arm, seed", _committed_controls())
def test_a_committed_control_arm_ran_its_plans_epochs_at_the_inside_arms_floats(arm, seed):
    run_dir, inside = STUDY / CONTROLS[arm] / seed, STUDY / INSIDE / seed
    committed = json.loads((STUDY / "fig2" / f"plan_{seed}.json").read_text())
    assert _rank1_epochs(run_dir) == committed[f"{arm}_epochs"]
    floats = [sum(m["floats_sent"] for m in read_metrics(d)) for d in (run_dir, inside)]
    assert floats[0] == floats[1]
    config = yaml.safe_load((run_dir / "resolved.yaml").read_text())
    assert config["schedule"]["windows"] == committed[f"{arm}_windows"]
