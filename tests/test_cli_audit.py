"""benchmarks/cli_audit.py, the rerunnable CLI audit (issue 56 item 5): its battery is
well-formed, each input it accepts by design quotes a line of docs/, and its cases run through
the real harness to their expected outcome."""

from __future__ import annotations

import pytest

from accordion_repro.benchmarks import cli_audit
from conftest import REPO

DOC_LINES = {line for path in (REPO / "docs").rglob("*.md")
             for line in path.read_text().splitlines()}


def test_case_ids_are_unique_and_the_battery_has_its_size():
    ids = [case.id for case in cli_audit.ALL_CASES]
    assert len(ids) == len(set(ids))
    assert len(cli_audit.BAD_INPUTS) >= 150 and len(cli_audit.KILLS) >= 30
    assert {c.expected for c in cli_audit.BAD_INPUTS} == {"refused", "accepted by design"}
    assert all(c.key for c in cli_audit.BAD_INPUTS if not c.doc)
    assert all(c.config in cli_audit.CONFIGS for c in cli_audit.KILLS)


def test_every_input_accepted_by_design_quotes_a_line_of_the_docs():
    accepted = [c for c in cli_audit.BAD_INPUTS if c.doc]
    assert accepted
    for case in accepted:
        assert any(case.doc in line for line in DOC_LINES), case.id


def test_an_override_replaces_the_base_value_of_its_key_and_a_group_drops_its_options():
    merged = cli_audit._merge(cli_audit.BASE, ["dataset=npz", "trainer.epochs=0"])
    assert "trainer.epochs=0" in merged and "trainer.epochs=1" not in merged
    assert "dataset=npz" in merged and not any(o.startswith("dataset.") for o in merged)


@pytest.mark.slow
@pytest.mark.distributed
def test_two_bad_inputs_and_a_kill_get_their_expected_outcome(tmp_path):
    cases = {c.id: c for c in cli_audit.ALL_CASES}
    rows = cli_audit.run_cases([cases["trainer-epoch-plus"], cases["npz-missing"],
                                cases["ddp-accordion-launcher-sigkill-mid"]], tmp_path,
                               echo=lambda *a, **k: None)
    assert [r["outcome"] for r in rows] == ["refused cleanly", "refused cleanly",
                                            "resumed identically"], rows
    assert cli_audit.totals(rows).startswith("bad inputs: 2 refused cleanly, 0 accepted by design, 0 FAILED; kills: 1 resumed identically")
