"""Start the ranks of one run: in this process, as N local processes, or by joining torchrun/Slurm.

Workers receive the resolved config as a plain dict and never run Hydra, so every rank sees the
same values. A rank that dies takes the whole job down with its rank and cause: local ranks are
watched by torch.multiprocessing (which terminates the survivors), and under torchrun the
elastic agent does the same.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


class RankFailed(RuntimeError):
    """A rank exited or raised; the message names the rank and the cause."""


def _slurm_env() -> dict | None:
    """Rank layout of an srun-started task (one task per rank), or None."""
    if "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return None
    return {
        "RANK": os.environ["SLURM_PROCID"],
        "WORLD_SIZE": os.environ["SLURM_NTASKS"],
        "LOCAL_RANK": os.environ.get("SLURM_LOCALID", "0"),
    }


def env_world_size() -> int | None:
    """World size given by torchrun or Slurm, None when this process is on its own."""
    if "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        return int(os.environ["WORLD_SIZE"])
    slurm = _slurm_env()
    return int(slurm["WORLD_SIZE"]) if slurm else None


def env_rank() -> int:
    """This process's rank under torchrun or Slurm (0 when it is on its own)."""
    if "RANK" in os.environ:
        return int(os.environ["RANK"])
    slurm = _slurm_env()
    return int(slurm["RANK"]) if slurm else 0


def _first_slurm_host() -> str:
    nodelist = os.environ.get("SLURM_JOB_NODELIST") or os.environ.get("SLURM_NODELIST", "")
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
        if out:
            return out[0]
    except (OSError, subprocess.SubprocessError):
        pass
    # Fallback parser for "node[01-04,07],other": the first host of the first entry.
    m = re.match(r"([^,\[]+)(?:\[(\d+))?", nodelist)
    if not m:
        raise RuntimeError("cannot find the master host: SLURM_JOB_NODELIST is empty; set MASTER_ADDR")
    return m.group(1) + (m.group(2) or "")


def _join_env_group(backend: str, timeout_s: int) -> None:
    slurm = _slurm_env() if "RANK" not in os.environ else None
    if slurm:
        os.environ.update(slurm)
        os.environ.setdefault("MASTER_ADDR", _first_slurm_host())
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))
    dist.init_process_group(backend=backend, init_method="env://",
                            timeout=datetime.timedelta(seconds=timeout_s))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def resolve_backend(cfg: dict) -> str:
    backend = cfg["dist"]["backend"]
    if backend != "auto":
        return backend
    return "nccl" if _use_cuda(cfg) else "gloo"


def _use_cuda(cfg: dict) -> bool:
    device = cfg["trainer"]["device"]
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def _limit_threads(local_world: int) -> None:
    """N CPU ranks on one host must not each start a thread per core."""
    if "OMP_NUM_THREADS" not in os.environ and local_world > 1:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))


def _run(cfg: dict, run_dir: Path) -> None:
    from accordion_repro.engine.trainer import Trainer

    Trainer(cfg, run_dir).fit()


def _spawned_worker(local_rank: int, cfg: dict, run_dir: str, world_size: int, addr: str,
                    port: int) -> None:
    os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(local_rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(world_size))
    _die_with_parent()
    _limit_threads(world_size)
    dist.init_process_group(backend=resolve_backend(cfg), init_method="env://", rank=local_rank,
                            world_size=world_size,
                            timeout=datetime.timedelta(seconds=int(cfg["dist"]["timeout_s"])))
    try:
        _run(cfg, Path(run_dir))
    finally:
        dist.destroy_process_group()


def launch(cfg: dict, run_dir: Path) -> None:
    """Run the job described by a resolved config; raise RankFailed if any rank fails."""
    launcher = cfg["dist"]["launcher"]
    if launcher in ("auto", "env") and env_world_size() is not None:
        _join_env_group(resolve_backend(cfg), int(cfg["dist"]["timeout_s"]))
        _limit_threads(int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        try:
            _run(cfg, run_dir)
        finally:
            dist.destroy_process_group()
        return
    if launcher == "env":
        raise RankFailed("dist.launcher=env but neither torchrun (RANK, WORLD_SIZE) nor Slurm "
                         "(SLURM_PROCID, SLURM_NTASKS > 1) environment variables are set")
    nproc = int(cfg["dist"]["nproc_per_node"])
    if nproc == 1:
        _run(cfg, run_dir)
        return
    port = int(cfg["dist"]["master_port"] or free_port())
    context = mp.start_processes(_spawned_worker, args=(cfg, str(run_dir), nproc, cfg["dist"]["master_addr"], port),
                                 nprocs=nproc, join=False, start_method="spawn")
    previous = signal.signal(signal.SIGTERM, _raise_system_exit)
    try:
        while not context.join():
            pass
    except mp.ProcessRaisedException as exc:
        cause = str(exc).strip().splitlines()
        raise RankFailed(f"rank {exc.error_index} failed: {cause[-1] if cause else exc}\n{exc}") from None
    except mp.ProcessExitedException as exc:
        raise RankFailed(f"rank {exc.error_index} died: {exc}") from None
    finally:
        signal.signal(signal.SIGTERM, previous)
        for process in context.processes:  # on Ctrl-C or SIGTERM, leave no rank behind
            if process.is_alive():
                process.terminate()
                process.join(10)


def _raise_system_exit(signum, frame):
    raise SystemExit(128 + signum)


def _die_with_parent() -> None:
    """Linux: a local rank gets SIGKILL when the launching process dies, even by SIGKILL."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
