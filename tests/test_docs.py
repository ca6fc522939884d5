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
            assert first in ("", "<scale>", "paper", "cpu", "cpu_full", "**"), (doc.name, path)


def test_makefile_demo_comment_matches_its_epochs():
    text = (REPO / "Makefile").read_text()
    epochs = re.search(r"trainer\.epochs=(\d+)", text.split("demo:")[1]).group(1)
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
