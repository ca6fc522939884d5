"""One run per directory, one config per run: the checks made before any rank starts.

A run directory is the unit the analysis reads, so anything that mixes two runs in one
directory gives a silently wrong table. Three guards:
- a lock file (owner pid and host) so a second job on the same directory stops at once; a lock
  whose owner died on this host is stale and taken over;
- resuming or rerunning with a config that differs from the one in `resolved.yaml` is refused,
  naming the keys, unless the user asks: `trainer.resume=never` moves the old run aside (into
  `.replaced/<time>/`, which the analysis never reads) and starts afresh;
  `trainer.allow_config_change=true` continues with the new values and the trainer records the
  difference in every later epoch's metrics (`config_change`);
- a checkpoint that cannot be read safely stops the job here, naming the file.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
from contextlib import contextmanager, suppress
from pathlib import Path

import yaml

from accordion_repro.engine.checkpoint import checkpoint_path, read as read_checkpoint
from accordion_repro.utils import pid_alive

MOVABLE = ("resolved.yaml", "metrics.jsonl", "summary.json", "checkpoints", "wandb")

# Keys that say where or how visibly a run happens, not what it computes. A resumed run may
# change them freely; every other key must match the run already in the directory.
# `scale.*` only feeds other keys (trainer.epochs, model.width, ...), which are compared.
IGNORED_PREFIXES = ("logger.", "paths.", "scale.")
IGNORED_KEYS = {
    "trainer.resume", "trainer.progress", "trainer.stop_after_epoch",
    "trainer.allow_config_change", "dist.master_port", "dist.master_addr", "dist.timeout_s",
    "dataset.cache_dir", "dataset.root", "dataset.download",
}


class RunDirectoryInUse(RuntimeError):
    """Another live job holds the directory's lock."""


class ConfigMismatch(RuntimeError):
    """The directory holds a run with another config; the message names the keys."""


def _flatten(mapping, prefix: str = "") -> dict:
    flat = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _file_names(value) -> list[str]:
    return [os.path.basename(str(v)) for v in (value if isinstance(value, list) else [value])]


def config_delta(old: dict, new: dict) -> dict[str, list]:
    """{key: [old value, new value]} for every compared key that differs.

    dataset.path may move between machines; only its file names must still agree.
    """
    a, b = _flatten(old), _flatten(new)
    delta = {}
    for key in sorted(set(a) | set(b)):
        if key != "scale.name" and (key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES)):
            continue
        before, after = a.get(key, "<absent>"), b.get(key, "<absent>")
        if key == "dataset.path" and _file_names(before) == _file_names(after):
            continue
        if before != after:
            delta[key] = [before, after]
    return delta


def move_aside(run_dir: Path) -> Path | None:
    """Move the run files into run_dir/.replaced/<UTC time>/; None when there was nothing."""
    present = [name for name in MOVABLE if (run_dir / name).exists()]
    if not present:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    target = run_dir / ".replaced" / stamp
    target.mkdir(parents=True)
    for name in present:
        shutil.move(str(run_dir / name), str(target / name))
    return target


def check_existing_run(run_dir: Path, resolved: dict) -> dict[str, list]:
    """Refuse a changed config or an unreadable checkpoint; return the delta that was allowed.

    With trainer.resume=never an existing run is moved aside first (nothing is compared).
    """
    run_dir = Path(run_dir)
    trainer = resolved["trainer"]
    if trainer["resume"] == "never":
        moved = move_aside(run_dir)
        if moved is not None:
            print(f"trainer.resume=never: the previous run in {run_dir} was moved to {moved}")
        return {}
    previous = run_dir / "resolved.yaml"
    has_run = any((run_dir / name).exists() for name in ("metrics.jsonl", "summary.json", "checkpoints"))
    if not previous.exists() or not has_run:
        return {}
    delta = config_delta(yaml.safe_load(previous.read_text()) or {}, resolved)
    if delta and not trainer.get("allow_config_change", False):
        shown = "; ".join(f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in list(delta.items())[:8])
        more = f" (and {len(delta) - 8} more)" if len(delta) > 8 else ""
        raise ConfigMismatch(
            f"{run_dir} holds a run with a different config ({shown}{more}). Rerun with the "
            f"run's own config to resume it, trainer.resume=never to move it aside and start "
            f"afresh, or trainer.allow_config_change=true to continue it with the new values")
    if checkpoint_path(run_dir).exists():
        read_checkpoint(checkpoint_path(run_dir))  # CheckpointError in one line if unreadable
    return delta


@contextmanager
def run_lock(run_dir: Path):
    """Hold run_dir/.lock for the life of the job; refuse when a live job holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / ".lock"
    me = {"pid": os.getpid(), "host": socket.gethostname(),
          "since": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                owner = json.loads(path.read_text() or "{}")
            except (OSError, json.JSONDecodeError):
                owner = {}
            pid, host = owner.get("pid"), owner.get("host")
            if host == me["host"] and isinstance(pid, int) and not pid_alive(pid):
                print(f"note: taking over the stale lock of pid {pid} (no longer running) on "
                      f"{run_dir}")
                path.unlink(missing_ok=True)
                continue
            where = f"pid {pid} on host {host}" + (f" since {owner['since']}" if "since" in owner else "")
            raise RunDirectoryInUse(
                f"{run_dir} is in use by another run ({where}); wait for it to end, or pick "
                f"another directory. If that job is dead, delete {path}")
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    try:
        yield
    finally:
        with suppress(OSError, json.JSONDecodeError):
            if json.loads(path.read_text()).get("pid") == me["pid"]:
                path.unlink()
