"""One checkpoint per run holding every rank's state, written by rank 0.

Reducer memories and RNG streams differ between ranks, so each rank's part is gathered to rank 0
and stored under its rank; on resume every rank takes its own part back. The file is written to
a temporary name and renamed, so a job killed while saving keeps the previous checkpoint.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from accordion_repro.utils import atomic_write_bytes

CHECKPOINT_NAME = "last.pt"


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _gather_to_rank0(obj):
    if not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def save(run_dir: Path, shared: dict, per_rank: dict) -> None:
    """Collective: every rank calls it; rank 0 writes shared state plus all ranks' parts."""
    parts = _gather_to_rank0(per_rank)
    if parts is None:
        return
    buffer = io.BytesIO()
    torch.save({**shared, "ranks": parts}, buffer)
    atomic_write_bytes(Path(run_dir) / "checkpoints" / CHECKPOINT_NAME, buffer.getvalue())


def load(run_dir: Path, rank: int, world_size: int) -> tuple[dict, dict] | None:
    path = Path(run_dir) / "checkpoints" / CHECKPOINT_NAME
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=False)
    if len(state["ranks"]) != world_size:
        raise RuntimeError(f"{path} was written by {len(state['ranks'])} ranks; this job has "
                           f"{world_size}. Resume with the same world size or set trainer.resume=never.")
    return state, state["ranks"][rank]
