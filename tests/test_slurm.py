"""Slurm for real: a one-node cluster on this machine (tests/harness/slurm.py: slurmctld, slurmd
and munged from Debian's packages, run from a temporary folder) runs

- a two-seed sweep through the submitit launcher profile (`hydra/launcher=slurm`),
- the same sweep with one job requeued (`scontrol requeue`) and one sent submitit's time-limit
  signal mid-epoch: both come back, resume in their own run directory and end with the
  metrics of the uninterrupted sweep, value by value,
- `sbatch slurm/torchrun.sbatch` with two ranks (srun -> torchrun -> c10d rendezvous at the
  allocation's first host), and the same job signalled before its time limit (the script's
  USR1 trap requeues it),
- failing jobs (a killed rank, a bad config reaching the ranks): FAILED in Slurm, the error in
  the job's log, no process left.

Slurm has no accounting here (no slurmdbd), so `sacct` answers nothing: job states come from
`scontrol show job` and the job completion log (jobcomp/filetxt).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from accordion_repro.launch import free_port
from conftest import REPO, SlurmCluster, files_named, read_metrics, read_summary, wait_until

pytestmark = pytest.mark.slow

SBATCH = REPO / "slurm" / "torchrun.sbatch"
EPOCHS = 4
STEPS = 50   # per epoch: 1-3 s on a loaded CPU, long enough to be interrupted in the middle
BATCH = 8
TINY = ["model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10", "dataset.test_size=16",
        f"trainer.batch_size={BATCH}", "trainer.max_eval_steps=1", "logger.wandb.mode=disabled",
        "trainer.progress=never", "trainer.device=cpu"]


def long_run(world: int) -> list[str]:
    """EPOCHS epochs of STEPS steps on `world` ranks (still a tiny model and data set)."""
    return [*TINY, f"dataset.train_size={STEPS * BATCH * world}",
            f"trainer.max_steps_per_epoch={STEPS}", f"trainer.epochs={EPOCHS}",
            f"dist.nproc_per_node={world}"]


def launcher(tasks: int, nodes: int = 1) -> list[str]:
    """The launcher profile sized for this cluster: `tasks` Slurm tasks (= ranks) per node on
    `nodes` nodes, one stand-in GPU each."""
    return ["-m", "hydra/launcher=slurm", f"hydra.launcher.partition={SlurmCluster.PARTITION}",
            f"hydra.launcher.nodes={nodes}",
            f"hydra.launcher.tasks_per_node={tasks}", f"hydra.launcher.gpus_per_node={tasks}",
            "hydra.launcher.cpus_per_task=1", "hydra.launcher.mem_gb=1",
            "hydra.launcher.timeout_min=10"]


SWEEP = [*launcher(1), *long_run(1), "seed=1,2"]


def without_timing(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.endswith("_time_s")} for r in records]


def seed_runs(runs_dir: Path) -> dict[int, Path]:
    """seed -> run directory, for every run below runs_dir (the submitit folder aside)."""
    out = {}
    for resolved in files_named(runs_dir, "resolved.yaml"):
        if ".submitit" not in resolved.parts:
            out[int(OmegaConf.load(resolved).seed)] = resolved.parent
    return out


def hydra_job_id(run_dir: Path) -> str:
    """The Slurm job id submitit gave the Hydra job (`8_0`: task 0 of job array 8)."""
    return str(OmegaConf.load(run_dir / ".hydra" / "hydra.yaml").hydra.job.id)


def submitit_log(runs_dir: Path, job_id: str) -> str:
    folder = runs_dir / ".submitit" / job_id
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob(f"{job_id}_0_log.*")))


def completions(cluster: SlurmCluster, job_id: str, timeout: float = 60) -> list[dict]:
    """The job completion log's records for a job (`8_0` = array job 8, task 0), once it has
    one: a sweep returns as soon as submitit's job has written its result, which is before
    Slurm has ended the job and logged its completion."""
    array, _, task = str(job_id).partition("_")

    def records():
        return [r for r in cluster.completions()
                if (task and r.get("ArrayJobId") == array and r.get("ArrayTaskId") == task)
                or (not task and r.get("JobId") == str(job_id))]

    try:
        return wait_until(records, timeout=timeout, what=f"job {job_id}'s completion record", poll=0.5)
    except AssertionError:
        return []


def tail(text: str, n: int = 6000) -> str:
    return text[-n:]


def first_line(path: Path) -> str:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return ""
    return lines[0] if lines and lines[0].endswith("}") else ""


def sweep(cluster: SlurmCluster, runs_dir: Path, log: Path, args: list[str] = SWEEP) -> subprocess.Popen:
    """Start a sweep (it waits for its jobs, as a user's terminal would). MASTER_PORT: the
    default (20000 + job id) could meet another test cluster's jobs on this machine."""
    with log.open("w") as out:
        return subprocess.Popen(cluster.client([sys.executable, "-m", "accordion_repro.train",
                                                *args, f"paths.runs_dir={runs_dir}"]), cwd=REPO,
                                env={**cluster.env, "MASTER_PORT": str(free_port())},
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


@contextlib.contextmanager
def sweeping(cluster: SlurmCluster, runs_dir: Path, log: Path, args: list[str] = SWEEP):
    """A running sweep, killed with its process group if the test leaves it early."""
    proc = sweep(cluster, runs_dir, log, args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def past_epoch0(runs_dir: Path, seed: int | None = None) -> Path | None:
    """The run directory (of `seed`, or the only one) once its first epoch is logged."""
    runs = seed_runs(runs_dir) if runs_dir.exists() else {}
    run = runs.get(seed) if seed is not None else next(iter(runs.values()), None)
    return run if run and first_line(run / "metrics.jsonl") else None


def finish(proc: subprocess.Popen, timeout: float, cluster: SlurmCluster, runs_dir: Path) -> int:
    """Wait for a sweep to end. A job of the sweep that Slurm ended as failed stops the wait
    at once: submitit cannot learn that without accounting (no sacct here) and would wait for
    the job's result for ever."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return proc.wait(min(5.0, max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            pass
        jobs = _sweep_job_ids(runs_dir)
        failed = [job for job in jobs if cluster.state(job) in SlurmCluster.FAILED_STATES]
        if failed or time.monotonic() >= deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
            why = (f"sweep job(s) {', '.join(failed)} ended FAILED in Slurm" if failed
                   else f"the command did not end within {timeout:.0f} s")
            raise AssertionError(f"{why}\n{_sweep_diagnostics(cluster, runs_dir, jobs)}") from None


def _sweep_job_ids(runs_dir: Path) -> list[str]:
    folder = runs_dir / ".submitit"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _sweep_diagnostics(cluster: SlurmCluster, runs_dir: Path, jobs: list[str]) -> str:
    """The jobs' Slurm records, controller log lines and submitit logs, for a failure message."""
    parts = []
    for job in jobs:
        parts += [f"--- job {job}: {cluster.job(job)}", cluster.controller_log(job)]
        for log in sorted((runs_dir / ".submitit" / job).glob("*_log.*")):
            parts.append(f"--- {log.name}\n{tail(log.read_text(errors='replace'), 1500)}")
    return "\n".join(parts)


ENDED = {"COMPLETED"} | SlurmCluster.FAILED_STATES


def sbatch(cluster: SlurmCluster, tmp_path: Path, overrides: list[str], *, wait: bool,
           timeout: float = 240, nodes: int = 1):
    """Submit slurm/torchrun.sbatch on 2 stand-in GPUs (one node's two, or one on each of two
    nodes), from the repository as a user would; (job id, its log, its final `scontrol show
    job` when `wait`)."""
    cpus = max(1, min(2, cluster.cpus))
    command = cluster.client(["sbatch", "--parsable", f"--nodes={nodes}",
                              f"--gpus-per-node={2 // nodes}", f"--cpus-per-task={cpus}",
                              "--mem=1G", "--time=10", f"--output={tmp_path}/slurm-%j.out",
                              str(SBATCH), *overrides])
    job_env = {**cluster.env, "TORCHRUN": str(Path(sys.executable).with_name("torchrun")),
               "MASTER_PORT": str(free_port())}
    job_env.pop("GPUS_PER_NODE", None)  # the rank count must come from Slurm
    result = subprocess.run(command, cwd=REPO, env=job_env, capture_output=True, text=True,
                            timeout=60)
    found = re.search(r"^(\d+)", result.stdout.strip())
    assert result.returncode == 0 and found, f"sbatch failed: {result.stdout}\n{result.stderr}"
    job_id = found.group(1)
    # (not `sbatch --wait`: it polls ever more slowly, up to half a minute between looks)
    info = cluster.wait_for_state(job_id, ENDED, timeout=timeout) if wait else {}
    return job_id, tmp_path / f"slurm-{job_id}.out", info


def requeued_sbatch(cluster: SlurmCluster, tmp_path: Path, interrupt: list[str], *, nodes: int):
    """A two-rank slurm/torchrun.sbatch job interrupted once past epoch 0 (`interrupt` + the
    job id), waited for through its requeue to its end; (job id, run directory, final
    `scontrol show job`, job log). Checks it completed after one restart and resumed (epoch
    0's line kept) rather than restarted."""
    runs_dir = tmp_path / "runs"
    job_id, log, _ = sbatch(cluster, tmp_path, [*long_run(2), f"paths.runs_dir={runs_dir}"],
                            wait=False, nodes=nodes)
    try:
        run = wait_until(lambda: past_epoch0(runs_dir), timeout=240, what="epoch 0")
        epoch0 = first_line(run / "metrics.jsonl")
        cluster.run([*interrupt, job_id])
        cluster.start_requeued(job_id)
        info = cluster.wait_for_state(job_id, ENDED, timeout=300)
    finally:
        cluster.run(["scancel", job_id], check=False)
    text = read_log(log)
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", (info, tail(text))
    assert first_line(run / "metrics.jsonl") == epoch0  # resumed, not restarted
    return job_id, run, info, text


def no_process_left(cluster: SlurmCluster, job_id: str, grace: float = 30) -> None:
    """No task and no slurmstepd of the job is alive (a step's slurmstepd may take a moment to
    exit after Slurm marks the job ended)."""
    deadline = time.monotonic() + grace
    while (left := cluster.job_processes(job_id)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"processes of job {job_id} outlived it: {left}"


def read_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else f"(no log at {path})"


# ---- 1. a sweep through submitit ------------------------------------------------------------
@pytest.fixture(scope="module")
def uninterrupted_sweep(slurm_cluster, tmp_path_factory):
    """seed=1,2 through hydra/launcher=slurm, run to the end without interruption."""
    base = tmp_path_factory.mktemp("sweep")
    runs_dir, log = base / "runs", base / "sweep.log"
    start = time.monotonic()
    rc = finish(sweep(slurm_cluster, runs_dir, log), timeout=240, cluster=slurm_cluster,
                runs_dir=runs_dir)
    return {"rc": rc, "runs_dir": runs_dir, "output": log.read_text(errors="replace"),
            "seconds": time.monotonic() - start}


def test_a_two_seed_sweep_runs_as_two_slurm_jobs_through_submitit(slurm_cluster, uninterrupted_sweep):
    out, runs_dir = uninterrupted_sweep["output"], uninterrupted_sweep["runs_dir"]
    assert uninterrupted_sweep["rc"] == 0, tail(out)
    assert "Submitit 'slurm' sweep output dir" in out
    runs = seed_runs(runs_dir)
    assert sorted(runs) == [1, 2], tail(out)
    job_ids = set()
    for seed, run in runs.items():
        summary = read_summary(run)
        assert summary["status"] == "completed" and summary["epochs_completed"] == EPOCHS, summary
        assert [m["epoch"] for m in read_metrics(run)] == list(range(EPOCHS))
        assert (run / "checkpoints" / "last.pt").exists() and "epoch" in (run / "train.log").read_text()
        # It ran under Slurm: submitit's log in the job names the Slurm job, and Slurm's job
        # completion log has that job COMPLETED on this node's partition.
        job_id = hydra_job_id(run)
        job_ids.add(job_id)
        assert f"JobEnvironment(job_id={job_id}," in submitit_log(runs_dir, job_id)
        records = completions(slurm_cluster, job_id)
        assert [r["JobState"] for r in records] == ["COMPLETED"], records
        assert records[0]["Partition"] == SlurmCluster.PARTITION
        assert records[0]["NodeList"] == SlurmCluster.NODE
        assert records[0]["WorkDir"] == str(REPO)
    assert len(job_ids) == 2  # two jobs (two tasks of one job array), not one job run twice
    submission = next((runs_dir / ".submitit").rglob("*_submission.sh")).read_text()
    assert "#SBATCH --requeue" in submission and "#SBATCH --signal=USR2@" in submission


# ---- 2. preemption: requeue and the time-limit signal ---------------------------------------
def test_requeued_and_time_limited_jobs_resume_their_own_run_with_identical_metrics(
        slurm_cluster, uninterrupted_sweep, tmp_path):
    """Seed 1 is requeued by `scontrol requeue` (as a preemption would), seed 2 gets SIGUSR2,
    the signal Slurm sends submitit's jobs `signal_delay_s` before their time limit; both in
    the middle of training. Each must come back, resume from its own checkpoint in the same
    run directory and end with metrics.jsonl equal to the uninterrupted run's."""
    assert uninterrupted_sweep["rc"] == 0, "the uninterrupted sweep failed (see the test above)"
    references = seed_runs(uninterrupted_sweep["runs_dir"])
    runs_dir, log = tmp_path / "runs", tmp_path / "sweep.log"
    how = {1: "requeue", 2: "time limit"}
    interrupted = {}
    with sweeping(slurm_cluster, runs_dir, log) as proc:
        for seed in (1, 2):
            run = wait_until(lambda: past_epoch0(runs_dir, seed), timeout=180,
                             what=f"epoch 0 of seed {seed}", alive=proc)
            job_id = hydra_job_id(run)
            if how[seed] == "requeue":
                slurm_cluster.run(["scontrol", "requeue", job_id])
            else:
                slurm_cluster.run(["scancel", "--signal=USR2", job_id])
            interrupted[seed] = (run, job_id, first_line(run / "metrics.jsonl"))
        for seed, (run, job_id, _) in interrupted.items():
            slurm_cluster.start_requeued(job_id)
        rc = finish(proc, timeout=240, cluster=slurm_cluster, runs_dir=runs_dir)
    out = log.read_text(errors="replace")
    assert rc == 0, tail(out)
    assert sorted(seed_runs(runs_dir)) == [1, 2]
    for seed, (run, job_id, epoch0) in interrupted.items():
        job_log = submitit_log(runs_dir, job_id)
        assert seed_runs(runs_dir)[seed] == run and hydra_job_id(run) == job_id
        # It was stopped mid-training (during an epoch after the first, which had ended when
        # the signal was sent), requeued, and ran again.
        stops = re.findall(r"^stopped: (SIG\w+) during epoch (\d+) \(after step (\d+)\)", job_log, re.M)
        assert len(stops) == 1, tail(job_log)
        signame, epoch, _ = stops[0]
        assert signame == ("SIGTERM" if how[seed] == "requeue" else "SIGUSR2"), stops
        assert 1 <= int(epoch) < EPOCHS, stops
        assert slurm_cluster.job(job_id).get("Restarts") == "1", slurm_cluster.job(job_id)
        assert job_log.count(f"JobEnvironment(job_id={job_id},") == 2, tail(job_log)
        if how[seed] == "time limit":
            assert "Requeued job" in job_log, tail(job_log)  # submitit's own requeue
        # It resumed (epoch 0's line, timings included, is the first attempt's) ...
        assert first_line(run / "metrics.jsonl") == epoch0
        assert read_summary(run)["status"] == "completed"
        # ... and its metrics equal the uninterrupted run's, value by value: no epoch lost or
        # repeated.
        resumed, reference = read_metrics(run), read_metrics(references[seed])
        assert [m["epoch"] for m in resumed] == list(range(EPOCHS))
        assert without_timing(resumed) == without_timing(reference)


# ---- 3. sbatch + srun + torchrun ------------------------------------------------------------
@pytest.fixture(scope="module")
def torchrun_job(slurm_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("torchrun")
    job_id, log, info = sbatch(slurm_cluster, tmp, [*long_run(2), f"paths.runs_dir={tmp}/runs"],
                               wait=True)
    return {"job_id": job_id, "log": log, "info": info, "runs_dir": tmp / "runs"}


@pytest.mark.distributed
def test_sbatch_torchrun_starts_two_ranks_that_rendezvous_from_slurms_environment(
        slurm_cluster, torchrun_job):
    job_id, text, info = torchrun_job["job_id"], read_log(torchrun_job["log"]), torchrun_job["info"]
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, tail(text))
    assert info["NodeList"] == SlurmCluster.NODE and info["NumTasks"] == "1", info
    # Two ranks from Slurm's GPU count (SLURM_GPUS_ON_NODE), the rendezvous at the first host of
    # the allocation (scontrol show hostnames $SLURM_JOB_NODELIST).
    assert re.search(rf"^job {job_id}: 1 node\(s\) x 2 GPU\(s\), rendezvous {SlurmCluster.NODE}:\d+$",
                     text, re.M), tail(text)
    [run] = seed_runs(torchrun_job["runs_dir"]).values()
    summary = read_summary(run)
    assert summary["status"] == "completed" and summary["world_size"] == 2, summary
    assert [m["epoch"] for m in read_metrics(run)] == list(range(EPOCHS))
    assert [r["JobState"] for r in completions(slurm_cluster, job_id)] == ["COMPLETED"]
    no_process_left(slurm_cluster, job_id)


@pytest.mark.distributed
def test_sbatch_job_signalled_before_its_time_limit_requeues_and_resumes(
        slurm_cluster, torchrun_job, tmp_path):
    """`#SBATCH --signal=B:USR1@300` delivers USR1 to the batch script 5 minutes before the
    time limit; its trap requeues the job, which resumes from its own checkpoint."""
    assert torchrun_job["info"]["JobState"] == "COMPLETED", "the uninterrupted torchrun job failed"
    job_id, run, info, text = requeued_sbatch(
        slurm_cluster, tmp_path, ["scancel", "--batch", "--signal=USR1"], nodes=1)
    assert f"time limit near: requeueing job {job_id} (restart 1 of 20)" in text
    stops = re.findall(r"^stopped: SIGTERM during epoch (\d+)", text, re.M)
    assert stops and all(1 <= int(e) < EPOCHS for e in stops), tail(text)
    assert read_summary(run)["status"] == "completed"
    [reference] = seed_runs(torchrun_job["runs_dir"]).values()
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(reference))


@pytest.mark.distributed
def test_a_two_task_sweep_job_is_one_two_rank_run_that_resumes_after_the_time_limit_signal(
        slurm_cluster, torchrun_job, tmp_path):
    """The profile's own layout, one Slurm task per rank (here 2): launch.py joins the tasks
    from SLURM_PROCID/SLURM_NTASKS. Slurm's time-limit signal reaches both tasks; they stop
    after the same step, rank 0 has submitit requeue the job, and the resumed run ends with
    the metrics of the same run started by torchrun (test above), value by value."""
    assert torchrun_job["info"]["JobState"] == "COMPLETED", "the torchrun job failed"
    runs_dir, log = tmp_path / "runs", tmp_path / "sweep.log"
    with sweeping(slurm_cluster, runs_dir, log, [*launcher(2), *long_run(2), "seed=42"]) as proc:
        run = wait_until(lambda: past_epoch0(runs_dir), timeout=180, what="epoch 0", alive=proc)
        job_id, epoch0 = hydra_job_id(run), first_line(run / "metrics.jsonl")
        slurm_cluster.run(["scancel", "--signal=USR2", job_id])
        slurm_cluster.start_requeued(job_id)
        rc = finish(proc, timeout=240, cluster=slurm_cluster, runs_dir=runs_dir)
    out = log.read_text(errors="replace")
    assert rc == 0, tail(out)
    rank0, rank1 = submitit_log(runs_dir, job_id), (runs_dir / ".submitit" / job_id)
    rank1 = "\n".join(p.read_text(errors="replace") for p in sorted(rank1.glob(f"{job_id}_1_log.*")))
    assert re.search(r"^stopped: SIGUSR2 during epoch \d+ \(after step \d+\); resumes", rank0, re.M), tail(rank0)
    assert "Requeued job" in rank0 and slurm_cluster.job(job_id)["Restarts"] == "1"
    assert "stopped: by SIGUSR2; leaving without a result" in rank1, tail(rank1)
    summary = read_summary(run)
    assert summary["status"] == "completed" and summary["world_size"] == 2, summary
    assert first_line(run / "metrics.jsonl") == epoch0
    [reference] = seed_runs(torchrun_job["runs_dir"]).values()
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(reference))


# ---- 4. failures ----------------------------------------------------------------------------
def _rank_pid(cluster: SlurmCluster, job_id: str, rank: int) -> int | None:
    from conftest import _all_pids, _proc_environ

    want = {f"SLURM_JOB_ID={job_id}".encode(), f"RANK={rank}".encode(), f"SLURM_CONF={cluster.conf}".encode()}
    for pid in _all_pids():
        if want <= set(_proc_environ(pid)):
            return pid
    return None


@pytest.mark.distributed
def test_a_killed_rank_fails_the_job_in_slurm_with_the_cause_in_its_log_and_no_process_left(
        slurm_cluster, tmp_path):
    runs_dir = tmp_path / "runs"
    job_id, log, _ = sbatch(slurm_cluster, tmp_path, [*long_run(2), f"paths.runs_dir={runs_dir}"],
                            wait=False)
    try:
        wait_until(lambda: files_named(runs_dir, "summary.json"),
                   timeout=180, what="the ranks to start training")
        pid = wait_until(lambda: _rank_pid(slurm_cluster, job_id, 1), timeout=60, what="rank 1")
        os.kill(pid, signal.SIGKILL)
        info = slurm_cluster.wait_for_state(job_id, ENDED, timeout=120)
    finally:
        slurm_cluster.run(["scancel", job_id], check=False)
    text = read_log(log)
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", (info, tail(text))
    assert [r["JobState"] for r in completions(slurm_cluster, job_id)] == ["FAILED"]
    assert "ChildFailedError" in text and f"Signal 9 (SIGKILL) received by PID {pid}" in text, tail(text)
    [run] = seed_runs(runs_dir).values()
    assert read_summary(run)["status"] == "failed"
    no_process_left(slurm_cluster, job_id)


@pytest.mark.distributed
def test_a_bad_config_reaching_the_ranks_fails_the_job_in_slurm_with_the_error_in_its_log(
        slurm_cluster, tmp_path):
    job_id, log, info = sbatch(slurm_cluster, tmp_path,
                               [*long_run(2), "trainer.batch_size=0", f"paths.runs_dir={tmp_path}/runs"],
                               wait=True, timeout=180)
    text = read_log(log)
    assert info["JobState"] == "FAILED" and info["ExitCode"] != "0:0", (info, tail(text))
    assert [r["JobState"] for r in completions(slurm_cluster, job_id)] == ["FAILED"]
    # the ranks refuse the value before training, with the one-line error and exit code 2
    # (torchrun may end the second rank before it gets as far)
    assert "error: trainer.batch_size: must be an integer >= 1, got 0" in text, tail(text)
    assert re.search(r"exitcode\s*: 2 ", text), tail(text)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").rglob("metrics.jsonl"))
    no_process_left(slurm_cluster, job_id)


# ---- the cluster itself ---------------------------------------------------------------------
def test_a_cluster_stops_every_process_it_started_and_changes_nothing_outside_its_folder(
        slurm_cluster):
    """A second cluster, started and stopped here with a job still running: afterwards none of
    its daemons, steps or tasks is alive, and the system's Slurm and munge paths are as they
    were (the session's cluster is checked the same way when the session ends)."""
    import tempfile

    cluster = SlurmCluster(tempfile.mkdtemp(prefix="accordion-slurm-check-"))
    try:
        cluster.start()
        job = cluster.run(["sbatch", "--parsable", "-o", "/dev/null", "--wrap", "sleep 600"]).stdout.strip()
        cluster.wait_for_state(job, {"RUNNING"}, timeout=60)
        daemons = {name: proc.pid for name, proc in cluster.procs.items()}
        assert sorted(daemons) == ["munged", "slurmctld", "slurmd"]
        # RUNNING is set before slurmstepd has started the job's shell: give it a moment
        wait_until(lambda: cluster.job_processes(job), timeout=30, what="the sleep job's process")
        assert cluster.job_processes(job), "the sleep job has no process"
        assert len(cluster.leftovers()) >= 4  # 3 daemons, a slurmstepd, the job's shell
    finally:
        cluster.stop()
    for name, proc in cluster.procs.items():
        assert proc.poll() is not None, f"{name} (pid {proc.pid}) still runs"
    assert cluster.leftovers() == []
    assert cluster.system_changes() == []
    import shutil

    shutil.rmtree(cluster.dir, ignore_errors=True)


# ---- 5. two nodes: two network namespaces, a slurmd in each ----------------------------------
@pytest.fixture(scope="module")
def two_node_torchrun_job(slurm_two_nodes, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("two_nodes")
    job_id, log, info = sbatch(slurm_two_nodes, tmp, [*long_run(2), f"paths.runs_dir={tmp}/runs"],
                               wait=True, nodes=2)
    return {"job_id": job_id, "log": log, "info": info, "runs_dir": tmp / "runs"}


@pytest.fixture(scope="module")
def one_host_reference(torchrun_job):
    """The same tiny long run as 2 ranks on one host (the one-node cluster's torchrun job):
    the value-by-value reference."""
    assert torchrun_job["info"]["JobState"] == "COMPLETED", "the one-node torchrun job failed"
    [run] = seed_runs(torchrun_job["runs_dir"]).values()
    return run


@pytest.mark.distributed
def test_sbatch_on_two_nodes_runs_one_torchrun_per_node_and_equals_one_host(
        slurm_two_nodes, two_node_torchrun_job, one_host_reference):
    """`sbatch --nodes 2 slurm/torchrun.sbatch`: one task per node, torchrun on each, the c10d
    rendezvous at the first node by its name; the run equals 2 ranks on one host."""
    job = two_node_torchrun_job
    job_id, text, info = job["job_id"], read_log(job["log"]), job["info"]
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", (info, tail(text))
    assert info["NumNodes"] == "2" and info["NodeList"] == "nodea,nodeb", info
    assert re.search(rf"^job {job_id}: 2 node\(s\) x 1 GPU\(s\), rendezvous nodea:\d+$", text, re.M), \
        tail(text)
    [run] = seed_runs(job["runs_dir"]).values()
    assert read_summary(run)["status"] == "completed" and read_summary(run)["world_size"] == 2
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(one_host_reference))
    no_process_left(slurm_two_nodes, job_id)


@pytest.mark.distributed
def test_a_two_node_sweep_job_through_submitit_puts_one_rank_on_each_node(
        slurm_two_nodes, one_host_reference, tmp_path):
    """`hydra/launcher=slurm hydra.launcher.nodes=2` (one task per node): submitit's srun starts
    a rank on each node, they join from Slurm's environment (MASTER_ADDR = the first node)."""
    runs_dir = tmp_path / "runs"
    args = [*launcher(1, nodes=2), *long_run(2)]
    with sweeping(slurm_two_nodes, runs_dir, tmp_path / "sweep.log", args) as proc:
        status = finish(proc, 400, slurm_two_nodes, runs_dir)
    assert status == 0, tail(read_log(tmp_path / "sweep.log"))
    [job_id] = _sweep_job_ids(runs_dir)
    [record] = completions(slurm_two_nodes, job_id)
    assert record["JobState"] == "COMPLETED" and record["NodeCnt"] == "2", record
    assert record["NodeList"] == "nodea,nodeb" and record["ProcCnt"] == "2", record
    [run] = seed_runs(runs_dir).values()
    assert read_summary(run)["world_size"] == 2
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(one_host_reference))
    no_process_left(slurm_two_nodes, job_id)


@pytest.mark.distributed
def test_a_two_node_job_requeued_mid_run_resumes_to_the_uninterrupted_metrics(
        slurm_two_nodes, two_node_torchrun_job, tmp_path):
    """`scontrol requeue` mid-epoch: both nodes' ranks stop, the job comes back on the nodes it
    gets and resumes from its own checkpoint."""
    assert two_node_torchrun_job["info"]["JobState"] == "COMPLETED", "the uninterrupted job failed"
    job_id, run, info, text = requeued_sbatch(slurm_two_nodes, tmp_path, ["scontrol", "requeue"],
                                              nodes=2)
    [reference] = seed_runs(two_node_torchrun_job["runs_dir"]).values()
    assert without_timing(read_metrics(run)) == without_timing(read_metrics(reference))
    no_process_left(slurm_two_nodes, job_id)
