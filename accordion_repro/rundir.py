"""One run per directory, one config per run: the checks made before any rank starts.

A run directory is the unit the analysis reads, so anything that mixes two runs in one
directory gives a silently wrong table. The guards:
- a lock file (owner pid and host) so a second job on the same directory stops at once; a lock
  whose owner died on this host is stale and taken over;
- resuming or rerunning with a config that differs from the one the run was trained with (the
  checkpoint's own copy, else `resolved.yaml`) is refused, naming the keys, unless the user
  asks: `trainer.resume=never` moves the old run aside (into `.replaced/<time>/`, which the
  analysis never reads) and starts afresh; `trainer.allow_config_change=true` continues with
  the new values of the keys that can change on resume (CHANGEABLE: each takes effect from the
  first resumed epoch) and the trainer records the difference in every later epoch's metrics
  (`config_change`); a key the checkpoint's state holds (the model, the compressor, the
  schedule's levels, the batch) is refused even then. A resolved.yaml deleted or damaged
  beside a checkpoint is restored from it; a run without either cannot be resumed;
- a checkpoint that cannot be read safely (its checksum does not match, it holds code) stops
  the job here, naming the file;
- the temporary files of writes a killed job left (a checkpoint's `.last.pt.*.tmp`) are deleted;
- metrics.jsonl must hold exactly the epochs the checkpoint has passed: a torn or missing line
  is rewritten from the checkpoint's copy of every line, or, for a checkpoint without one, the
  job is refused naming the missing epochs.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
from contextlib import contextmanager, suppress
from dataclasses import fields
from pathlib import Path

import yaml

from accordion_repro.engine.checkpoint import checkpoint_path, read as read_checkpoint
from accordion_repro.accordion.detector import DetectorSettings
from accordion_repro.engine.settings import TrainerSettings
from accordion_repro.run_layout import CHECKPOINTS, LOCK, METRICS, RESOLVED, SUMMARY
from accordion_repro.settings import added_keys, key_of, option_keys
from accordion_repro.utils import atomic_write_text, flatten, pid_alive

MOVABLE = (RESOLVED, METRICS, SUMMARY, CHECKPOINTS, "wandb")

# Keys that say where or how visibly a run happens, not what it computes: the options marked
# `option(on_resume="free")`. A resumed run may change them freely; every other key must match
# the run already in the directory. `scale.*` only feeds other keys (trainer.epochs,
# model.width, ...), which are compared; logger and paths have no option that computes.
# conf/config.yaml's exclude_keys (overrides left out of the directory name) must all be here:
# tests/test_run_integrity.py checks it. dist.master_port was an option once: older run
# directories still hold it.
IGNORED_PREFIXES = ("logger.", "paths.", "scale.")
IGNORED_KEYS = {*option_keys(on_resume="free"), "dist.master_port"}


class RunDirectoryInUse(RuntimeError):
    """Another live job holds the directory's lock."""


# Keys that trainer.allow_config_change=true may change on resume, the options marked
# `option(on_resume="changeable")` (not optim.name: another optimizer cannot take the
# checkpoint's state), and the run's names: each is read afresh from the config when the job
# starts (the optimizer's hyperparameters are set over the checkpoint's), so it takes effect
# from the first resumed epoch; tests/test_run_integrity.py shows it per family.
CHANGEABLE_PREFIXES = ("run.",)
CHANGEABLE_KEYS = set(option_keys(on_resume="changeable"))


def changeable_on_resume(key: str) -> bool:
    return key in CHANGEABLE_KEYS or key.startswith(CHANGEABLE_PREFIXES)


class ConfigMismatch(RuntimeError):
    """The directory holds a run with another config; the message names the keys."""


class RunRecordGap(RuntimeError):
    """metrics.jsonl lacks epochs the checkpoint has passed and they cannot be rebuilt."""


# Keys added after runs were made (`option(added=...)`, and conf/config.yaml's top-level
# `plugins`, 0.3.0): a run directory whose config lacks one ran as this value.
ADDED_KEYS = {**added_keys(), "plugins": []}
# A static schedule without `detect` runs no detector: its detector options compute nothing.
DETECTOR_KEYS = {key_of(DetectorSettings, f.name) for f in fields(DetectorSettings)}


def _runs_no_detector(flat: dict) -> bool:
    return flat.get("schedule.name") == "static" and not flat.get("schedule.detect", False)


def _unread_level_keys(flat: dict) -> set[str]:
    """compressor.rank / ratio under a schedule that sets every layer's level: never read (null
    since issue 39; runs made before it recorded the schedule's starting level there)."""
    from accordion_repro.accordion import SCHEDULES
    from accordion_repro.comm.registry import compressor_settings

    schedule = SCHEDULES.get(flat.get("schedule.name"))
    if schedule is None or not schedule.sets_levels:
        return set()
    return {f"compressor.{s.LEVEL[0]}" for s in compressor_settings().values()
            if s.LEVEL[0] is not None}


def _file_names(value) -> list[str]:
    return [os.path.basename(str(v)) for v in (value if isinstance(value, list) else [value])]


def config_delta(old: dict, new: dict) -> dict[str, list]:
    """{key: [old value, new value]} for every compared key that differs.

    dataset.path may move between machines; only its file names must still agree.
    """
    a, b = flatten(old), flatten(new)
    inert = DETECTOR_KEYS if _runs_no_detector(a) and _runs_no_detector(b) else set()
    inert = inert | (_unread_level_keys(a) & _unread_level_keys(b))
    delta = {}
    for key in sorted(set(a) | set(b)):
        if key != "scale.name" and (key in IGNORED_KEYS or key.startswith(IGNORED_PREFIXES)):
            continue
        if key in inert:
            continue
        before = a.get(key, ADDED_KEYS.get(key, "<absent>"))
        after = b.get(key, ADDED_KEYS.get(key, "<absent>"))
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


def check_existing_run(run_dir: Path, resolved: dict, trainer: TrainerSettings) -> dict[str, list]:
    """Refuse a changed config, an unreadable checkpoint or a gap in metrics.jsonl; return the
    delta that was allowed.

    `resolved` is the run's record (compared key by key with the run already there); `trainer`
    its checked settings (RunSettings.trainer), which say whether to resume and allow a change.
    With trainer.resume=never an existing run is moved aside first (nothing is compared).
    """
    run_dir = Path(run_dir)
    remove_interrupted_writes(run_dir)
    if trainer.resume == "never":
        moved = move_aside(run_dir)
        if moved is not None:
            print(f"trainer.resume=never: the previous run in {run_dir} was moved to {moved}")
        return {}
    ckpt = checkpoint_path(run_dir)
    state = read_checkpoint(ckpt) if ckpt.exists() else None  # CheckpointError in one line
    trained = _trained_config(run_dir, state)
    if trained is None:
        if trainer.allow_config_change:
            raise ConfigMismatch(_nothing_to_continue(run_dir, resolved))
        return {}
    delta = config_delta(trained, resolved)
    if delta and not trainer.allow_config_change:
        raise ConfigMismatch(
            f"{run_dir} holds a run with a different config ({_shown(delta)}). Rerun with the "
            f"run's own config to resume it, trainer.resume=never to move it aside and start "
            f"afresh, or trainer.allow_config_change=true to continue it with the new values")
    fixed = {k: v for k, v in delta.items() if not changeable_on_resume(k)}
    if fixed and state is not None:
        raise ConfigMismatch(
            f"trainer.allow_config_change=true cannot change {_shown(fixed)} on resume: the "
            f"checkpoint {ckpt} holds state built for the old value (model, compressor memory, "
            f"schedule levels or batch). Rerun with the old value, or trainer.resume=never to "
            f"start afresh")
    if state is not None:
        repair_metrics(run_dir, state)
    return delta


def _nothing_to_continue(run_dir: Path, resolved: dict) -> str:
    """Why trainer.allow_config_change=true on a directory with no run is refused (issue 56: a
    changed override renamed the directory, and a continuation silently became a new run),
    naming the runs of the same preset and seed it may have meant."""
    name, seed = (resolved.get("run") or {}).get("name"), resolved.get("seed")
    text, marker = run_dir.as_posix(), f"/{name}/"
    candidates = []
    if name and marker in text:
        root = Path(text[:text.rindex(marker) + len(marker)])
        candidates = sorted(path.parent for path in root.glob(f"**/seed{seed}/resolved.yaml")
                            if path.parent != run_dir)[:3]
    # quoted for the shell and for Hydra's grammar (the name holds '=' and ',')
    found = "".join(f" 'hydra.run.dir=\"{path}\"'" for path in candidates)
    return (f"trainer.allow_config_change=true continues a run, but {run_dir} holds none: the "
            f"directory is named after the overrides, so a changed value names a new one. To "
            f"continue a run, name its directory: "
            + (f"runs of {name} seed {seed}:{found}" if found else "hydra.run.dir=<it>")
            + "; to start afresh, drop trainer.allow_config_change")


def remove_interrupted_writes(run_dir: Path) -> None:
    """Delete the temporary files of writes a killed job left (utils.atomic_write's
    `.<name>.*.tmp`: a whole checkpoint each); under the lock, no job is writing them."""
    for folder in (run_dir, run_dir / CHECKPOINTS):
        for path in folder.glob(".*.tmp"):
            path.unlink(missing_ok=True)


def _shown(delta: dict[str, list]) -> str:
    shown = "; ".join(f"{k}: {v[0]!r} -> {v[1]!r}" for k, v in list(delta.items())[:8])
    return shown + (f" (and {len(delta) - 8} more)" if len(delta) > 8 else "")


def _trained_config(run_dir: Path, state: dict | None) -> dict | None:
    """The config the run in run_dir was trained with: the checkpoint's own copy, else
    resolved.yaml; None for an empty directory. A resolved.yaml deleted or damaged beside a
    checkpoint is restored from it; run files with no config to compare are refused (a damaged
    resolved.yaml in one line, naming it)."""
    previous = run_dir / RESOLVED
    on_disk, damage = _read_resolved(previous)
    in_checkpoint = state.get("config") if state is not None else None
    if in_checkpoint is not None:
        if on_disk is None:
            atomic_write_text(previous, yaml.safe_dump(in_checkpoint, sort_keys=False))
            print(f"note: {previous} was {damage or 'missing'}; restored from "
                  f"{checkpoint_path(run_dir)}")
        return in_checkpoint
    if damage:
        raise ConfigMismatch(
            f"{previous} is {damage} and no checkpoint holds the run's config, so it cannot be "
            f"compared with this one. Repair or restore it, or rerun with trainer.resume=never "
            f"to move the old run aside and start afresh")
    present = [name for name in (METRICS, SUMMARY, CHECKPOINTS)
               if (run_dir / name).exists()]
    if not present:
        return None
    if on_disk is None:
        raise ConfigMismatch(
            f"{run_dir} holds a run ({', '.join(present)}) but no resolved.yaml, so its config "
            f"cannot be compared with this one. Restore {previous}, or rerun with "
            f"trainer.resume=never to move the old run aside and start afresh")
    return on_disk


def _read_resolved(path: Path) -> tuple[dict | None, str | None]:
    """(the config in resolved.yaml, None), or (None, why it cannot be used): 'damaged (...)'
    for a file that does not parse as a mapping, None for an absent one."""
    if not path.exists():
        return None, None
    try:
        value = yaml.safe_load(path.read_text()) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return None, f"damaged ({str(exc).strip().splitlines()[0]})"
    if not isinstance(value, dict):
        return None, f"damaged (holds a {type(value).__name__}, not a mapping)"
    return value, None


def repair_metrics(run_dir: Path, state: dict) -> None:
    """Make metrics.jsonl hold exactly epochs 0..the checkpoint's epoch before a resume.

    The trainer drops the lines of later epochs itself (they are redone). A torn, damaged or
    missing line of an earlier epoch is rewritten from the checkpoint's copy of every line;
    a checkpoint of an older version has no copy, and the job is refused naming the epochs.
    """
    path = run_dir / METRICS
    last = int(state["epoch"])
    kept, epochs = [], []
    for line in (path.read_text().splitlines() if path.exists() else []):
        try:
            epoch = json.loads(line)["epoch"]
        except (ValueError, KeyError, TypeError):
            continue
        if epoch <= last:
            kept.append(line)
            epochs.append(epoch)
    lines = state.get("metric_lines")
    if lines is not None and len(lines) == last + 1:
        if kept != list(lines):
            atomic_write_text(path, "".join(line + "\n" for line in lines))
            print(f"note: {path} {_what_was_wrong(kept, epochs, lines)}; rewritten from "
                  f"{checkpoint_path(run_dir)} (epochs 0-{last})")
        return
    if epochs != list(range(last + 1)):
        missing = sorted(set(range(last + 1)) - set(epochs))
        what = f"lacks epochs {missing}" if missing else f"holds epochs {epochs}"
        raise RunRecordGap(
            f"{path} {what}, but the checkpoint {checkpoint_path(run_dir)} has passed epoch "
            f"{last} and holds no copy to rebuild them from (an older version wrote it). Rerun "
            f"with trainer.resume=never to move the run aside and start afresh")


def _what_was_wrong(kept: list[str], epochs: list[int], lines: list[str]) -> str:
    """'lacked or had damaged records of epochs [1]; held epochs [0] twice' (the non-empty
    parts): what made metrics.jsonl differ from the checkpoint's copy of its lines."""
    damaged = [e for e, line in enumerate(lines) if line not in kept]
    twice = sorted({e for e in epochs if epochs.count(e) > 1})
    unordered = not damaged and not twice
    parts = [f"lacked or had damaged records of epochs {damaged}"] if damaged else []
    parts += [f"held epochs {twice} more than once"] if twice else []
    return "; ".join(parts + (["held its records out of order"] if unordered else []))


def record_job_processes(run_dir: Path, pids: list[int]) -> None:
    """Add the job's other processes (local ranks, their forkserver) to the lock this process
    holds on run_dir, so that run_lock takes it over only when none of them lives either."""
    path = Path(run_dir) / LOCK
    with suppress(OSError, json.JSONDecodeError):
        owner = json.loads(path.read_text())
        if owner.get("pid") == os.getpid():
            atomic_write_text(path, json.dumps({**owner, "processes": sorted(pids)}))


@contextmanager
def run_lock(run_dir: Path):
    """Hold run_dir/.lock for the life of the job; refuse when a live job holds it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK
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
            job = [p for p in owner.get("processes", []) if isinstance(p, int)]
            if host == me["host"] and isinstance(pid, int) and not pid_alive(pid):
                living = [p for p in job if pid_alive(p)]
                if living:  # the launcher is gone, a rank of its job is not
                    raise RunDirectoryInUse(
                        f"{run_dir} is in use: pid {living[0]} of the job of pid {pid} (no longer "
                        f"running) still runs; stop it (kill {' '.join(map(str, living))}) or "
                        f"wait for it to end")
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
