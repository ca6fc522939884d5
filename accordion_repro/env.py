"""Where this process sits in a job: rank and world size from torchrun's or Slurm's variables.

Its own module, without torch, so that checking a config (config.py) and starting ranks
(launch.py) read the same answer without one importing the other.
"""

from __future__ import annotations

import os


def slurm_env() -> dict | None:
    """Rank layout of an srun-started task (one task per rank), or None."""
    if "SLURM_PROCID" not in os.environ or int(os.environ.get("SLURM_NTASKS", "1")) <= 1:
        return None
    return {"RANK": os.environ["SLURM_PROCID"], "WORLD_SIZE": os.environ["SLURM_NTASKS"],
            "LOCAL_RANK": os.environ.get("SLURM_LOCALID", "0")}


def env_world_size() -> int | None:
    """World size given by torchrun or Slurm, None when this process is on its own."""
    layout = os.environ if "WORLD_SIZE" in os.environ and "RANK" in os.environ else slurm_env() or {}
    return int(layout["WORLD_SIZE"]) if "WORLD_SIZE" in layout else None


def env_rank() -> int:
    """This process's rank under torchrun or Slurm (0 when it is on its own)."""
    layout = os.environ if "RANK" in os.environ else slurm_env() or {}
    return int(layout.get("RANK", 0))


def local_cuda_device(device_count: int) -> int:
    """The CUDA device this process trains on: its LOCAL_RANK (torchrun, the local spawner, or
    Slurm's SLURM_LOCALID) modulo the devices it can see (one, where Slurm binds a GPU per task)."""
    if device_count < 1:
        raise RuntimeError("trainer.device=cuda but no CUDA device is visible to this process")
    slurm = slurm_env() if "LOCAL_RANK" not in os.environ else None
    local_rank = int((slurm or os.environ).get("LOCAL_RANK", "0"))
    return local_rank % device_count
