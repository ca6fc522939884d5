"""The trainer's, optimiser's and launcher's settings objects refuse a bad value by its key."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from omegaconf import OmegaConf

from accordion_repro.engine.settings import DistSettings, OptimSettings, TrainerSettings
from accordion_repro.errors import ConfigError
from conftest import CONF_DIR, REPO, compose_cfg

SETTINGS = {"trainer": (TrainerSettings, "trainer/default"), "optim": (OptimSettings, "optim/sgd"),
            "dist": (DistSettings, "dist/default")}


def node(section: str, **overrides) -> dict:
    values = OmegaConf.to_container(OmegaConf.load(CONF_DIR / f"{SETTINGS[section][1]}.yaml"))
    return {**values, **overrides}


@pytest.mark.parametrize("section", sorted(SETTINGS))
def test_every_conf_file_is_read_whole(section):
    keys = set()
    for path in sorted((CONF_DIR / section).glob("*.yaml")):
        values = OmegaConf.to_container(OmegaConf.load(path))
        SETTINGS[section][0].from_config(values)
        keys |= set(values)
    assert keys == set(vars(SETTINGS[section][0].from_config(node(section))))


BAD = [
    ("trainer", "batch_size", 0, "must be an integer >= 1, got 0"),
    ("trainer", "max_micro_batch", 0, "must be an integer >= 1, got 0"),
    ("trainer", "stop_after_epoch", -1, "must be an integer >= 0, got -1"),
    ("trainer", "num_workers", "many", "must be an integer >= 0, got 'many'"),
    ("trainer", "resume", "maybe", "must be one of auto, never; got 'maybe'"),
    ("trainer", "allow_config_change", "yes", "must be true or false, got 'yes'"),
    ("trainer", "checkpoint", "maybe", "must be true or false, got 'maybe'"),
    ("trainer", "deterministic", 1, "must be true or false, got 1"),
    ("optim", "name", "adam", "must be one of sgd, lstm_momentum; got 'adam'"),
    ("optim", "lr", 0, "must be a number > 0, got 0"),
    ("optim", "momentum", 1.0, "must be a number in [0, 1), got 1.0"),
    ("optim", "decay_factor", 0, "must be a number in (0, 1], got 0"),
    ("optim", "clip_grad_norm", -1.0, "must be a number > 0, got -1.0"),
    ("optim", "clip_point", "before", "must be one of local, averaged; got 'before'"),
    ("optim", "nesterov", "sometimes", "must be true or false, got 'sometimes'"),
    ("optim", "official_off_by_one", "no", "must be true or false, got 'no'"),
    ("dist", "nproc_per_node", 0, "must be an integer >= 1, got 0"),
    ("dist", "backend", "mpi", "must be one of auto, gloo, nccl; got 'mpi'"),
    ("dist", "launcher", "ssh", "must be one of auto, spawn, env; got 'ssh'"),
    ("dist", "timeout_s", -5, "must be an integer >= 1, got -5"),
]


@pytest.mark.parametrize("section, option, value, message",
                         [pytest.param(*case, id=f"{case[0]}.{case[1]}") for case in BAD])
def test_a_bad_value_is_refused_with_its_key(section, option, value, message):
    with pytest.raises(ConfigError) as caught:
        SETTINGS[section][0].from_config(node(section, **{option: value}))
    assert caught.value.key == f"{section}.{option}"
    assert str(caught.value) == f"{section}.{option}: {message}"


def test_a_missing_option_is_required():
    values = node("trainer")
    del values["epochs"]
    with pytest.raises(ConfigError, match="trainer.epochs: is required"):
        TrainerSettings.from_config(values)


# ---- the CUDA device of a rank (launch.bind_cuda_device), checked on the CPU ---------------------
@pytest.mark.parametrize("env, count, expected", [
    ({"LOCAL_RANK": "3"}, 4, 3),                                    # torchrun / the local spawner
    ({"LOCAL_RANK": "3"}, 2, 1),
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, 4, 1),  # srun
    ({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"}, 1, 0),  # one GPU bound per task
    ({}, 2, 0),
], ids=["torchrun", "torchrun_wraps", "slurm", "slurm_one_gpu_per_task", "alone"])
def test_each_rank_takes_its_local_cuda_device(monkeypatch, env, count, expected):
    from accordion_repro.env import local_cuda_device

    for key in ("LOCAL_RANK", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "RANK"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert local_cuda_device(count) == expected


def test_the_device_is_bound_before_the_process_group_is_made(monkeypatch):
    """NCCL binds a communicator to the current device at init: set_device must come first."""
    import torch
    import torch.distributed as dist

    from accordion_repro import launch

    calls = []
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("set_device", index)))
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(("init", kw["backend"])))
    trainer = OmegaConf.to_container(compose_cfg(["trainer.device=cuda"]).trainer, resolve=True)
    launch._join_env_group(TrainerSettings.from_config(trainer), "nccl", 60)
    assert calls == [("set_device", 1), ("init", "nccl")]


# ---- how local ranks start (launch.start_method) ------------------------------------------------
@pytest.mark.parametrize("use_cuda, tempdir, expected", [
    (False, "/tmp", "forkserver"),
    (True, "/tmp", "spawn"),  # a rank is the first to touch CUDA in its process
    (False, "/scratch/" + "j" * 70, "spawn"),  # the forkserver's socket path would not fit
], ids=["cpu", "cuda", "cpu_long_tmpdir"])
def test_local_ranks_are_forked_from_a_server_on_the_cpu_and_spawned_otherwise(
        monkeypatch, use_cuda, tempdir, expected):
    import tempfile
    from types import SimpleNamespace

    from accordion_repro import launch

    monkeypatch.setattr(tempfile, "tempdir", tempdir)
    run = SimpleNamespace(trainer=SimpleNamespace(use_cuda=use_cuda))
    assert launch.start_method(run) == expected
    assert (len(launch._forkserver_socket_path()) <= 107) == (len(tempdir) + 32 <= 107)


@pytest.mark.parametrize("over", [0, 1], ids=["longest_that_fits", "one_byte_over"])
def test_the_forkserver_is_chosen_exactly_where_its_socket_can_be_bound(monkeypatch, over):
    """A real Unix socket at the path multiprocessing would give the server, under a temporary
    directory that makes the path as long as fits, or one byte longer: it binds exactly where
    start_method chooses forkserver (the kernel's limit, not the constant, is the judge)."""
    import socket
    import tempfile
    from types import SimpleNamespace

    from accordion_repro import launch

    below_tempdir = len(launch._forkserver_socket_path()) - len(tempfile.gettempdir())
    base = tempfile.mkdtemp(prefix="sock-", dir="/tmp")
    try:
        length = launch._UNIX_SOCKET_PATH_MAX - below_tempdir + over
        tempdir = os.path.join(base, "d" * (length - len(base) - 1))
        monkeypatch.setattr(tempfile, "tempdir", tempdir)
        address = launch._forkserver_socket_path()
        os.makedirs(os.path.dirname(address))
        with socket.socket(socket.AF_UNIX) as listener:
            try:
                listener.bind(address)
                bound = True
            except OSError:
                bound = False
        chosen = launch.start_method(SimpleNamespace(trainer=SimpleNamespace(use_cuda=False)))
        assert (chosen == "forkserver") == bound == (over == 0)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# ---- a forked process takes its starter's environment (utils.adopt_environment) ---------------
def test_a_forked_process_takes_its_starters_temp_dir(tmp_path):
    """A rank forked from launch's forkserver (or a harness CLI) starts with the temp dir the
    server had looked up; adopting its starter's environment must make `tempfile` use the
    starter's TMPDIR, as a spawned process would (a failed rank's traceback file is written
    there, and the launcher deletes it from there)."""
    import tempfile

    from accordion_repro.utils import adopt_environment

    tempfile.gettempdir()  # looked up, and cached, as the server had
    adopt_environment({**os.environ, "TMPDIR": str(tmp_path)})
    assert tempfile.gettempdir() == str(tmp_path)  # conftest puts the worker's TMPDIR back


# ---- how many threads a CPU rank computes with (launch._limit_threads) --------------------------
@pytest.mark.parametrize("omp, local_world, expected", [
    (None, 2, 4),  # local ranks share the cores
    (None, 1, None),  # one process: torch's own default
    ("3", 2, None),  # the user's OMP_NUM_THREADS, as torch read it, stays
], ids=["two_local_ranks", "one_process", "omp_num_threads_set"])
def test_local_cpu_ranks_share_the_cores_unless_omp_num_threads_is_set(
        monkeypatch, omp, local_world, expected):
    import torch

    from accordion_repro import launch

    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    before = torch.get_num_threads()
    try:
        launch._limit_threads(local_world)
        assert torch.get_num_threads() == (before if expected is None else expected)
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.distributed
def test_the_suite_runs_every_process_on_one_thread(tmp_path):
    """A rank's thread count changes its floats' last bits: with os.cpu_count() made to say 8,
    the launcher gave each of two local ranks 4 threads, and the golden metrics and the
    comparisons with torchrun, two-host and Slurm ranks (one thread) failed. conftest sets
    OMP_NUM_THREADS=1 for every process the suite starts; here a two-rank CLI run under that
    pretend machine records one thread (summary.json `cpu_threads`)."""
    import subprocess
    import sys

    (tmp_path / "sitecustomize.py").write_text("import os\nos.cpu_count = lambda: 8\n")
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": str(tmp_path) + (os.pathsep + path if path else "")}
    probe = subprocess.run([sys.executable, "-c", "import os; print(os.cpu_count())"], env=env,
                           capture_output=True, text=True, check=True)
    assert probe.stdout.strip() == "8"  # the pretend machine reaches a new interpreter
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "accordion_repro.train", "model=resnet18", "model.width=0.125",
         "dataset=synthetic_cifar10", "dataset.train_size=32", "dataset.test_size=8",
         "trainer.batch_size=8", "trainer.epochs=1", "trainer.max_steps_per_epoch=1",
         "trainer.max_eval_steps=1", "trainer.checkpoint=false", "dist.nproc_per_node=2",
         "logger.wandb.mode=disabled", "trainer.progress=never", f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["cpu_threads"] == 1


# ---- a stop signal while the ranks start (launch.RELAY.starting) -------------------------------
@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_ranks_start_is_kept_by_the_launcher_and_the_new_processes(
        tmp_path, signum):
    """RELAY.starting blocks the stop signals: one sent to the launcher inside the block is
    handled when the block ends (counted, written to the stop file for the ranks), and a
    process started inside the block inherits them blocked, so one sent to it before it has a
    handler waits for it (its rank unblocks them then: take_stop_signals_early). When they were
    only ignored, a signal that came while the ranks had no handler and the launcher was still
    in the block was lost, and the run trained to its end (exit 0; once in a whole suite run)."""
    import signal
    import subprocess
    import sys
    import threading

    from accordion_repro import launch

    sig = signal.Signals[signum]
    stop_file = tmp_path / "store.stop"
    with launch.RELAY.held():
        with launch.RELAY.starting(stop_file):
            child = subprocess.run(
                [sys.executable, "-c", "print(open('/proc/self/status').read())"],
                capture_output=True, text=True, check=True).stdout
            signal.pthread_kill(threading.main_thread().ident, sig)
            assert launch.RELAY.count == 0  # held back
        counted, last = launch.RELAY.count, launch.RELAY.last
    assert (counted, last) == (1, sig)
    assert stop_file.read_text() == str(int(sig))
    [mask] = [line.split()[1] for line in child.splitlines() if line.startswith("SigBlk:")]
    blocked = int(mask, 16)
    assert blocked & (1 << (int(sig) - 1)), child


@pytest.mark.parametrize("signum", ["SIGTERM", "SIGINT"])
def test_a_stop_signal_another_thread_takes_while_ranks_start_is_held_back_not_lost(
        tmp_path, signum):
    """A thread started before RELAY.starting does not block the stop signals, so the kernel
    may give it one sent to the launcher's process: numpy's OpenBLAS starts such a thread
    where OMP_NUM_THREADS is unset (found with gdb in a launcher). While the block ignored the
    signals, the signal it took was dropped; now it is held back and handled when the block
    ends, like one the main thread got."""
    import signal
    import threading

    from accordion_repro import launch

    sig = signal.Signals[signum]
    go = threading.Event()

    def take_it():  # the kernel delivers a thread-directed signal to that thread
        go.wait()
        signal.pthread_kill(threading.get_ident(), sig)

    other = threading.Thread(target=take_it)
    other.start()
    stop_file = tmp_path / "store.stop"
    with launch.RELAY.held():
        with launch.RELAY.starting(stop_file):
            go.set()
            other.join()
        counted, last = launch.RELAY.count, launch.RELAY.last
    assert (counted, last) == (1, sig)
    assert stop_file.read_text() == str(int(sig))
