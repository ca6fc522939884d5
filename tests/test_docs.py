"""The docs say what the code does: commands that exist, paths as they are, sizes as configured."""

from __future__ import annotations

import re

from conftest import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


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
    readme = (REPO / "README.md").read_text()
    return readme.split("## Results at CPU scale", 1)[1].split("\n## ", 1)[0]


def _committed_numbers() -> set[str]:
    """Every accuracy of every epoch of the committed studies' finished runs (every scale), their
    floats totals (millions, one decimal) and every number in the tables `make figures` built."""
    import json

    known = set()
    for summary_path in (REPO / "results" / "runs").glob("*/*/*/seed*/summary.json"):
        summary = json.loads(summary_path.read_text())
        if summary.get("status") != "completed":
            continue
        known.add(f"{summary['total_floats_sent'] / 1e6:.1f}")
        for line in (summary_path.parent / "metrics.jsonl").read_text().splitlines():
            record = json.loads(line)
            if "test_acc" in record:
                known.add(f"{record['test_acc']:.2f}")
    for table in (REPO / "results" / "tables").glob("*.md"):
        known.update(re.findall(r"\d[\d,]*\.\d+", table.read_text()))
    return {number.replace(",", "") for number in known}


def test_every_result_in_the_readme_comes_from_a_committed_run_or_table():
    """The README's results section may not carry a number typed in by hand: each accuracy
    (two decimals) and each number in its tables is an epoch's accuracy or a floats total of
    a finished run under results/runs/<scale>, or a number of results/tables/*.md."""
    section, known = _results_section(), _committed_numbers()
    accuracies = re.findall(r"(?<![\d.,])\d{2}\.\d{2}(?!\d)", section)
    cells = [number.replace(",", "") for line in section.splitlines()
             if line.startswith("|") and not re.match(r"\|\s*-", line)
             for number in re.findall(r"(?<![\w.])\d[\d,]*\.\d+", line)]
    assert len(accuracies) > 20 and len(cells) > 20
    assert sorted(set(accuracies) - known) == []
    assert sorted(set(cells) - known) == []


def test_committed_tables_are_what_make_figures_builds_from_the_committed_runs(tmp_path):
    """`make figures` (RUNS=results/runs, NET=10gbit) rebuilds every committed table byte for
    byte: a run added or changed without rebuilding them, or a table edited by hand, fails."""
    import warnings

    from accordion_repro.analysis import build_all

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unfinished runs and missing cells are expected here
        written = build_all(REPO / "results" / "runs", tmp_path, net="10gbit", figures=False)
    built = sorted(path for paths in written.values() for path in paths)
    assert len(built) == 18
    for path in built:
        committed = REPO / "results" / "tables" / path.name
        assert path.read_bytes() == committed.read_bytes(), f"rebuild differs: {committed}"
