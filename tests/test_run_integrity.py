"""Nothing lost, nothing mislabelled, nothing executed: the run directory's guards, with real
processes (the CLI in a subprocess, 2 gloo ranks where ranks matter)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import yaml

from accordion_repro.analysis.collect import collect_runs, find_run_dirs
from accordion_repro.utils import pid_alive
from conftest import REPO, child_processes, local_ranks, read_metrics, read_summary, wait_until
from harness.forked_cli import run_cli

QUIET = ["logger.wandb.mode=disabled", "trainer.progress=never", "trainer.batch_size=8",
         "trainer.eval_batch_size=16", "trainer.max_steps_per_epoch=2", "trainer.max_eval_steps=1"]
IMAGES = ["dataset=synthetic_cifar10", "dataset.train_size=64", "dataset.test_size=16"]
DENSE = ["model=resnet18", "model.width=0.125", *IMAGES, *QUIET]
TINY = [*DENSE, "compressor=powersgd", "schedule=accordion", "schedule.interval=1"]
TIMING = {"epoch_time_s", "compute_time_s", "comm_time_s"}


def cli(run_dir: Path, *overrides: str, timeout: float = 240, base=TINY) -> subprocess.CompletedProcess:
    """The CLI run to its end in a process of its own (harness/forked_cli.py: forked, its imports
    done once); what starts the process a user starts goes through popen/_popen."""
    return run_cli([*base, *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO, timeout=timeout)


def popen(run_dir: Path, *overrides: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "accordion_repro.train", *TINY, *overrides,
                             f"hydra.run.dir={run_dir}"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def files_snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and ".hydra" not in p.parts and p.name != "train.log"}


# ---- resuming with another config -----------------------------------------------------------
@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    done = cli(run_dir, "trainer.epochs=2")
    assert done.returncode == 0, done.stderr
    return run_dir


@pytest.mark.slow
def test_rerun_with_a_changed_config_is_refused_naming_the_keys(finished_run, tmp_path):
    before = files_snapshot(finished_run)
    out = cli(finished_run, "trainer.epochs=2", "schedule.low=4", "schedule.eta=0.3")
    assert out.returncode == 2
    line = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(line) == 1
    assert "schedule.low: 2 -> 4" in line[0] and "schedule.eta: 0.5 -> 0.3" in line[0]
    assert "trainer.resume=never" in line[0] and "trainer.allow_config_change=true" in line[0]
    assert files_snapshot(finished_run) == before  # resolved.yaml not rewritten, nothing touched


@pytest.mark.slow
def test_a_refused_job_leaves_the_runs_hydra_files_alone(finished_run, tmp_path):
    """Issue 37 item 11: Hydra wrote the refused job's config over .hydra/config.yaml."""
    run_dir = _copy(finished_run, tmp_path)
    before = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir() if p.is_file()}
    assert {"config.yaml", "overrides.yaml", "hydra.yaml"} <= set(before)
    out = cli(run_dir, "trainer.epochs=2", "schedule.low=4")
    assert out.returncode == 2
    after = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    assert after == before  # nothing pending left either


@pytest.mark.slow
def test_resume_never_moves_the_old_run_aside_and_starts_afresh(finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)
    old_metrics = (run_dir / "metrics.jsonl").read_text()
    out = cli(run_dir, "trainer.epochs=2", "schedule.low=1", "trainer.resume=never")
    assert out.returncode == 0, out.stderr
    [aside] = (run_dir / ".replaced").iterdir()
    assert (aside / "metrics.jsonl").read_text() == old_metrics
    low = {path: yaml.safe_load(path.read_text())["schedule"]["low"]
           for path in (aside / "resolved.yaml", run_dir / "resolved.yaml")}
    assert list(low.values()) == [2, 1]
    complete, _ = find_run_dirs(tmp_path)
    assert complete == [run_dir]  # the analysis never reads the moved-aside run


@pytest.mark.slow
def test_allow_config_change_continues_and_records_the_change_per_epoch(tmp_path):
    run_dir = tmp_path / "run"
    assert cli(run_dir, "trainer.epochs=3", "trainer.stop_after_epoch=0").returncode == 0
    out = cli(run_dir, "trainer.epochs=3", "schedule.eta=0.25", "trainer.allow_config_change=true")
    assert out.returncode == 0, out.stderr
    metrics = read_metrics(run_dir)
    assert [m["epoch"] for m in metrics] == [0, 1, 2]
    assert "config_change" not in metrics[0]
    assert metrics[1]["config_change"] == metrics[2]["config_change"] == {"schedule.eta": [0.5, 0.25]}
    summary = read_summary(run_dir)
    assert summary["config_changes"] == [{"from_epoch": 1, "delta": {"schedule.eta": [0.5, 0.25]}}]


# ---- one run per directory ------------------------------------------------------------------
@pytest.mark.slow
def test_a_second_run_on_a_directory_in_use_stops_at_once(tmp_path):
    run_dir = tmp_path / "run"
    first = popen(run_dir, "trainer.epochs=50", "trainer.max_steps_per_epoch=4")
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists(), timeout=180,
                   what="the first run's first epoch")
        second = cli(run_dir, "trainer.epochs=50", "trainer.max_steps_per_epoch=4")
        assert second.returncode == 2
        assert first.poll() is None  # refused while the first run still trains
        assert f"pid {first.pid} on host {socket.gethostname()}" in second.stderr
        assert "in use by another run" in second.stderr
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    lines = [json.loads(l)["epoch"] for l in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == len(set(lines))  # no epoch logged twice


def _dead_pid() -> int:
    """The pid of a process that has just ended (none of this host's runs it now)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    return dead.pid


@pytest.mark.slow
def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".lock").write_text(json.dumps({"pid": _dead_pid(), "host": socket.gethostname()}))
    out = cli(run_dir, "trainer.epochs=1")
    assert out.returncode == 0, out.stderr
    assert "stale lock" in out.stdout
    assert not (run_dir / ".lock").exists()


def _descendants(pid: int) -> list[int]:
    """Every process below `pid` now."""
    children = [child for child, _ in child_processes(pid)]
    return children + [grandchild for child in children for grandchild in _descendants(child)]


def _temp_dir_choosing(method: str, tmp_path: Path) -> Path:
    """A TMPDIR under which launch.start_method picks `method` on the CPU: the forkserver's socket
    path must fit in 107 bytes, so a short folder under /tmp for "forkserver" (pytest's own
    tmp_path is long enough on a busy CI worker, /tmp/pytest-of-root/pytest-100/popen-gw0/...,
    to turn the launch into "spawn") and a long one for "spawn"."""
    if method == "forkserver":
        return Path(tempfile.mkdtemp(prefix="acc-", dir="/tmp"))
    temp = tmp_path / ("t" * 80)
    temp.mkdir()
    return temp


@pytest.mark.slow
@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_killed_launcher_takes_every_process_of_its_job_and_its_pymp_folder_with_it(method, tmp_path):
    """Issue 56: SIGKILL to the launcher alone, mid-epoch. Under "forkserver" its forkserver
    (which dies with it, accordion_repro/forkserver_guard.py), the ranks forked from it and the
    resource tracker are gone within 5 s, and so is the forkserver's pymp-* folder; under
    "spawn" (a TMPDIR too long for the forkserver's socket) the ranks are its own children and
    die with it. The lock names the job's other processes, so no rerun takes the directory over
    while one of them lives."""
    run_dir, temp = tmp_path / "run", _temp_dir_choosing(method, tmp_path)
    proc = _popen(run_dir, *TWO_RANKS, "trainer.epochs=20", env={"TMPDIR": str(temp)})
    try:
        wait_until(lambda: _training(run_dir) and json.loads((run_dir / ".lock").read_text())
                   .get("processes"), timeout=180, what="the ranks training", alive=proc)
        job = _descendants(proc.pid)
        lock = json.loads((run_dir / ".lock").read_text())
        ranks = local_ranks(proc.pid)
        servers = [pid for pid, args in child_processes(proc.pid) if "forkserver import main" in args]
        assert len(ranks) == 2 and len(servers) == (method == "forkserver")
        assert sorted(lock["processes"]) == sorted(ranks + servers) and set(ranks) <= set(job)
        assert bool(list(temp.glob("pymp-*"))) == (method == "forkserver")
        proc.kill()  # the launcher alone, not its process group
        proc.wait()
        wait_until(lambda: not any(pid_alive(pid) for pid in job), timeout=5,
                   what=f"every process of the job ({job}) gone")
        assert list(temp.glob("pymp-*")) == []
        assert read_summary(run_dir)["status"] == "running"  # nothing finished the run
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        if method == "forkserver":
            shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_a_rerun_while_a_process_of_the_old_job_lives_is_refused_naming_its_pid(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    dead = _dead_pid()
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        (run_dir / ".lock").write_text(json.dumps(
            {"pid": dead, "host": socket.gethostname(), "processes": [rank.pid]}))
        out = cli(run_dir, "trainer.epochs=1")
        assert out.returncode == 2
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and f"pid {rank.pid} of the job of pid {dead}" in lines[0]
        assert (run_dir / ".lock").exists() and not (run_dir / "metrics.jsonl").exists()
    finally:
        rank.kill()
        rank.wait()


# ---- crash-safe metrics, honest status --------------------------------------------------------
@pytest.mark.slow
def test_a_torn_last_metrics_line_does_not_block_resume(finished_run, stopped_run, tmp_path):
    run_dir = _copy(stopped_run, tmp_path)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"epoch": 1, "lr": 0.00')  # the process died while appending epoch 1
    out = cli(run_dir, "trainer.epochs=2")
    assert out.returncode == 0, out.stderr
    assert without_timing(read_metrics(run_dir)) == without_timing(read_metrics(finished_run))


@pytest.mark.slow
@pytest.mark.distributed
def test_sigterm_stops_cleanly_as_stopped_and_the_resume_matches_an_uninterrupted_run(tmp_path):
    overrides = ["trainer.epochs=2", "dist.nproc_per_node=2", "dataset.train_size=2048",
                 "trainer.max_steps_per_epoch=128"]
    run_dir = tmp_path / "run"
    proc = popen(run_dir, *overrides)
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists(), timeout=180, what="epoch 0")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM
    stops = [l for l in (out + err).splitlines() if l.startswith("stopped")]
    assert len(stops) == 1 and "SIGTERM" in stops[0] and "resume" in stops[0]
    summary = read_summary(run_dir)
    assert summary["status"] == "stopped" and summary["stop_signal"] == signal.SIGTERM
    assert (run_dir / "checkpoints" / "last.pt").exists()
    # the same command resumes: the partial epoch is redone, nothing lost or doubled (that the
    # values equal an uninterrupted run's is tests/test_train.py::test_resume_continues_identically)
    done = cli(run_dir, *overrides)
    assert done.returncode == 0, done.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "completed" and "stop_signal" not in summary
    assert [m["epoch"] for m in read_metrics(run_dir)] == [0, 1]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1500)  # three two-rank FSDP runs: over 300 s on 2 cores under a load of 13
def test_an_fsdp_run_killed_mid_epoch_resumes_to_the_uninterrupted_metrics(tmp_path):
    """dist.strategy=fsdp (issue 40): SIGTERM inside epoch 1, the same command resumes from
    epoch 0's checkpoint (whole model and optimizer, every rank's reducer, rank 0's detector)
    and logs what a run never stopped logs."""
    overrides = ["trainer.epochs=2", "dist.nproc_per_node=2", "dist.strategy=fsdp",
                 "dataset.train_size=1024", "trainer.max_steps_per_epoch=64"]
    whole = cli(tmp_path / "whole", *overrides, timeout=600)
    assert whole.returncode == 0, whole.stderr
    run_dir = tmp_path / "run"
    proc = popen(run_dir, *overrides)
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists(), timeout=600, what="epoch 0")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "during epoch 1" in read_summary(run_dir)["stopped"]
    done = cli(run_dir, *overrides, timeout=600)
    assert done.returncode == 0, done.stderr
    assert without_timing(read_metrics(run_dir)) == without_timing(read_metrics(tmp_path / "whole"))


@pytest.fixture(scope="module")
def diverged_two_ranks(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """A two-rank run that fails: (its run directory, what the CLI printed). A dataset path
    that only rank 1 cannot read would need a fault; a NaN does it for every rank."""
    base = tmp_path_factory.mktemp("diverged")
    (base / "tmp").mkdir()
    with mock.patch.dict(os.environ, TMPDIR=str(base / "tmp")):
        out = cli(base / "run", "trainer.epochs=2", "dist.nproc_per_node=2", "optim.lr=1e30",
                  "optim.warmup_epochs=0", base=DENSE)
    return base / "run", out


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failed_rank_leaves_status_failed_with_its_rank_and_cause(diverged_two_ranks):
    run_dir, out = diverged_two_ranks
    assert out.returncode == 1
    summary = read_summary(run_dir)
    assert summary["status"] == "failed"
    assert "rank " in summary["error"] and "training diverged at epoch 0 step" in summary["error"]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failed_rank_leaves_no_error_file_in_the_temp_dir(diverged_two_ranks):
    """torch's start_processes has a rank that raises pickle its traceback to a file in the temp
    dir and reads it back, but never deletes it: 31 were left in /tmp by one suite run."""
    run_dir, out = diverged_two_ranks
    assert out.returncode == 1
    assert list((run_dir.parent / "tmp").glob("pytorch-errorfile-*")) == []


@pytest.mark.slow
@pytest.mark.timeout(900)  # two CLI runs: over 300 s on 2 cores under a load of 13
def test_a_diverging_run_stops_within_one_epoch_and_is_never_a_result(tmp_path):
    run_dir = tmp_path / "runs" / "nan"
    out = cli(run_dir, "trainer.epochs=3", "optim.lr=1e30", "optim.warmup_epochs=0", base=DENSE)
    assert out.returncode == 1
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert error and "training diverged at epoch 0 step" in error[0]
    assert ("(loss nan)" in error[0]) or ("(loss inf)" in error[0])
    assert read_summary(run_dir)["status"] == "failed"
    assert read_metrics(run_dir) == [] if (run_dir / "metrics.jsonl").exists() else True
    # nan_policy=continue runs on, but the analysis never takes the run as a result
    cont = tmp_path / "runs" / "continued"
    out = cli(cont, "trainer.epochs=2", "optim.lr=1e30", "optim.warmup_epochs=0",
              "trainer.nan_policy=continue", base=DENSE)
    assert out.returncode == 0, out.stderr
    with pytest.warns(UserWarning):
        collection = collect_runs(tmp_path / "runs")
    assert collection.frame.empty
    assert any("diverged" in reason for _, reason in collection.broken)


# ---- safe checkpoints -------------------------------------------------------------------------
class _Exploit:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def stopped_run(tmp_path_factory) -> Path:
    """A run stopped after epoch 0 of 2, so that it has a checkpoint to resume from."""
    run_dir = tmp_path_factory.mktemp("stopped") / "run"
    assert cli(run_dir, "trainer.epochs=2", "trainer.stop_after_epoch=0").returncode == 0
    return run_dir


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    shutil.copytree(run_dir, tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow
def test_a_crafted_checkpoint_executes_nothing(stopped_run, tmp_path):
    run_dir = _copy(stopped_run, tmp_path)
    marker = tmp_path / "pwned"
    import io

    import torch

    from accordion_repro.engine.checkpoint import sealed
    buffer = io.BytesIO()
    torch.save({"ranks": [_Exploit(str(marker))], "epoch": 0}, buffer)
    # a valid checksum, so that the load itself (weights_only) is what refuses it
    (run_dir / "checkpoints" / "last.pt").write_bytes(sealed(buffer.getvalue()))
    before = files_snapshot(run_dir)
    out = cli(run_dir, "trainer.epochs=2")
    assert out.returncode == 2
    assert not marker.exists()
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and "last.pt" in error[0] and "trainer.resume=never" in error[0]
    assert files_snapshot(run_dir) == before


@pytest.mark.slow
def test_a_truncated_checkpoint_stops_with_one_line_and_touches_nothing(stopped_run, tmp_path):
    run_dir = _copy(stopped_run, tmp_path)
    ckpt = run_dir / "checkpoints" / "last.pt"
    ckpt.write_bytes(ckpt.read_bytes()[:1000])
    before = files_snapshot(run_dir)
    out = cli(run_dir, "trainer.epochs=2")
    assert out.returncode == 2
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and str(ckpt) in error[0] and "trainer.resume=never" in error[0]
    assert "Traceback" not in out.stderr
    assert files_snapshot(run_dir) == before


# ---- dataset contents checked before the ranks start -----------------------------------------
def _npz_cli(run_dir: Path, path: Path, *extra: str):
    return cli(run_dir, "model=resnet18", "model.width=0.125", "dataset=npz",
               f"dataset.path={path}", "trainer.epochs=1", "dist.nproc_per_node=2", *QUIET, *extra,
               base=[])


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["garbage", "truncated", "wrong_shape"])
def test_bad_npz_contents_are_refused_before_any_rank_starts(tmp_path, damage):
    path = tmp_path / "data.npz"
    images = np.zeros((8, 32, 32, 3), np.uint8)
    if damage == "wrong_shape":
        np.savez(path, x_train=np.zeros((8, 28, 28), np.uint8), y_train=np.zeros(8, np.int64),
                 x_test=images, y_test=np.zeros(8, np.int64))
    else:
        np.savez(path, x_train=images, y_train=np.zeros(8, np.int64), x_test=images,
                 y_test=np.zeros(8, np.int64))
        data = path.read_bytes()
        path.write_bytes(b"not a zip file" if damage == "garbage" else data[: len(data) // 2])
    out = _npz_cli(tmp_path / "run", path)
    assert out.returncode == 2
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and "dataset.path" in error[0] and str(path) in error[0]
    assert "Traceback" not in out.stderr and "spawn" not in out.stderr
    assert not (tmp_path / "run" / "resolved.yaml").exists()


def _cifar10_files(root: Path, crafted: object | None = None, truncate: bool = False) -> Path:
    """CIFAR-10's python-version files, 4 images a batch; data_batch_1 replaced by `crafted`
    pickled, or cut in half."""
    import pickle

    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {"data": rng.integers(0, 256, (4, 3072), dtype=np.uint8),
                 "labels": [int(v) for v in rng.integers(0, 10, 4)]}
        (folder / name).write_bytes(pickle.dumps(batch, protocol=2))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": list("abcdefghij")}))
    first = folder / "data_batch_1"
    if crafted is not None:
        first.write_bytes(pickle.dumps({"data": crafted, "labels": [0]}, protocol=2))
    if truncate:
        first.write_bytes(first.read_bytes()[:2000])
    return first


@pytest.mark.slow
@pytest.mark.parametrize("damage, checksums, ranks", [
    ("crafted", "true", 1), ("crafted", "true", 2), ("crafted", "false", 1),
    ("crafted", "false", 2), ("truncated", "false", 1), ("truncated", "false", 2)])
def test_a_crafted_or_damaged_cifar_batch_is_refused_in_one_line_and_runs_nothing(
        tmp_path, damage, checksums, ranks):
    """Issue 56: a CIFAR batch is a pickle. One whose unpickling would run `touch` is refused,
    checksums on (its md5 is not the release's) or off (the reader admits only what the format
    holds), and the file is never created; a truncated one is refused too. One line naming the
    file, exit 2, before any rank starts, on 1 rank as on 2."""
    marker = tmp_path / "pwned"
    path = _cifar10_files(tmp_path / "data", crafted=_Exploit(str(marker))
                          if damage == "crafted" else None, truncate=damage == "truncated")
    out = cli(tmp_path / "run", "dataset=cifar10", f"dataset.root={tmp_path / 'data'}",
              f"dataset.verify_checksums={checksums}", f"dist.nproc_per_node={ranks}",
              "trainer.epochs=1", base=[*DENSE[:2], *QUIET])
    assert out.returncode == 2, out.stderr
    assert not marker.exists()
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and str(path) in lines[0], out.stderr
    assert ("md5" if checksums == "true" else "not a CIFAR file") in lines[0]
    assert not (tmp_path / "run" / "resolved.yaml").exists()


@pytest.mark.slow
def test_empty_wikitext_files_name_the_file_not_a_missing_key(tmp_path):
    root = tmp_path / "wikitext-2"
    root.mkdir()
    for split in ("train", "valid", "test"):
        (root / f"{split}.txt").write_text("" if split == "train" else "a b c\n")
    out = cli(tmp_path / "run", "model=lstm", "model.num_layers=1", "model.hidden_size=8",
              "model.embedding_size=8", "optim=lstm", "dataset=wikitext2",
              f"dataset.root={root}", "trainer.epochs=1", *QUIET, base=[])
    assert out.returncode == 2
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and "train.txt" in error[0] and "empty" in error[0]
    assert "vocab_size" not in error[0]


# ---- nothing listens beyond loopback ---------------------------------------------------------
def _listening_addresses(pids: list[int]) -> list[str]:
    inodes = set()
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                found.append(fields[1].split(":")[0])
    return found


@pytest.mark.slow
@pytest.mark.distributed
def test_a_local_two_rank_run_listens_only_on_loopback(tmp_path):
    run_dir = tmp_path / "run"
    proc = popen(run_dir, "trainer.epochs=20", "trainer.max_steps_per_epoch=4",
                 "dist.nproc_per_node=2")
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists(), timeout=180, what="the first epoch")
        pids = [proc.pid, *(pid for pid, _ in child_processes(proc.pid)), *local_ranks(proc.pid)]
        addresses = _listening_addresses(pids)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    loopback = {"0100007F", "00000000000000000000000001000000"}  # 127.0.0.1, ::1
    assert addresses, "no listening socket found (gloo pairs listen while connecting)"
    assert set(addresses) <= loopback, addresses


# ---- sweeps, logging --------------------------------------------------------------------------
@pytest.mark.slow
def test_a_sweep_with_one_bad_value_names_that_job_and_runs_the_others(tmp_path):
    out = subprocess.run([sys.executable, "-m", "accordion_repro.train", "-m", *DENSE,
                          "compressor=powersgd", "trainer.epochs=1", "compressor.rank=2,0",
                          f"hydra.sweep.dir={tmp_path}",
                          f"paths.runs_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True,
                         timeout=240)
    text = out.stdout + out.stderr
    assert "Error executing job with overrides" in text and "compressor.rank=0" in text
    assert "compressor.rank: the PowerSGD rank must be an integer >= 1, got 0" in text
    good = [p for p in tmp_path.rglob("summary.json") if "rank=2" in str(p)]
    assert len(good) == 1 and json.loads(good[0].read_text())["status"] == "completed"


@pytest.mark.slow
@pytest.mark.distributed
def test_epoch_lines_go_to_the_job_log_and_the_run_directory_is_printed_once(tmp_path):
    run_dir = tmp_path / "run"
    out = cli(run_dir, "trainer.epochs=2", "dist.nproc_per_node=2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("run directory:") == 1
    log = (run_dir / "train.log").read_text()
    assert "epoch   0/2" in log and "epoch   1/2" in log


# ---- a resume never leaves a gap in metrics.jsonl (issue 26) ----------------------------------
@pytest.fixture(scope="module")
def three_epoch_runs(tmp_path_factory) -> tuple[Path, Path]:
    """(an uninterrupted 3-epoch run, the same run stopped after epoch 1 with its checkpoint)."""
    root = tmp_path_factory.mktemp("three")
    whole, stopped = root / "whole", root / "stopped"
    assert cli(whole, "trainer.epochs=3").returncode == 0
    assert cli(stopped, "trainer.epochs=3", "trainer.stop_after_epoch=1").returncode == 0
    return whole, stopped


def _tear_last_line(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])  # epoch 1's record torn, as in the issue


def _drop_first_line(path: Path) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[1:]))  # epoch 0 missing


@pytest.mark.slow
@pytest.mark.parametrize("damage", [_tear_last_line, _drop_first_line], ids=["torn_last", "missing_middle"])
def test_a_gap_in_metrics_is_rebuilt_from_the_checkpoint_and_named(three_epoch_runs, tmp_path, damage):
    whole, stopped = three_epoch_runs
    run_dir = _copy(stopped, tmp_path)
    damage(run_dir / "metrics.jsonl")
    out = cli(run_dir, "trainer.epochs=3")
    assert out.returncode == 0, out.stderr
    notes = [l for l in out.stdout.splitlines() if "metrics.jsonl lacked" in l]
    missing = "[1]" if damage is _tear_last_line else "[0]"
    assert len(notes) == 1 and f"epochs {missing}" in notes[0]
    assert read_summary(run_dir)["status"] == "completed"
    assert without_timing(read_metrics(run_dir)) == without_timing(read_metrics(whole))


@pytest.mark.slow
def test_a_duplicated_metrics_line_is_rewritten_and_named(three_epoch_runs, tmp_path):
    """Issue 37 item 11: the note named 'epochs []' for a line written twice."""
    whole, stopped = three_epoch_runs
    run_dir = _copy(stopped, tmp_path)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text("".join([lines[0], *lines]))
    out = cli(run_dir, "trainer.epochs=3")
    assert out.returncode == 0, out.stderr
    [note] = [l for l in out.stdout.splitlines() if "metrics.jsonl held" in l]
    assert "held epochs [0] more than once" in note and "[]" not in note
    assert without_timing(read_metrics(run_dir)) == without_timing(read_metrics(whole))


def _as_older_version(ckpt: Path) -> None:
    """Rewrite a checkpoint without its copy of the metrics lines (what older versions wrote)."""
    import io

    import torch

    from accordion_repro.engine import checkpoint

    state = checkpoint.read(ckpt)
    del state["metric_lines"]
    buffer = io.BytesIO()
    torch.save(checkpoint.to_plain(state), buffer)
    ckpt.write_bytes(checkpoint.sealed(buffer.getvalue()))


@pytest.mark.slow
@pytest.mark.parametrize("damage", [_tear_last_line, _drop_first_line], ids=["torn_last", "missing_middle"])
def test_a_gap_that_cannot_be_rebuilt_is_refused_naming_the_epochs(three_epoch_runs, tmp_path, damage):
    _, stopped = three_epoch_runs
    run_dir = _copy(stopped, tmp_path)
    _as_older_version(run_dir / "checkpoints" / "last.pt")
    damage(run_dir / "metrics.jsonl")
    before = files_snapshot(run_dir)
    out = cli(run_dir, "trainer.epochs=3")
    assert out.returncode == 2
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    missing = "[1]" if damage is _tear_last_line else "[0]"
    assert len(error) == 1 and f"lacks epochs {missing}" in error[0]
    assert "trainer.resume=never" in error[0] and "Traceback" not in out.stderr
    assert files_snapshot(run_dir) == before
    assert read_summary(run_dir)["status"] == "stopped"


# ---- an allowed config change takes effect, or is refused (issue 28) ---------------------------
# One key family each. The stopped run (epoch 0 of 2) resumes with the change; its epoch 1 must
# differ from the unchanged run's epoch 1 in the field the change acts on.
CHANGES = {
    "optim": (["optim.momentum=0.5", "optim.weight_decay=0.01"], "train_loss"),
    "trainer": (["trainer.max_steps_per_epoch=1"], "steps"),
    "dataset": (["dataset.augment=false"], "train_loss"),
    "schedule": (["schedule.eta=100", "schedule.lr_decay_rule=false"], "critical_layers"),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(CHANGES))
def test_an_allowed_config_change_takes_effect_from_the_first_resumed_epoch(
        finished_run, stopped_run, tmp_path, family):
    changes, field = CHANGES[family]
    run_dir = _copy(stopped_run, tmp_path)
    out = cli(run_dir, "trainer.epochs=2", *changes, "trainer.allow_config_change=true")
    assert out.returncode == 0, out.stderr
    changed, unchanged = read_metrics(run_dir), read_metrics(finished_run)
    assert without_timing(changed[:1]) == without_timing(unchanged[:1])
    assert changed[1][field] != unchanged[1][field]
    assert set(changed[1]["config_change"]) == {c.split("=")[0] for c in changes}


@pytest.mark.slow
def test_a_config_change_the_checkpoint_cannot_take_is_refused_naming_the_key(stopped_run, tmp_path):
    run_dir = _copy(stopped_run, tmp_path)
    before = files_snapshot(run_dir)
    out = cli(run_dir, "trainer.epochs=2", "schedule.low=4", "optim.momentum=0.5",
              "trainer.allow_config_change=true")
    assert out.returncode == 2
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and "cannot change schedule.low: 2 -> 4 on resume" in error[0]
    assert "optim.momentum" not in error[0] and "trainer.resume=never" in error[0]
    assert files_snapshot(run_dir) == before


@pytest.mark.slow
def test_a_deleted_resolved_yaml_is_restored_from_the_checkpoint_and_still_guards(stopped_run, tmp_path):
    run_dir = _copy(stopped_run, tmp_path)
    original = (run_dir / "resolved.yaml").read_text()
    (run_dir / "resolved.yaml").unlink()
    out = cli(run_dir, "trainer.epochs=2", "optim.momentum=0.5")
    assert out.returncode == 2
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and "optim.momentum: 0.9 -> 0.5" in error[0]
    assert yaml.safe_load((run_dir / "resolved.yaml").read_text()) == yaml.safe_load(original)
    assert cli(run_dir, "trainer.epochs=2").returncode == 0


@pytest.mark.slow
def test_a_damaged_resolved_yaml_is_restored_from_the_checkpoint_or_refused_in_one_line(
        stopped_run, finished_run, tmp_path):
    """Issue 37 item 8: a 61-line YAML traceback before."""
    run_dir = _copy(stopped_run, tmp_path)
    (run_dir / "resolved.yaml").write_text("trainer: {epochs: [\n")
    out = cli(run_dir, "trainer.epochs=2")
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    [note] = [l for l in out.stdout.splitlines() if "resolved.yaml was damaged" in l]
    assert "restored from" in note
    assert [m["epoch"] for m in read_metrics(run_dir)] == [0, 1]
    # with no checkpoint to restore it from: refused, naming the file
    bare = tmp_path / "bare"
    shutil.copytree(finished_run, bare)
    shutil.rmtree(bare / "checkpoints")
    (bare / "resolved.yaml").write_text("- a list\n- not a config\n")
    out = cli(bare, "trainer.epochs=2")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    [error] = [l for l in out.stderr.splitlines() if l.strip()]
    assert error.startswith("error:") and str(bare / "resolved.yaml") in error and "damaged" in error


@pytest.mark.slow
def test_run_files_without_any_config_are_refused(finished_run, tmp_path):
    run_dir = _copy(finished_run, tmp_path)  # completed: its checkpoint holds the config
    shutil.rmtree(run_dir / "checkpoints")
    (run_dir / "resolved.yaml").unlink()
    out = cli(run_dir, "trainer.epochs=2", "optim.momentum=0.5")
    assert out.returncode == 2
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and "no resolved.yaml" in error[0]


@pytest.mark.slow
@pytest.mark.parametrize("fill", [b"\0", b"\xff"], ids=["zeros", "ones"])
def test_a_checkpoint_damaged_inside_its_data_is_refused_naming_the_file(stopped_run, tmp_path, fill):
    run_dir = _copy(stopped_run, tmp_path)
    ckpt = run_dir / "checkpoints" / "last.pt"
    data = bytearray(ckpt.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = fill * 4096
    ckpt.write_bytes(bytes(data))
    before = files_snapshot(run_dir)
    out = cli(run_dir, "trainer.epochs=2")
    assert out.returncode == 2
    error = [l for l in out.stderr.splitlines() if l.startswith("error:")]
    assert len(error) == 1 and str(ckpt) in error[0] and "checksum" in error[0]
    assert "Traceback" not in out.stderr and files_snapshot(run_dir) == before


# ---- the demo's console (issue 26) -------------------------------------------------------------
def _demo_command(run_dir: Path, *make_args: str) -> str:
    """The command `make demo` runs, writing into `run_dir`."""
    dry = subprocess.run(["make", "-s", "-n", "demo", f"DEMO_DIR={run_dir}",
                          f"PYTHON={sys.executable}", *make_args],
                         cwd=REPO, capture_output=True, text=True, check=True)
    return dry.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, str, subprocess.CompletedProcess]:
    """`make demo` as it is, run once: (its run directory, its command, what it printed)."""
    run_dir = tmp_path_factory.mktemp("demo") / "demo"
    command = _demo_command(run_dir)
    out = subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    return run_dir, command, out


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1200)  # about 90 s of CPU: a minute on 2 idle cores, 5-8 under a load of 15
def test_the_whole_demo_learns_and_runs_an_epoch_at_the_high_compression(demo):
    """Issue 37: `make demo` as it is ends well above chance (10 classes; it ended at 11 %
    before) and some epoch runs layers at rank 1, the high compression."""
    run_dir, _, out = demo
    epochs = [l for l in out.stdout.replace("\r", "\n").splitlines()
              if re.match(r"epoch +\d+/\d+ ", l)]
    final = read_summary(run_dir)["final_test_acc"]
    assert final >= 35, epochs
    assert f"done: test_acc {final:.2f} %" in out.stdout
    assert any(re.search(r"\b\d+ at 1\b", l.split("layers")[-1]) for l in epochs), epochs
    assert f"run directory: {run_dir} " in out.stdout


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.timeout(1200)  # the same demo run as above (a module fixture), whichever test starts it
def test_the_demo_prints_no_warning_an_epoch_line_each_and_a_summary(demo):
    """`make demo`'s own command (read from the Makefile, DEMO_STEPS passed through)."""
    run_dir, command, out = demo
    steps = re.search(r"^DEMO_STEPS \?= (\d+)$", (REPO / "Makefile").read_text(), re.M).group(1)
    assert "accordion_repro.train" in command and f"trainer.max_steps_per_epoch={steps}" in command
    assert "trainer.max_steps_per_epoch=1 " in _demo_command(run_dir, "DEMO_STEPS=1")
    total = int(re.search(r"trainer\.epochs=(\d+)", command).group(1))
    console = out.stdout + out.stderr
    assert "warning" not in console.lower() and "Traceback" not in console
    epochs = [l for l in out.stdout.replace("\r", "\n").splitlines() if "test_acc" in l]
    assert [l.split()[1] for l in epochs if l.startswith("epoch")] == \
        [f"{epoch}/{total}" for epoch in range(total)]
    final = read_summary(run_dir)["final_test_acc"]
    [done] = [l for l in out.stdout.splitlines() if l.startswith("done:")]
    assert f"test_acc {final:.2f} %" in done and "floats sent" in done
    assert f"run directory: {run_dir}" in out.stdout
    assert f"wandb files: {run_dir / 'wandb'}" in out.stdout and "make figures" in out.stdout


# ---- failures and stops say their cause in one line (issue 28) ----------------------------------
def _error_lines(out: subprocess.CompletedProcess) -> list[str]:
    return [l for l in out.stderr.splitlines() if l.startswith("error:")]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_second_sigterm_ends_the_run_as_stopped_and_resumable(tmp_path):
    run_dir = tmp_path / "run"
    overrides = ["trainer.epochs=2", "dist.nproc_per_node=2", "dataset.train_size=2048",
                 "trainer.max_steps_per_epoch=128"]
    proc = popen(run_dir, *overrides)
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists(), timeout=180, what="epoch 0")
        proc.send_signal(signal.SIGTERM)
        import time
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = [l for l in err.splitlines() if l.strip() and "Terminating process" not in l]
    assert len(lines) == 1 and lines[0].startswith("stopped:") and "resume" in lines[0], err
    summary = read_summary(run_dir)
    assert summary["status"] == "stopped" and summary["stop_signal"] == signal.SIGTERM
    done = cli(run_dir, *overrides)
    assert done.returncode == 0, done.stderr
    assert [m["epoch"] for m in read_metrics(run_dir)] == [0, 1]


@pytest.mark.slow
@pytest.mark.distributed
def test_a_diverged_two_rank_run_prints_one_line(diverged_two_ranks):
    run_dir, out = diverged_two_ranks
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    [error] = _error_lines(out)
    assert "failed: training diverged at epoch 0 step" in error
    assert [l for l in out.stderr.splitlines() if l.strip()] == [error]
    assert read_summary(run_dir)["status"] == "failed"


@pytest.fixture
def small_mount(tmp_path):
    """A tmpfs of the given options at tmp_path/mnt (root only); unmounted afterwards."""
    mounted = []

    def mount(options: str) -> Path:
        if os.geteuid() != 0:
            pytest.skip("needs root to mount a tmpfs")
        target = tmp_path / f"mnt{len(mounted)}"
        target.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(target)
        return target

    yield mount
    for target in mounted:
        subprocess.run(["umount", "-l", str(target)], check=False)


@pytest.mark.slow
@pytest.mark.distributed
def test_a_full_disk_names_no_space_from_the_rank_that_hit_it(tmp_path, small_mount):
    run_dir = small_mount("size=192k") / "run"
    out = cli(run_dir, "trainer.epochs=2", "dist.nproc_per_node=2")
    assert out.returncode == 1
    [error] = _error_lines(out)
    assert "rank 0 failed" in error and "No space left on device" in error, out.stderr
    assert "Connection closed" not in error
    assert [l for l in out.stderr.splitlines() if l.strip()] == [error]  # no traceback under it
    assert read_summary(run_dir)["status"] == "failed"


@pytest.mark.slow
def test_a_read_only_run_directory_is_refused_in_one_line_before_anything_starts(small_mount):
    run_dir = small_mount("ro,size=64k") / "run"
    out = cli(run_dir, "trainer.epochs=1")
    assert out.returncode == 2
    [error] = _error_lines(out)
    assert f"cannot write the run directory {run_dir}" in error and "read-only" in error
    assert "Traceback" not in out.stderr and not out.stdout.strip()
    assert not (run_dir / "summary.json").exists()  # refused before anything started


@pytest.mark.parametrize("case", ["older_static", "detect_turned_on"])
def test_detector_options_of_a_static_run_matter_only_when_it_detects(case):
    """A static run made before schedule.detect existed has no detector options in its
    resolved.yaml; they compute nothing without detect, so resuming it is no config change.
    Turning detect on is one, named."""
    from accordion_repro.rundir import config_delta

    old = {"schedule": {"name": "static"}}
    new = {"schedule": {"name": "static", "detect": case == "detect_turned_on", "eta": 0.5,
                        "interval": 2, "lr_decay_rule": True, "statistic": "mean"}}
    delta = config_delta(old, new)
    if case == "older_static":
        assert delta == {}
    else:
        assert set(delta) == {"schedule.detect", "schedule.eta", "schedule.interval",
                              "schedule.lr_decay_rule", "schedule.statistic"}


@pytest.mark.parametrize("schedule, same", [("accordion", True), ("regime_windows", True),
                                             ("static", False)])
def test_the_compressors_level_matters_only_where_the_schedule_reads_it(schedule, same):
    """A run made before issue 39 recorded compressor.rank: 2 under schedule=accordion, which
    sets every layer's rank; the same run now has rank null: resuming it is no config change
    (nor is mixing it with new seeds in a table cell). Under static the rank is the run's."""
    from accordion_repro.rundir import config_delta

    old = {"compressor": {"name": "powersgd", "rank": 2}, "schedule": {"name": schedule}}
    new = {"compressor": {"name": "powersgd", "rank": None}, "schedule": {"name": schedule}}
    assert config_delta(old, new) == ({} if same else {"compressor.rank": [2, None]})


@pytest.mark.parametrize("plugins, same", [([], True), (["mypkg.compressors"], False)])
def test_a_run_made_before_plugins_existed_resumes_without_them(plugins, same):
    """conf/config.yaml's `plugins` (0.3.0) is absent from older runs' resolved.yaml, which ran
    with none: resuming one without plugins is no config change; with one, it is named."""
    from accordion_repro.rundir import config_delta

    old = {"seed": 42}
    assert config_delta(old, {"seed": 42, "plugins": plugins}) == (
        {} if same else {"plugins": [[], plugins]})


# Keys named by the run directory itself (seed<seed>, <scale.name>/<run.name>/; an experiment
# sets run.name) or that are no config key (a Hydra group of Hydra's own).
_IN_THE_PATH = {"seed", "run.name", "experiment", "scale", "hydra/launcher"}


def test_every_override_the_directory_name_leaves_out_is_ignored_on_resume():
    """Two jobs that differ only in an override conf/config.yaml's exclude_keys leaves out of
    the directory name share one directory, so rundir must let the second resume the first."""
    import yaml

    from accordion_repro.rundir import config_delta

    config = yaml.safe_load((REPO / "conf" / "config.yaml").read_text())
    excluded = set(config["hydra"]["job"]["config"]["override_dirname"]["exclude_keys"])
    assert _IN_THE_PATH <= excluded

    def nested(key: str, value) -> dict:
        for part in reversed(key.split(".")):
            value = {part: value}
        return value

    compared = [key for key in sorted(excluded - _IN_THE_PATH)
                if config_delta(nested(key, "old"), nested(key, "new"))]
    assert not compared, f"rundir.py compares {compared} though the directory name leaves them out"


# ---- issue 37: nothing silent, nothing noisy ---------------------------------------------------
TWO_RANKS = ["trainer.epochs=2", "dist.nproc_per_node=2", "dataset.train_size=2048",
             "trainer.max_steps_per_epoch=128"]


def _popen(run_dir: Path, *overrides: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "accordion_repro.train", *TINY, *overrides,
                             f"hydra.run.dir={run_dir}"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, **(env or {})})


def _training(run_dir: Path) -> bool:
    return (run_dir / "summary.json").exists() and read_summary(run_dir).get("status") == "running"


def _finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _stopped_in_one_line(proc: subprocess.Popen, err: str, run_dir: Path, signum: int) -> None:
    assert proc.returncode == 128 + signum, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("stopped:") and signum.name in lines[0], err
    summary = read_summary(run_dir)
    assert summary["status"] == "stopped" and "error" not in summary


@pytest.mark.slow
def test_an_allowed_change_of_the_epochs_moves_the_regime_windows_from_the_first_resumed_epoch(tmp_path):
    """Item 1: windows [0, 0.5) of 4 epochs cover epoch 1, of 2 epochs they do not; the
    resumed epoch 1 ran the old plan (inside: level 2) where a fresh 2-epoch run is outside."""
    windows = [*DENSE, "compressor=powersgd", "schedule=regime_windows", "schedule.windows=[[0,0.5]]"]
    run_dir = tmp_path / "run"
    first = cli(run_dir, "trainer.epochs=4", "trainer.stop_after_epoch=0", base=windows)
    assert first.returncode == 0, first.stderr
    out = cli(run_dir, "trainer.epochs=2", "trainer.allow_config_change=true", base=windows)
    assert out.returncode == 0, out.stderr
    metrics = read_metrics(run_dir)
    assert list(metrics[0]["levels"]) == ["2"]  # epoch 0 inside the window
    assert list(metrics[1]["levels"]) == ["1"], metrics[1]["levels"]  # outside, as a fresh run


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_ranks_start_is_a_stop_in_one_line(tmp_path, signum):
    """Item 5: a rank that had no handler yet died of it (a 'crash'), or printed a traceback."""
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, *TWO_RANKS)
    try:
        wait_until(lambda: len(local_ranks(proc.pid)) == 2, timeout=120, what="the ranks", poll=0.02, alive=proc)
        os.killpg(proc.pid, signum)  # as Ctrl-C does: every process of the job
    finally:
        out, err = _finish(proc)
    _stopped_in_one_line(proc, err, run_dir, signum)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signals_while_the_launcher_shuts_down_leave_one_line_and_no_lock(tmp_path, signum):
    """Item 6: the launcher died of a later signal with no line (or a KeyboardInterrupt)."""
    import time

    run_dir = tmp_path / "run"
    proc = _popen(run_dir, *TWO_RANKS)
    try:
        wait_until(lambda: _training(run_dir), timeout=180, what="training", alive=proc)
        while proc.poll() is None:  # a signal every 50 ms until the launcher has left
            proc.send_signal(signum)
            time.sleep(0.05)
    finally:
        out, err = _finish(proc)
    _stopped_in_one_line(proc, err, run_dir, signum)
    assert not (run_dir / ".lock").exists()


@pytest.mark.slow
def test_a_completed_rerun_of_a_failed_run_keeps_no_old_error(tmp_path):
    """Item 7: summary.json said completed with the failed job's error beside it."""
    run_dir = tmp_path / "run"
    failed = cli(run_dir, "trainer.epochs=1", "optim.lr=1e30", "optim.warmup_epochs=0", base=DENSE)
    assert failed.returncode == 1 and "error" in read_summary(run_dir)
    done = cli(run_dir, "trainer.epochs=1", "optim.warmup_epochs=0",
               "trainer.allow_config_change=true", base=DENSE)
    assert done.returncode == 0, done.stderr
    summary = read_summary(run_dir)
    assert summary["status"] == "completed"
    assert not {"error", "stopped", "stop_signal"} & set(summary), summary


@pytest.mark.slow
@pytest.mark.distributed
def test_a_killed_rank_is_one_line_with_no_resource_tracker_warning(tmp_path):
    """Item 9: each rank's tqdm lock was a semaphore that a killed rank leaked, and the
    resource tracker's 'leaked semaphore objects' warning followed the error line (it made
    test_a_second_sigterm_ends_the_run_as_stopped_and_resumable fail under load)."""
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, *TWO_RANKS)
    try:
        wait_until(lambda: _training(run_dir), timeout=180, what="training", alive=proc)
        os.kill(local_ranks(proc.pid)[1], signal.SIGKILL)
    finally:
        out, err = _finish(proc)
    assert proc.returncode == 1
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: rank 1 died"), err
    assert read_summary(run_dir)["error"] == lines[0].removeprefix("error: ")


@pytest.mark.slow
@pytest.mark.distributed
def test_what_a_killed_job_left_is_cleaned_up_by_the_next(tmp_path):
    """Item 10: a SIGKILLed launcher's rendezvous folder and a checkpoint write's temporary
    file stayed forever."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, *TWO_RANKS, env={"TMPDIR": str(tmp)})
    try:
        wait_until(lambda: _training(run_dir), timeout=180, what="training", alive=proc)
        proc.kill()  # the launcher alone; its ranks die with it
    finally:
        _finish(proc)
    assert list(tmp.glob("accordion-store-*"))
    (run_dir / "checkpoints").mkdir(exist_ok=True)
    torn = run_dir / "checkpoints" / ".last.pt.k1ll3d.tmp"  # what atomic_write leaves when killed
    torn.write_bytes(b"half a checkpoint")
    done = subprocess.run(
        [sys.executable, "-m", "accordion_repro.train", *TINY, "trainer.epochs=1",
         "dist.nproc_per_node=2", f"hydra.run.dir={run_dir}", "trainer.resume=never"],
        cwd=REPO, capture_output=True, text=True, timeout=240, env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr
    assert not torn.exists() and not list(run_dir.rglob("*.tmp"))
    assert not list(tmp.glob("accordion-store-*"))


@pytest.mark.slow
def test_a_stop_without_checkpoints_says_it_resumes_from_epoch_0(tmp_path):
    """Item 11: with trainer.checkpoint=false the stop line promised 'resumes from epoch 1'."""
    run_dir = tmp_path / "run"
    proc = _popen(run_dir, "trainer.epochs=3", "trainer.checkpoint=false",
                  "dataset.train_size=2048", "trainer.max_steps_per_epoch=64")
    try:
        wait_until(lambda: (run_dir / "metrics.jsonl").exists(), timeout=300, what="epoch 0",
                   alive=proc, poll=0.02)
        proc.send_signal(signal.SIGTERM)
    finally:
        out, err = _finish(proc)
    assert proc.returncode == 128 + signal.SIGTERM, err
    [line] = [l for l in err.splitlines() if l.startswith("stopped:")]
    assert "during epoch 1" in line and "resumes from epoch 0" in line, line
    assert not (run_dir / "checkpoints" / "last.pt").exists()


@pytest.mark.slow
def test_a_run_continues_in_its_own_directory_after_the_continuation_flags_change(tmp_path):
    """Item 4: adding trainer.allow_config_change=true or dropping trainer.stop_after_epoch
    named another directory, so the 'continuation' started afresh there, without hydra.run.dir."""
    def default_dir(*overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "accordion_repro.train", *TINY, *overrides,
                               f"paths.runs_dir={tmp_path}"], cwd=REPO, capture_output=True,
                              text=True, timeout=240)

    first = default_dir("trainer.epochs=2", "trainer.stop_after_epoch=0")
    assert first.returncode == 0, first.stderr
    then = default_dir("trainer.epochs=2", "trainer.allow_config_change=true")
    assert then.returncode == 0, then.stderr
    [run_dir] = [p.parent for p in tmp_path.rglob("summary.json")]
    said = [l for l in first.stdout.splitlines() + then.stdout.splitlines()
            if l.startswith("run directory:")]
    assert said == [f"run directory: {run_dir} (metrics.jsonl, summary.json, resolved.yaml)"] * 2
    assert read_summary(run_dir)["status"] == "completed"
    assert [m["epoch"] for m in read_metrics(run_dir)] == [0, 1]


# ---- issue 56: an allowed change is applied where it says, or refused ---------------------------
def _resumed_against_fresh(tmp_path, base: list[str], first: list[str], change: list[str],
                           epochs: int) -> tuple[list[dict], list[dict]]:
    """A 2-rank run stopped after epoch 0 and resumed with `change` (allowed), and a fresh run
    of the changed config: their metrics, timing and the change record left out, and what
    epoch 0's line says was decided at its end (the old config's decision, for epoch 1)."""
    decided = ("next_levels", "critical_model", "critical_layers")

    def lines(run_dir: Path) -> list[dict]:
        return [{k: v for k, v in m.items() if k not in TIMING and k != "config_change"
                 and not (m["epoch"] == 0 and k in decided)} for m in read_metrics(run_dir)]

    two = [*base, "dist.nproc_per_node=2", f"trainer.epochs={epochs}"]
    stopped = cli(tmp_path / "resumed", *first, "trainer.stop_after_epoch=0", base=two)
    assert stopped.returncode == 0, stopped.stderr
    resumed = cli(tmp_path / "resumed", *change, "trainer.allow_config_change=true", base=two)
    assert resumed.returncode == 0, resumed.stderr
    fresh = cli(tmp_path / "fresh", *change, base=two)
    assert fresh.returncode == 0, fresh.stderr
    return lines(tmp_path / "resumed"), lines(tmp_path / "fresh")


@pytest.mark.slow
@pytest.mark.distributed
def test_an_allowed_eta_change_of_schedule_auto_decides_as_a_fresh_run_of_that_eta(tmp_path):
    """Item 2: auto restored its own eta from the checkpoint, so a resume at eta 0.01 decided as
    eta 0.5 while every record said 0.01. The first check (end of epoch 0) flags everything
    whatever eta is; the end of epoch 1 decides with the new eta."""
    auto = [*DENSE, "compressor=powersgd", "schedule=auto", "schedule.interval=1",
            "optim.decay_at=[]"]
    resumed, fresh = _resumed_against_fresh(tmp_path, auto, ["schedule.eta=0.5"],
                                            ["schedule.eta=0.01"], epochs=3)
    assert [{k for k in set(a) | set(b) if a.get(k) != b.get(k)}
            for a, b in zip(resumed, fresh)] == [set()] * 3
    unchanged = cli(tmp_path / "unchanged", "schedule.eta=0.5",
                    base=[*auto, "dist.nproc_per_node=2", "trainer.epochs=3"])
    assert unchanged.returncode == 0, unchanged.stderr
    # the eta matters in this run: the test can tell the two apart
    assert read_metrics(tmp_path / "unchanged")[2]["layer_levels"] != fresh[2]["layer_levels"]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("schedule", ["phase_rule", "batch_fixed_epoch"])
def test_an_allowed_epochs_change_moves_an_epoch_planned_schedule_from_the_first_resumed_epoch(
        tmp_path, schedule):
    """Item 3: a boundary (or switch) at half the run is epoch 2 of 4 and epoch 1 of 2; after
    4 -> 2 epochs the resumed epoch 1 ran the checkpoint's plan (phase 1 / B_low) where a fresh
    2-epoch run is in phase 2 / at B_high."""
    bases = {
        "phase_rule": [*DENSE, "compressor=powersgd", "schedule=phase_rule",
                       "schedule.boundaries=[0.5]", "schedule.splits=[]",
                       "schedule.levels=[[2],[1]]"],
        "batch_fixed_epoch": [*DENSE, "schedule=batch_accordion", "schedule.mode=fixed_epoch",
                              "schedule.switch_epoch=0.5", "schedule.low=16",
                              "schedule.high=32"],
    }
    resumed, fresh = _resumed_against_fresh(tmp_path, bases[schedule], ["trainer.epochs=4"],
                                            ["trainer.epochs=2"], epochs=4)
    assert len(resumed) == len(fresh) == 2
    assert [{k for k in set(a) | set(b) if a.get(k) != b.get(k)}
            for a, b in zip(resumed, fresh)] == [set(), set()]
    field = "layer_levels" if schedule == "phase_rule" else "global_batch"
    assert resumed[0][field] != resumed[1][field]  # epoch 1 is in the second phase


@pytest.mark.slow
@pytest.mark.distributed
def test_continuing_with_a_change_that_renames_the_directory_is_refused_saying_how(tmp_path):
    """Item 4: without hydra.run.dir a changed override names a new directory, where
    trainer.allow_config_change=true used to start a new run from epoch 0 and leave the old one
    stopped. Refused in one line naming the run to continue; continuing it there works."""
    def default_dir(*overrides: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "accordion_repro.train", *TINY,
                               "dist.nproc_per_node=2", "trainer.epochs=2", *overrides,
                               f"paths.runs_dir={tmp_path}"], cwd=REPO, capture_output=True,
                              text=True, timeout=240)

    first = default_dir("trainer.stop_after_epoch=0")
    assert first.returncode == 0, first.stderr
    [old] = [p.parent for p in tmp_path.rglob("summary.json")]
    out = default_dir("optim.lr=0.5", "trainer.allow_config_change=true")
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "hydra.run.dir=" in lines[0] and str(old) in lines[0], out.stderr
    assert [p.parent for p in tmp_path.rglob("summary.json")] == [old]  # no new run
    then = default_dir("optim.lr=0.5", "trainer.allow_config_change=true",
                       f'hydra.run.dir="{old}"')  # as the message quotes it (its '=' and ',')
    assert then.returncode == 0, then.stderr
    metrics = read_metrics(old)
    assert [m["epoch"] for m in metrics] == [0, 1]
    assert metrics[1]["config_change"] == {"optim.lr": [0.1, 0.5]}
