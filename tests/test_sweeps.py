"""Sweeps and cluster launch without a cluster: multirun through submitit_local, the Slurm
launcher profile as submitit maps it, and the sbatch script (syntax, shellcheck, and a real
torchrun run behind a stand-in srun, for machines where the tests cannot start Slurm).
tests/test_slurm.py runs the same profile and script on a real one-node Slurm cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from accordion_repro.launch import free_port
from conftest import CONF_DIR, REPO

SBATCH = REPO / "slurm" / "torchrun.sbatch"
TINY_RUN = ["scale=cpu", "dataset=synthetic_cifar10", "dataset.train_size=32", "dataset.test_size=8",
            "trainer.epochs=1", "trainer.max_steps_per_epoch=2", "trainer.max_eval_steps=1",
            "trainer.batch_size=4", "trainer.eval_batch_size=8", "trainer.checkpoint=false",
            "logger.wandb.mode=disabled", "trainer.progress=never"]


def cli(args: list[str], *, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accordion_repro.train", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def summaries(runs_dir: Path) -> dict[str, dict]:
    """run.name -> summary.json of every run directory below runs_dir."""
    out = {}
    for path in runs_dir.rglob("summary.json"):
        resolved = OmegaConf.load(path.parent / "resolved.yaml")
        out[resolved.run.name] = json.loads(path.read_text())
    return out


def launched_jobs(output: str) -> int:
    found = re.search(r"Launching (\d+) jobs", output)
    assert found, output[-3000:]
    return int(found.group(1))


# ---- sweeps ---------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(900)  # the subprocess limits below only catch a hang (a load of 13 here)
def test_submitit_local_multirun_completes_both_runs(tmp_path):
    presets = ["table1/resnet18_powersgd_static_low", "table1/resnet18_powersgd_static_high"]
    result = cli(["-m", "hydra/launcher=submitit_local", f"experiment={','.join(presets)}",
                  *TINY_RUN, "dist.nproc_per_node=1", f"paths.runs_dir={tmp_path}"], timeout=840)
    assert result.returncode == 0, result.stderr[-3000:]
    done = summaries(tmp_path)
    assert sorted(done) == sorted(presets)
    for summary in done.values():
        assert summary["status"] == "completed" and summary["scale"] == "cpu"
    assert list(tmp_path.glob(".submitit/*")), "submitit wrote no job folder"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_seed_list_multiplies_the_sweep(tmp_path):
    """3 seeds x 2 presets = 6 jobs (the first fails fast on purpose: no dataset files)."""
    result = cli(["-m", "experiment=table1/resnet18_powersgd_dense,table1/vgg19bn_powersgd_dense",
                  "seed=41,42,43", f"paths.runs_dir={tmp_path}", f"paths.data_dir={tmp_path}/absent",
                  "logger.wandb.mode=disabled"], timeout=840)
    assert launched_jobs(result.stdout + result.stderr) == 6


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_glob_selects_every_preset_of_a_table(tmp_path):
    result = cli(["-m", "experiment=glob(table1/*)", f"paths.runs_dir={tmp_path}",
                  f"paths.data_dir={tmp_path}/absent", "logger.wandb.mode=disabled"], timeout=840)
    assert launched_jobs(result.stdout + result.stderr) == 12


# ---- the Slurm launcher profile -------------------------------------------------------------
def compose_launcher(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", overrides=["hydra/launcher=slurm", *overrides],
                       return_hydra_config=True).hydra.launcher


def fake_slurm_bin(directory: Path, hosts: str = "127.0.0.1") -> Path:
    """srun that drops its own options and runs the command; scontrol that lists `hosts`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                                    'exec "$@"\n')
    (directory / "scontrol").write_text(
        '#!/bin/bash\nif [[ "$1 $2" == "show hostnames" ]]; then\n'
        f'  printf "%s\\n" {hosts}\nelse\n  echo "scontrol $*" >> "{directory}/calls"\nfi\n')
    for tool in ("srun", "scontrol"):
        (directory / tool).chmod(0o755)
    return directory


def test_slurm_profile_is_a_submitit_slurm_config_with_one_task_per_gpu(tmp_path, monkeypatch):
    """Only keys of the released launcher, and the sbatch header submitit would write."""
    import submitit
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, SlurmQueueConf

    launcher = compose_launcher(["hydra.launcher.partition=gpu"])
    assert launcher._target_ == SlurmQueueConf._target_
    params = OmegaConf.to_container(launcher, resolve=False)
    assert set(params) <= set(OmegaConf.structured(SlurmQueueConf).keys())
    assert params["tasks_per_node"] == params["gpus_per_node"] == 4 and params["nodes"] == 1
    assert params["max_num_timeout"] > 0

    # As hydra_submitit_launcher's SlurmLauncher.launch maps its config onto submitit.
    monkeypatch.setenv("PATH", f"{fake_slurm_bin(tmp_path / 'bin')}:{os.environ['PATH']}")
    for key in ("_target_", "submitit_folder", "name"):
        params.pop(key)
    executor = submitit.AutoExecutor(cluster="slurm", folder=tmp_path / "jobs",
                                     slurm_max_num_timeout=params.pop("max_num_timeout"))
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(name="accordion", **{k if k in base else f"slurm_{k}": v
                                                    for k, v in params.items()})
    header = executor._executor._make_submission_file_text("CMD", "UID")
    for line in ("--ntasks-per-node=4", "--gpus-per-node=4", "--nodes=1", "--partition=gpu",
                 "--time=1440", "--signal=USR2@300", "--requeue"):
        assert line in header, header


def test_slurm_profile_keeps_requeue_when_an_sbatch_option_is_added():
    launcher = compose_launcher(["+hydra.launcher.additional_parameters.constraint=a100"])
    assert launcher.additional_parameters == {"requeue": True, "constraint": "a100"}


def test_slurm_profile_spans_nodes_by_override():
    launcher = compose_launcher(["hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=2",
                                 "hydra.launcher.gpus_per_node=2"])
    assert launcher.nodes * launcher.tasks_per_node == 4


# ---- the sbatch script ----------------------------------------------------------------------
def test_sbatch_script_parses():
    result = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_sbatch_script_passes_shellcheck():
    if shutil.which("shellcheck") is None:
        pytest.skip("shellcheck is not installed (apt-get install -y shellcheck)")
    result = subprocess.run(["shellcheck", str(SBATCH)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


def test_sbatch_script_refuses_to_run_outside_slurm():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    result = subprocess.run(["bash", str(SBATCH)], capture_output=True, text=True, env=env,
                            timeout=30)
    assert result.returncode == 2 and "sbatch" in result.stderr


@pytest.mark.slow
@pytest.mark.distributed
def test_sbatch_script_runs_two_torchrun_ranks_from_slurm_variables(tmp_path):
    """The script as Slurm would run it on one node with 2 'GPUs' (CPU ranks, gloo), srun
    replaced by a stand-in that runs its command: torchrun's c10d rendezvous at the first host
    of SLURM_JOB_NODELIST, then the same entry point as a local run."""
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PATH": f"{fake_slurm_bin(tmp_path / 'bin')}:{os.environ['PATH']}",
           "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "127.0.0.1", "SLURM_JOB_NUM_NODES": "1",
           "GPUS_PER_NODE": "2", "MASTER_PORT": str(free_port()), "TORCHRUN": str(torchrun),
           "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        ["bash", str(SBATCH), "experiment=table1/resnet18_powersgd_accordion", *TINY_RUN,
         "trainer.device=cpu", f"paths.runs_dir={tmp_path / 'runs'}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    assert "rendezvous 127.0.0.1:" in result.stdout
    summary = summaries(tmp_path / "runs")["table1/resnet18_powersgd_accordion"]
    assert summary["status"] == "completed" and summary["world_size"] == 2


def test_submitits_time_limit_signal_stops_a_run_only_inside_a_submitit_slurm_job(monkeypatch):
    """(tests/test_slurm.py sends it to real jobs.) Elsewhere USR2 is left alone."""
    import signal

    from accordion_repro.launch import STOP_SIGNALS, stop_signals

    for key in ("SUBMITIT_EXECUTOR", "SLURM_JOB_ID", "SUBMITIT_PREEMPT_SIGNAL"):
        monkeypatch.delenv(key, raising=False)
    assert stop_signals() == STOP_SIGNALS
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    assert stop_signals() == STOP_SIGNALS  # no Slurm job around it
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert stop_signals() == (*STOP_SIGNALS, signal.SIGUSR2)
    monkeypatch.setenv("SUBMITIT_PREEMPT_SIGNAL", "USR1")
    assert stop_signals() == (*STOP_SIGNALS, signal.SIGUSR1)
