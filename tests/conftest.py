"""Shared test helpers: compose configs through Hydra's compose API and run the real trainer."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import torch

import accordion_repro.config  # noqa: F401  (registers the conf/ resolvers)

REPO = Path(__file__).resolve().parents[1]
CONF_DIR = REPO / "conf"
SHARED_DATA = REPO.parent / "shared" / "data"

torch.set_num_threads(1)
os.environ.setdefault("WANDB_SILENT", "true")
# GNU OpenMP's default wait policy keeps an idle thread spinning between parallel regions. On
# the suite's two busy cores a one-rank CLI run (two OpenMP threads) then burnt 17-21 CPU-s
# instead of 9-10 for the same steps and the same numbers, and took up to 4x the wall time: every
# process the suite starts (read by libgomp when it loads) waits passively instead.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
# One intra-op thread in every process the suite starts, whatever the machine or the shell says.
# A CPU rank's thread count changes its floats' last bits, and the launcher gives each local rank
# cpu_count // ranks threads where OMP_NUM_THREADS is unset: on a machine with 4 or more CPUs the
# golden metrics (made at one thread per rank) and the comparisons of local ranks with torchrun,
# two-host and Slurm ranks (OMP_NUM_THREADS=1) failed, with os.cpu_count() made to say 8 here
# (test_engine_settings::test_the_suite_runs_every_process_on_one_thread).
os.environ["OMP_NUM_THREADS"] = "1"

# Imported after the settings above: the forkserver's environment is os.environ at its import.
import harness.forked_ranks  # noqa: E402,F401
from accordion_repro.utils import adopt_environment  # noqa: E402


# The files that take longest (Slurm clusters, two hosts, kills and resumes), longest first.
# `make test` runs two workers that each take whole files in collection order: starting these
# first lets the short files fill the other worker, so both finish at about the same time.
LONGEST_FILES = ("test_slurm.py", "test_run_integrity.py", "test_presets.py", "test_gpu_check.py",
                 "test_multinode.py", "test_train.py", "test_netbench_wholerun.py", "test_sweeps.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)

    items.sort(key=rank)  # stable: the order within a file and among the others is kept


@pytest.fixture(autouse=True)
def _environment_restored():
    """Each test gets the worker's environment as the one before it left it: code under test
    that sets a variable for the processes it starts (benchmarks.harness.run_ranks sets
    OMP_NUM_THREADS=1 for its ranks) set it for every later test of its worker, and the
    CLI those tests started ran on one thread instead of two."""
    before = dict(os.environ)
    yield
    if dict(os.environ) != before:
        adopt_environment(before)


# pyproject.toml's `slow` marker: "over ~3 s here". A test's cost is counted in CPU seconds
# (its own process and every child it waited for), which the machine's load barely changes,
# unlike wall time; `make test` lists the unmarked tests above this at its end.
SLOW_CPU_S = 3.0


def _cpu_s() -> float:
    """User + system CPU seconds of this process and of its children that have been waited for."""
    import resource

    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_CPU_START] = _cpu_s()
    yield


_CPU_START = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU seconds (setup to teardown, its module fixtures included where it is the
    first to use them) go with its teardown report: to the controller under xdist and into
    --junitxml as the property cpu_s."""
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _CPU_START in item.stash:
        report.user_properties.append(("cpu_s", round(_cpu_s() - item.stash[_CPU_START], 2)))


_UNMARKED_SLOW: list[tuple[float, str]] = []


def pytest_runtest_logreport(report):
    cpu = dict(report.user_properties).get("cpu_s") if report.when == "teardown" else None
    if cpu is not None and cpu > SLOW_CPU_S and "slow" not in report.keywords:
        _UNMARKED_SLOW.append((cpu, report.nodeid))


def pytest_terminal_summary(terminalreporter):
    if _UNMARKED_SLOW:
        terminalreporter.section(f"over {SLOW_CPU_S:.0f} s of CPU without the slow marker "
                                 "(mark them: `make test-fast` leaves slow tests out)")
        for cpu, nodeid in sorted(_UNMARKED_SLOW, reverse=True):
            terminalreporter.write_line(f"{cpu:7.1f} s CPU  {nodeid}")


def load_script(name: str):
    """scripts/<name>.py as a module. Only scripts/wheelhouse.py needs it: it runs on a plain
    python3 where PyPI is reachable, without this package installed, so its code cannot live in
    a package as every other script's does."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose_cfg(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides))


def train(overrides: list[str], run_dir: Path) -> Path:
    """Compose, validate and run the trainer exactly as the CLI does (spawning ranks if asked)."""
    from accordion_repro.train import run

    return run(_quiet_cfg(overrides), Path(run_dir))


def _quiet_cfg(overrides: list[str]):
    """A test run's config: no wandb, no progress bar."""
    return compose_cfg(["logger.wandb.mode=disabled", "trainer.progress=never", *overrides])


@pytest.fixture(scope="module")
def rank_pool():
    """Two gloo ranks kept for a module's short 2-rank runs (tests/harness/rank_pool.py): a
    start each would cost more than the run."""
    from harness.rank_pool import RankPool

    pool = RankPool()
    yield pool
    pool.close()


def train_in_pool(pool, overrides: list[str], run_dir: Path) -> Path:
    """As train(), on `pool`'s two ranks: composed and validated here as the CLI does, then the
    Trainer on both ranks (nothing of the launcher: no lock, no resolved.yaml, no spawn)."""
    from accordion_repro.config import validate

    settings = validate(_quiet_cfg(overrides))
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    pool.train(settings, run_dir)
    return run_dir


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line]


def read_summary(run_dir: Path) -> dict:
    return json.loads((Path(run_dir) / "summary.json").read_text())


def child_processes(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of each child of `pid`, by pid."""
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(pid)], capture_output=True,
                         text=True).stdout
    return sorted((int(line.split(None, 1)[0]), line.split(None, 1)[1]) for line in out.splitlines())


def local_ranks(launcher_pid: int) -> list[int]:
    """The local ranks a launcher started, by pid (so rank 0 first): on the CPU the children of
    its forkserver (launch.start_method), spawned ranks (CUDA) its own children."""
    ranks = []
    for pid, args in child_processes(launcher_pid):
        if "forkserver import main" in args:
            ranks += [child for child, _ in child_processes(pid)]
        elif "spawn_main" in args:
            ranks.append(pid)
    return sorted(ranks)


def files_named(root: Path, name: str) -> list[Path]:
    """Every file called `name` below `root`, walked while a run may still be writing there:
    a folder that goes away mid-walk (a process's `.hydra/pending-<pid>`, moved up and removed
    when Hydra's files are kept) is skipped, where `Path.rglob` raises FileNotFoundError."""
    return sorted(Path(folder) / name for folder, _, files in os.walk(root) if name in files)


def wait_until(predicate, *, timeout: float, what: str, poll: float = 0.1, alive=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if alive is not None and alive.poll() is not None:
            raise AssertionError(f"gave up waiting for {what}: the command exited with {alive.returncode}")
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(autouse=True, scope="session")
def _private_decode_cache(tmp_path_factory):
    """Tests decode JPEGs into their own cache, never into the user's ~/.cache."""
    os.environ["ACCORDION_CACHE_DIR"] = str(tmp_path_factory.mktemp("decode-cache"))
    yield


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.exists():
        pytest.skip(f"real sample data not present at {SHARED_DATA}")
    return SHARED_DATA


# The Slurm clusters live in tests/harness/slurm.py.
from harness.slurm import (SlurmCluster, TwoNodeSlurmCluster, _all_pids,  # noqa: E402,F401
                           _proc_environ, _running_cluster)


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running one-node Slurm cluster (see SlurmCluster)."""
    yield from _running_cluster(SlurmCluster)


@pytest.fixture(scope="session")
def slurm_two_nodes():
    """A running two-node Slurm cluster across two network namespaces (TwoNodeSlurmCluster)."""
    yield from _running_cluster(TwoNodeSlurmCluster)


@pytest.fixture
def one_rank_group(tmp_path):
    """A real one-process gloo group, so Accordion can wrap a model in this process (the DDP
    and FSDP tests' single-process refusals)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    yield
    dist.destroy_process_group()
