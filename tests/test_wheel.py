"""The wheel is the package a user installs (issue 60, item 1): a non-editable install runs the
suite from any directory, with the configs inside the package and no top-level `benchmarks`.

The wheel is built offline by the setuptools this venv holds (the `test` extra), installed
without its dependencies into a fresh venv by uv (the installer `make install` uses), and the
dependencies come from this venv's site-packages through a path file: a directory named in a
.pth file is put on sys.path, but the .pth files inside it are not read, so the checkout's
editable install (a .pth hook there) stays invisible and `accordion_repro` can only be the
wheel's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import REPO

SOURCES = ["accordion_repro", "benchmarks", "conf", "pyproject.toml", "README.md", "LICENSE"]
TWO_RANKS_TINY = ["model=resnet18", "compressor=powersgd", "schedule=accordion", "model.width=0.125",
                  "dataset=synthetic_cifar10", "dataset.train_size=64", "dataset.test_size=16",
                  "logger.wandb.mode=disabled", "trainer.progress=never", "trainer.batch_size=8",
                  "trainer.eval_batch_size=16", "trainer.max_steps_per_epoch=2",
                  "trainer.max_eval_steps=1", "trainer.epochs=2", "dist.nproc_per_node=2"]


def _packages_on_disk() -> set[str]:
    """Every package the checkout holds, by the name it is installed under."""
    names = {"accordion_repro.conf"}
    for root, prefix in [(REPO / "accordion_repro", "accordion_repro"),
                         (REPO / "benchmarks", "accordion_repro.benchmarks")]:
        for init in root.rglob("__init__.py"):
            names.add(".".join([prefix, *init.parent.relative_to(root).parts]))
    return names


def test_pyproject_lists_every_package_the_checkout_holds():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    assert sorted(declared) == sorted(_packages_on_disk())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:  # a copy: the build writes build/ and *.egg-info where it runs
        source, target = REPO / name, base / "src" / name
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    done = subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                           "print(build_meta.build_wheel(sys.argv[1]))", str(base / "dist")],
                          cwd=base / "src", capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return base / "dist" / done.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_wheel_holds_the_configs_and_no_top_level_benchmarks(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    configs = sorted(p.relative_to(REPO / "conf").as_posix() for p in (REPO / "conf").rglob("*.yaml"))
    assert sorted(n.removeprefix("accordion_repro/conf/") for n in names
                  if n.startswith("accordion_repro/conf/")) == configs
    assert "accordion_repro/benchmarks/gpu_check.py" in names
    assert "accordion_repro/benchmarks/netbench/ranks.py" in names
    tops = {n.split("/", 1)[0] for n in names}
    assert tops == {"accordion_repro", wheel.name.split("-py3")[0] + ".dist-info"}, tops


@pytest.mark.slow
@pytest.mark.distributed
def test_a_non_editable_install_trains_two_ranks_from_any_directory(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    uv = Path(sys.executable).parent / "uv"
    done = subprocess.run([str(uv), "pip", "install", "--quiet", "--offline", "--no-deps",
                           "--python", str(python), str(wheel)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(site) / "suite-dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = subprocess.run([str(python), "-c", "import accordion_repro; print(accordion_repro.__file__)"],
                           cwd=work, capture_output=True, text=True, timeout=120)
    assert where.stdout.strip().startswith(site), where.stdout + where.stderr

    done = subprocess.run([str(python), "-m", "accordion_repro.train", *TWO_RANKS_TINY], cwd=work,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "python -m accordion_repro.analysis --runs" in done.stdout  # no Makefile beside a wheel
    [summary] = list((work / "results" / "runs").rglob("summary.json"))
    record = json.loads(summary.read_text())
    assert record["status"] == "completed" and record["epochs_completed"] == 2
