"""Rank 0's record of a run: metrics.jsonl, summary.json and (optionally) wandb.

The local files are the source of truth (the analysis reads only them); wandb mirrors them. A
resumed run drops metrics lines of epochs it will redo, so that the file of a resumed run equals
the file of a run that was never stopped.

This module is the one owner of a run's lifecycle in summary.json (`with_status`): `running`
while a job trains it, then `stopped` (resumable), `failed` or `completed`, each with its cause.
The trainer reports through RunLogger.set_status; the launcher, for what the ranks could not
record themselves (a rank killed, the ranks ended at once), through `report_status`.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accordion_repro.options import Options, Settings, option
from accordion_repro.run_layout import METRICS, SUMMARY
from accordion_repro.utils import atomic_write_text


def _text(o: Options, name: str, *, optional: bool = False) -> str | None:
    value = o.get(name)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value:
        raise o.error(name, f"must be a non-empty string{' or null' if optional else ''}, got {value!r}")
    return value


def _tags(o: Options, name: str) -> tuple[str, ...]:
    value = o.get(name)
    if not isinstance(value, (list, tuple)) or not all(isinstance(tag, str) for tag in value):
        raise o.error(name, f"must be a list of strings, got {value!r}")
    return tuple(value)


@dataclass(frozen=True)
class WandbSettings(Settings):
    """logger.wandb: where the run's wandb mirror goes (the local files stay the record)."""

    SECTION = "logger.wandb"
    mode: str = option(
        Options.choice, ("offline", "online", "disabled"),
        help="offline: local files to `wandb sync` later; online; disabled")
    project: str = option(_text, help="the wandb project")
    entity: str | None = option(_text, optional=True, help="the wandb entity (null: the default)")
    group: str | None = option(_text, optional=True, help="the wandb group (null: none)")
    tags: tuple[str, ...] = option(_tags, help="wandb tags")


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value




def read_summary(run_dir: Path) -> dict:
    """A run's summary.json, or {} when it is absent or unreadable."""
    try:
        value = json.loads((Path(run_dir) / SUMMARY).read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def write_summary(run_dir: Path, summary: dict) -> None:
    atomic_write_text(Path(run_dir) / SUMMARY,
                      json.dumps(summary, indent=2, sort_keys=True) + "\n")


# A status and the fields that say its cause; the next status replaces them, so a run that
# completes carries no error or stop of an earlier job.
STATUS_CAUSES = {"running": (), "stopped": ("stopped", "stop_signal"), "failed": ("error",),
                 "completed": ()}
_CAUSE_FIELDS = {name for causes in STATUS_CAUSES.values() for name in causes}


def with_status(summary: dict, status: str, **cause: Any) -> dict:
    """`summary` with `status` and its cause, and no cause of an earlier status."""
    if status not in STATUS_CAUSES or not set(cause) <= set(STATUS_CAUSES[status]):
        raise ValueError(f"status {status!r} with {sorted(cause)}: a status is one of "
                         f"{STATUS_CAUSES} with those causes")
    kept = {k: v for k, v in summary.items() if k != "status" and k not in _CAUSE_FIELDS}
    return {**kept, "status": status, **_jsonable(cause)}


def report_status(run_dir: Path, status: str, **cause: Any) -> None:
    """The launcher's report of how a job ended that its ranks could not record: written
    unless the ranks recorded `completed` (a peer lost while leaving does not undo a result)."""
    summary = read_summary(run_dir)
    if summary.get("status") != "completed":
        write_summary(run_dir, with_status(summary, status, **cause))


def stop_signal_of(run_dir: Path) -> tuple[int, str]:
    """(the signal that stopped the run, where it stopped) from summary.json; (0, '') when
    it is not stopped by a signal (running, completed, failed, or stop_after_epoch)."""
    summary = read_summary(run_dir)
    if summary.get("status") != "stopped" or not summary.get("stop_signal"):
        return 0, ""
    return int(summary["stop_signal"]), str(summary.get("stopped") or "by a signal")


class RunLogger:
    def __init__(self, run_dir: Path, *, config: dict, wandb: WandbSettings, wandb_id: str | None):
        self.run_dir = Path(run_dir)
        self.metrics_path = self.run_dir / METRICS
        self.summary: dict[str, Any] = read_summary(self.run_dir)
        self._wandb = None
        self.wandb_id = wandb_id
        if wandb.mode == "disabled":
            return
        import wandb as wandb_sdk

        os.environ.setdefault("WANDB_SILENT", "true")
        self.wandb_id = wandb_id or secrets.token_hex(6)
        self._wandb = wandb_sdk.init(
            project=wandb.project, entity=wandb.entity, group=wandb.group, tags=list(wandb.tags),
            mode=wandb.mode, dir=str(self.run_dir), id=self.wandb_id, resume="allow", config=config,
            name=config["run"]["name"],
        )

    def truncate_from(self, epoch: int) -> None:
        """Forget metrics of epochs >= epoch (they will be recomputed after a resume).

        A last line that does not parse is the torn tail of an append the process died in: it
        is dropped with the rest. An unparsable line before the last is damage, not a crash,
        and stops the job naming the line.
        """
        if not self.metrics_path.exists():
            return
        lines = [line for line in self.metrics_path.read_text().splitlines() if line.strip()]
        kept = []
        for number, line in enumerate(lines, start=1):
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):
                    break
                raise RuntimeError(f"{self.metrics_path} line {number} is not JSON; the log is "
                                   f"damaged (not a torn last line): fix or remove it, or rerun "
                                   f"with trainer.resume=never") from None
            if record["epoch"] < epoch:
                kept.append(line)
        atomic_write_text(self.metrics_path, "".join(line + "\n" for line in kept))

    def log_epoch(self, record: dict) -> str:
        """Append the epoch's line and return it (the checkpoint keeps every line, so a damaged
        metrics.jsonl can be rebuilt on resume: rundir.repair_metrics)."""
        record = _jsonable(record)
        line = json.dumps(record, sort_keys=False)
        with self.metrics_path.open("a") as f:
            f.write(line + "\n")
            f.flush()
            os.fsync(f.fileno())
        if self._wandb is not None:
            flat = {k: v for k, v in record.items() if isinstance(v, (int, float))}
            self._wandb.log(flat, step=record["epoch"])
        return line

    def update_summary(self, **fields: Any) -> None:
        self.summary.update(_jsonable(fields))
        write_summary(self.run_dir, self.summary)
        if self._wandb is not None:
            self._wandb.summary.update({k: v for k, v in fields.items() if isinstance(v, (int, float, str))})

    def set_status(self, status: str, **cause: Any) -> None:
        """The run's lifecycle step (with_status): running, stopped, failed or completed."""
        self.summary = with_status(self.summary, status, **cause)
        self.update_summary(status=status)

    def close(self) -> None:
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


class NullRunLogger:
    """What a rank other than 0 logs: nothing. Rank 0 alone writes the run directory; the
    trainer calls the same methods on every rank, so no call site asks which rank it is on."""

    wandb_id = None
    summary: dict[str, Any] = {}

    def __getattr__(self, name: str):
        """Each of RunLogger's methods, doing nothing."""
        if not hasattr(RunLogger, name):
            raise AttributeError(name)
        return lambda *args, **kwargs: None
