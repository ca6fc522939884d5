"""One checkpoint per run holding every rank's state, written by rank 0.

Reducer memories and RNG streams differ between ranks, so each rank's part is gathered to rank 0
and stored under its rank; on resume every rank takes its own part back. The file is written to
a temporary name and renamed, so a job killed while saving keeps the previous checkpoint.

The file starts with a SHA-256 of the rest, checked before anything is loaded: a checkpoint
damaged inside its tensor data would otherwise load and resume silently with wrong weights.

Checkpoints hold only tensors and plain Python values and are read with
`torch.load(weights_only=True)`, so a crafted `last.pt` cannot run code on resume. The few
non-plain values of a training state (the schedule's Plan, NumPy's RNG state) are written in a
tagged plain form and rebuilt on load; anything else is refused when saving.
"""

from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from accordion_repro.accordion import Plan
from accordion_repro.comm.collectives import distributed
from accordion_repro.run_layout import CHECKPOINTS, LAST_CHECKPOINT
from accordion_repro.transfer import to_cpu
from accordion_repro.utils import atomic_write_bytes

_PLAIN = (type(None), bool, int, float, str, bytes, torch.Tensor)
# b"accordion-checkpoint sha256 <64 hex digits>\n", then torch.save's bytes.
_MAGIC = b"accordion-checkpoint sha256 "
_HEADER_SIZE = len(_MAGIC) + 64 + 1


class CheckpointError(RuntimeError):
    """A checkpoint cannot be read; the message names the file and what to do."""


def checkpoint_path(run_dir: Path) -> Path:
    return Path(run_dir) / CHECKPOINTS / LAST_CHECKPOINT


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
        # every device's stream, as many as this process sees (a resume may see fewer or more)
        for index, device_state in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(device_state, index)


def to_plain(value):
    """Tensors, plain values and containers of them; Plan and ndarray in a tagged plain form."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return {"__ndarray__": [value.dtype.str, list(value.shape), value.tobytes()]}
    if isinstance(value, Plan):
        return {"__plan__": to_plain(value.to_dict())}
    if isinstance(value, dict):
        return {k: to_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_plain(v) for v in value)
    raise TypeError(f"cannot checkpoint a {type(value).__name__} safely; store tensors and plain "
                    f"values (or add a tagged form to engine/checkpoint.py)")


def from_plain(value):
    if isinstance(value, dict):
        if "__ndarray__" in value and len(value) == 1:
            dtype, shape, data = value["__ndarray__"]
            return np.frombuffer(data, dtype=np.dtype(dtype)).reshape(shape).copy()
        if "__plan__" in value and len(value) == 1:
            return Plan.from_dict(from_plain(value["__plan__"]))
        return {k: from_plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(from_plain(v) for v in value)
    return value


def save(run_dir: Path, shared: dict, per_rank: dict) -> None:
    """Collective: every rank calls it; rank 0 writes shared state plus all ranks' parts."""
    parts = [per_rank]
    if distributed():
        per_rank = to_cpu(per_rank)  # before pickling: not onto rank 0's (or rank k's) GPU
        parts = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
        dist.gather_object(per_rank, parts, dst=0)
    if parts is None:
        return
    buffer = io.BytesIO()
    torch.save(to_plain({**shared, "ranks": parts}), buffer)
    atomic_write_bytes(checkpoint_path(run_dir), sealed(buffer.getvalue()))


def sealed(payload: bytes) -> bytes:
    """torch.save bytes behind the checksum header that `read` checks."""
    return _MAGIC + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload


def _verified_payload(path: Path) -> bytes:
    """The torch.save bytes of a checkpoint whose checksum matches; ValueError otherwise."""
    data = Path(path).read_bytes()
    if not data.startswith(_MAGIC):
        raise ValueError("no checksum header: not a checkpoint of this suite, or damaged at its start")
    header, payload = data[:_HEADER_SIZE], data[_HEADER_SIZE:]
    if hashlib.sha256(payload).hexdigest().encode() != header[len(_MAGIC):-1]:
        raise ValueError("its contents do not match their checksum (the file is damaged)")
    return payload


def read(path: Path) -> dict:
    """The whole checkpoint, loaded safely; CheckpointError in one line if it cannot be."""
    try:
        payload = _verified_payload(path)
        state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not isinstance(state.get("ranks"), list):
            raise ValueError("not a checkpoint of this suite (no per-rank parts)")
        return from_plain(state)
    except Exception as exc:
        cause = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        if "Unsupported global" in str(exc) or "weights_only" in str(exc).lower():
            cause = "it holds objects other than tensors and plain values, refused unread"
        raise CheckpointError(
            f"cannot resume from {path}: {cause[:300]}. Start afresh with trainer.resume=never "
            f"(the old run is moved aside), or delete the file") from None


def load(run_dir: Path, rank: int, world_size: int) -> tuple[dict, dict] | None:
    path = checkpoint_path(run_dir)
    if not path.exists():
        return None
    state = read(path)
    if len(state["ranks"]) != world_size:
        raise CheckpointError(f"{path} was written by {len(state['ranks'])} ranks; this job has "
                              f"{world_size}. Resume with the same world size or set "
                              f"trainer.resume=never.")
    return state, state["ranks"][rank]
