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

from accordion_repro.analysis.regime_plan import plan_from_run
from conftest import read_metrics

STUDY = Path(__file__).resolve().parents[1] / "results" / "runs" / "cpu_long"
INSIDE, OUTSIDE = "fig2/resnet18_high_inside", "fig2/resnet18_high_outside"
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
