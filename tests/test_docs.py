"""The docs say what the code does: commands that exist, paths as they are, sizes as configured."""

from __future__ import annotations

import bisect
import re

import pytest

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_no_doc_names_a_command_that_does_not_exist():
    for doc in DOCS:
        assert "$(presets" not in doc.read_text(), doc


def test_run_directory_paths_in_the_docs_carry_the_scale():
    for doc in DOCS:
        for path in re.findall(r"results/runs/[\w<>./=,-]+", doc.read_text()):
            path = path.rstrip(",.")
            first = path.split("/")[2] if path.count("/") >= 2 else ""
            scales = {p.stem for p in (REPO / "conf" / "scale").glob("*.yaml")}
            assert first in {"", "<scale>", "**", *scales}, (doc.name, path)


def test_makefile_demo_comment_matches_its_epochs():
    text = (REPO / "Makefile").read_text()
    epochs = re.search(r"trainer\.epochs=(\d+)", text.split("DEMO_ARGS =")[1]).group(1)
    assert f"for {epochs} short epochs" in text


def test_every_declared_dependency_is_used():
    text = (REPO / "pyproject.toml").read_text()
    block = text.split("dependencies = [")[1].split("]")[0]
    deps = [re.split(r"[<>=\[ ]", d.strip().strip('",'))[0] for d in block.splitlines() if d.strip()]
    imports = {"hydra-core": "hydra", "hydra-submitit-launcher": "hydra_plugins", "pillow": "PIL",
               "pyyaml": "yaml"}
    sources = "\n".join(p.read_text() for p in (REPO / "accordion_repro").rglob("*.py"))
    sources += "\n".join(p.read_text() for p in (REPO / "conf").rglob("*.yaml"))
    for dep in deps:
        name = imports.get(dep, dep)
        if dep in ("hydra-submitit-launcher", "submitit"):  # loaded by hydra/launcher=slurm
            assert "submitit_slurm" in sources or "submitit" in sources
            continue
        assert re.search(rf"\b(import|from) {name}\b", sources), f"{dep} is declared but never imported"


def _results_section() -> str:
    """The README's headline result and every study page of docs/results/."""
    readme = (REPO / "README.md").read_text()
    headline = readme.split("## The headline result", 1)[1].split("\n## ", 1)[0]
    studies = [path.read_text() for path in sorted((REPO / "docs" / "results").glob("*.md"))]
    return "\n\n".join([headline, *studies])


def _committed_numbers() -> set[str]:
    """Every accuracy of every epoch of the committed studies' finished runs (every scale), their
    floats totals (millions, one decimal), the plateau figures of their LR phases (the trend and
    range over each phase's last third, analysis/plateau.py), every number in the tables
    `make figures` built and every number of the committed benchmark CSVs."""
    import json

    from accordion_repro.analysis.plateau import phase_ends

    known = set()
    for summary_path in (REPO / "results" / "runs").glob("*/*/*/seed*/summary.json"):
        summary = json.loads(summary_path.read_text())
        if summary.get("status") != "completed":
            continue
        known.add(f"{summary['total_floats_sent'] / 1e6:.1f}")
        records = [json.loads(line) for line in
                   (summary_path.parent / "metrics.jsonl").read_text().splitlines()]
        known.update(f"{record['test_acc']:.2f}" for record in records if "test_acc" in record)
        if all(isinstance(record.get("test_acc"), float) for record in records):
            for end in phase_ends(records):
                known.update((f"{abs(end.trend):.2f}", f"{end.spread:.2f}"))
    for table in (REPO / "results" / "tables").glob("*.md"):
        known.update(re.findall(r"\d[\d,]*\.\d+", table.read_text()))
    for measured in (REPO / "results" / "bench").glob("*.csv"):  # e.g. the study's pilots
        known.update(re.findall(r"\d+\.\d+", measured.read_text()))  # commas split fields
    return {number.replace(",", "") for number in known}


def test_every_result_in_the_readme_comes_from_a_committed_run_or_table():
    """The README's results section may not carry a number typed in by hand: each accuracy
    (two decimals) and each number in its tables is an epoch's accuracy or a floats total of
    a finished run under results/runs/<scale>, or a number of results/tables/*.md or of
    results/bench/*.csv."""
    section, known = _results_section(), _committed_numbers()
    accuracies = re.findall(r"(?<![\d.,])\d{2}\.\d{2}(?!\d)", section)
    cells = [number.replace(",", "") for line in section.splitlines()
             if line.startswith("|") and not re.match(r"\|\s*-", line)
             for number in re.findall(r"(?<![\w.])\d[\d,]*\.\d+", line)]
    assert len(accuracies) > 20 and len(cells) > 20
    assert sorted(set(accuracies) - known) == []
    assert sorted(set(cells) - known) == []


DERIVED = re.compile(r"(?<![\w.])(\d+\.\d+)(?:[ -]points?\b| ?x\b)")  # "0.70 point", "1.8x"


def _any_within(sorted_values: list[float], low: float, high: float) -> bool:
    i = bisect.bisect_left(sorted_values, low)
    return i < len(sorted_values) and sorted_values[i] <= high


def _unexplained_derived(text: str, known: set[str]) -> tuple[list[str], int]:
    """(the derived numbers of `text` that are not explained, how many there are): a difference
    ("0.70 point") or ratio ("1.8x") is explained when it is itself a committed number, or the
    difference or ratio, rounded to the decimals shown, of two committed numbers stated in the
    same paragraph (so that a reader can redo it)."""
    unexplained, count = [], 0
    for paragraph in re.split(r"\n\s*\n", text):
        stated = sorted(float(n) for n in (m.replace(",", "") for m in
                                           re.findall(r"(?<![\w.])\d[\d,]*\.\d+", paragraph))
                        if n in known)
        for value in DERIVED.findall(paragraph):
            count += 1
            if value in known:
                continue
            half = 0.5 * 10.0 ** -len(value.split(".")[1]) + 1e-9
            target = float(value)
            if not any(_any_within(stated, b + target - half, b + target + half)
                       or (b > 0 and _any_within(stated, b * (target - half), b * (target + half)))
                       for b in stated):
                unexplained.append(value)
    return unexplained, count


def _central_claim_section() -> str:
    return (REPO / "docs" / "results" / "cpu_long.md").read_text()


@pytest.mark.parametrize("text, unexplained", [
    ("85.79 % against 85.09 %: 0.70 point below.", []),
    ("85.79 % against 85.09 %: 0.80 point below.", ["0.80"]),
    ("45.00 % against 90.00 %: 2.0x, and 2.1x.", ["2.1"]),
], ids=["difference", "a-wrong-difference", "ratio-and-a-wrong-ratio"])
def test_a_derived_number_must_be_redone_from_the_numbers_beside_it(text, unexplained):
    assert _unexplained_derived(text, {"85.79", "85.09", "45.00", "90.00"})[0] == unexplained


def test_every_derived_number_of_the_central_claim_section_is_redone_from_committed_numbers():
    """`scale=cpu_long`'s section: each difference ("0.4 point") and ratio ("1.8x") is a
    committed number or is computed from two committed numbers it states beside it."""
    unexplained, count = _unexplained_derived(_central_claim_section(), _committed_numbers())
    assert count >= 4 and unexplained == []


@pytest.mark.slow
def test_committed_tables_and_figures_are_what_make_figures_builds_from_the_committed_runs(
        tmp_path):
    """`make figures` (RUNS=results/runs, NET=10gbit) rebuilds every committed table and figure,
    PNG and PDF, byte for byte: a run added or changed without rebuilding them, a table edited
    by hand, or a PDF drawn with another copy of its font (figures._bundled_fonts_only) fails."""
    import warnings

    from accordion_repro.analysis import build_all

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unfinished runs and missing cells are expected here
        written = build_all(REPO / "results" / "runs", tmp_path, net="10gbit")
    built = sorted(path for paths in written.values() for path in paths)
    tables = [path for path in built if path.parent.name == "tables"]
    assert len(tables) == 28  # tables 1-6 (md, tex, csv); fig2, table1, table3 _paired,
    # successors and precision (md, csv)
    committed = sorted((REPO / "results" / "figures").iterdir())
    assert [p.name for p in built if p.parent.name == "figures"] == [p.name for p in committed]
    for path in built:
        mine = REPO / "results" / path.parent.name / path.name
        assert path.read_bytes() == mine.read_bytes(), f"rebuild differs: {mine}"


def _guarantees(text: str) -> list[str]:
    return re.findall(r"^- \*\*(.+?)\*\*", text, re.MULTILINE)


def test_the_run_directory_guarantees_name_exactly_the_tests_that_check_them():
    """Each guarantee of docs/run_directory.md names its tests; every test of
    tests/test_run_integrity.py is named there, and every name there is such a test. The
    README lists the same guarantees, in the same order."""
    page = (REPO / "docs" / "run_directory.md").read_text()
    named = set(re.findall(r"`(test_\w+)`", page))
    tests = set(re.findall(r"^def (test_\w+)\(", (REPO / "tests" / "test_run_integrity.py").read_text(),
                           re.MULTILINE))
    assert named - tests == set(), "named in docs/run_directory.md but no test there"
    assert tests - named == set(), "tested but not listed in docs/run_directory.md's guarantees"
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### The run directory"):readme.index("## Reproduce the paper")]
    assert _guarantees(section) == _guarantees(page) and len(_guarantees(page)) >= 10


def test_the_readme_is_a_front_door():
    """Issue 39: the README stays short; studies and reports live under docs/."""
    assert len((REPO / "README.md").read_text().splitlines()) <= 300


def test_make_help_lists_every_target_and_phony_names_only_targets():
    """`make help` is built from the `## ` comments, so a target without one is missing there."""
    import subprocess

    text = (REPO / "Makefile").read_text()
    targets = re.findall(r"^([a-z][a-z-]*):(?!=)", text, flags=re.M)
    phony = re.search(r"^\.PHONY:(.*)$", text, flags=re.M).group(1).split()
    assert sorted(phony) == sorted(targets)
    listed = subprocess.run(["make", "-s", "-C", str(REPO), "help"], capture_output=True, text=True,
                            check=True).stdout.splitlines()
    assert [line.split()[0] for line in listed] == targets
    assert all(len(line.split(None, 1)) == 2 for line in listed)
