"""Read run directories into one tidy DataFrame: one row per run and epoch.

Tables and figures are pure functions of this frame, so everything the analysis knows about a
run comes from its directory (resolved.yaml, metrics.jsonl, summary.json), never from wandb.
A run that cannot be read whole is skipped with a warning naming it, so one crashed job does not
stop the tables of the runs that finished.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
import yaml

from accordion_repro.models.factory import SETTINGS as MODEL_SETTINGS
from accordion_repro.models.settings import SIZE_OPTIONS
from accordion_repro.options import defaults_of
from accordion_repro.run_layout import METRICS, RESOLVED, SUMMARY
from accordion_repro.utils import flatten

RUN_FILES = (RESOLVED, METRICS, SUMMARY)
REQUIRED_METRICS = ("epoch", "steps", "floats_sent", "bytes_sent", "collectives",
                    "epoch_time_s", "compute_time_s")
FINAL_METRICS = ("test_acc", "val_ppl")
RUN_DIR = "run_dir"
UNFINISHED_STATUSES = ("running", "stopped")   # resumable: the job is going or was preempted


# Size options of the paper models (their defaults); a run that changes one is a reduced model,
# and every table and figure built from it says so.
_DEFAULTS = {key: value for settings in MODEL_SETTINGS.values()
             for key, value in defaults_of(settings).items()}
PAPER_MODEL_SIZES = {f"model.{key}": _DEFAULTS[key] for key in SIZE_OPTIONS}


def model_variant(values: Mapping[str, Any]) -> str | None:
    """'resnet18 (width=0.25)' for a run whose model differs in size from the paper's, else None."""
    diffs = []
    for key, paper in PAPER_MODEL_SIZES.items():
        value = values.get(key)
        if value is not None and not pd.isna(value) and float(value) != paper:
            diffs.append(f"{key.split('.', 1)[1]}={float(value):g}")
    return f"{values.get('model.name')} ({', '.join(diffs)})" if diffs else None


MACHINE_FILE = "machine.json"  # a study folder's record of the CPU its older runs ran on


def cpu_kind(values: Mapping[str, Any]) -> str:
    """'CPU AMD EPYC, AVX2 cap': the CPU a run's summary.json records (engine/numerics.py), its
    instruction set, and whether the study held it to a narrower one; for runs from before
    summary.json recorded it, the study folder's machine.json, else 'CPU not recorded'."""
    model = values.get("summary.numerics.cpu_model")
    if isinstance(model, str):
        capability = values.get("summary.numerics.cpu_capability") or "capability unknown"
        capped = any(isinstance(value, str) for key, value in values.items()
                     if key.startswith("summary.numerics.isa_cap."))
        return f"CPU {model}, {capability}{' cap' if capped else ''}"
    recorded = values.get("machine.cpu")
    return f"CPU {recorded}" if isinstance(recorded, str) else "CPU not recorded"


def numerics(values: Mapping[str, Any]) -> str:
    """'fp32; CPU AMD EPYC, AVX2 cap' or 'bf16 autocast, channels_last; CPU ...': the precision,
    layout and CPU a run computed with; every table block and figure says it."""
    precision = values.get("trainer.precision")
    parts = [f"{precision} autocast" if isinstance(precision, str) and precision != "fp32"
             else "fp32"]
    channels_last = values.get("trainer.channels_last")
    if isinstance(channels_last, (bool, np.bool_)) and channels_last:
        parts.append("channels_last")
    return f"{', '.join(parts)}; {cpu_kind(values)}"


def numerics_keys(columns) -> list[str]:
    """The columns numerics() reads."""
    return [c for c in columns if c in ("trainer.precision", "trainer.channels_last", "machine.cpu")
            or c.startswith("summary.numerics.")]


def numerics_of(frame: pd.DataFrame) -> list[str]:
    """The numerics (precision, layout, CPU) among a frame's runs (one-row-per-epoch or
    one-row-per-run)."""
    return _distinct(frame, "numerics", numerics)


def first_value(frame: pd.DataFrame, column: str):
    """The column's first non-null value; None where it has none or the frame lacks it."""
    values = frame[column].dropna() if column in frame else ()
    return values.iloc[0] if len(values) else None


def run_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a one-row-per-epoch (or already one-row-per-run) frame."""
    return frame.drop_duplicates(RUN_DIR) if RUN_DIR in frame else frame


def model_variants(frame: pd.DataFrame) -> list[str]:
    """The reduced models among a frame's runs (one-row-per-epoch or one-row-per-run)."""
    return _distinct(frame, "model.variant", model_variant)


def _distinct(frame: pd.DataFrame, column: str, describe) -> list[str]:
    """The distinct non-empty descriptions of a frame's runs: `column` of summarize_runs()
    output, or describe(config values) per run of a one-row-per-epoch frame."""
    if frame.empty:
        return []
    found = frame[column] if column in frame else run_rows(frame).apply(
        lambda row: describe(row.to_dict()), axis=1)
    return sorted({str(v) for v in found.dropna() if v})


class SkippedRunWarning(UserWarning):
    """A run directory was left out of the tables (broken or unfinished)."""


class RunDirectoryError(ValueError):
    """A run directory cannot be read; the message says which file and why."""


class UnfinishedRunError(RunDirectoryError):
    """The run is still going or was stopped to be resumed: not broken, just not ready."""


@dataclass
class Collection:
    frame: pd.DataFrame                      # one row per (run, epoch)
    broken: list[tuple[str, str]] = field(default_factory=list)      # (run dir, reason)
    unfinished: list[tuple[str, str]] = field(default_factory=list)  # (run dir, reason)


def find_run_dirs(runs_dir: str | os.PathLike) -> tuple[list[Path], list[tuple[Path, str]]]:
    """Run directories under runs_dir (any depth), and folders that hold some but not all of
    the run files (reported as broken). A run directory's own subfolders are not searched."""
    complete: list[Path] = []
    incomplete: list[tuple[Path, str]] = []
    for folder, subfolders, files in os.walk(runs_dir):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        present = [name for name in RUN_FILES if name in files]
        if not present:
            continue
        subfolders[:] = []
        missing = [name for name in RUN_FILES if name not in files]
        if missing:
            incomplete.append((Path(folder), "missing " + ", ".join(missing)))
        else:
            complete.append(Path(folder))
    return sorted(complete), sorted(incomplete)


def _read_json_object(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RunDirectoryError(f"{path.name} is not valid JSON ({error})") from None
    if not isinstance(value, dict):
        raise RunDirectoryError(f"{path.name} does not hold a JSON object")
    return value


def read_config(run_dir: Path) -> dict:
    try:
        config = yaml.safe_load((run_dir / RESOLVED).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise RunDirectoryError(f"resolved.yaml cannot be parsed ({error})") from None
    if not isinstance(config, dict):
        raise RunDirectoryError("resolved.yaml does not hold a mapping")
    return config


def read_metrics(run_dir: Path) -> list[dict]:
    records = []
    try:
        lines = (run_dir / METRICS).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise RunDirectoryError(f"metrics.jsonl cannot be read ({error})") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise RunDirectoryError(f"metrics.jsonl line {number} is not JSON ({error})") from None
        if not isinstance(record, dict):
            raise RunDirectoryError(f"metrics.jsonl line {number} is not a JSON object")
        missing = [key for key in REQUIRED_METRICS if key not in record]
        if not any(key in record for key in FINAL_METRICS):
            missing.append(" or ".join(FINAL_METRICS))
        if missing:
            raise RunDirectoryError(f"metrics.jsonl line {number} lacks {', '.join(missing)}")
        records.append(record)
    if not records:
        raise RunDirectoryError("metrics.jsonl holds no epoch")
    return sorted(records, key=lambda record: record["epoch"])


def check_every_epoch(summary: dict, records: list[dict]) -> None:
    """A completed run's metrics.jsonl holds each of epochs 0..N-1 once, N its summary's
    epochs_completed: a lost line would silently make an earlier epoch the run's result."""
    done = summary.get("epochs_completed")
    if not isinstance(done, int) or isinstance(done, bool) or done < 1:
        raise RunDirectoryError(f"summary.json says completed but gives no epochs_completed "
                                f"({done!r})")
    epochs = [record["epoch"] for record in records]
    if epochs == list(range(done)):
        return
    missing = sorted(set(range(done)) - set(epochs))
    extra = sorted({e for e in epochs if epochs.count(e) > 1 or e not in range(done)})
    found = "; ".join(([f"lacks epochs {missing}"] if missing else []) +
                      ([f"holds epochs {extra} twice or beyond it"] if extra else []))
    raise RunDirectoryError(f"summary.json says completed after {done} epochs, but metrics.jsonl "
                            f"{found}: the record is damaged, not a result")


def load_run(run_dir: Path, name: str) -> list[dict]:
    """Rows of one completed run: flattened config + summary.* + the epoch's metrics."""
    summary = _read_json_object(run_dir / SUMMARY)
    status = summary.get("status")
    if status in UNFINISHED_STATUSES:
        raise UnfinishedRunError(f"summary.status is {status!r}")
    if status != "completed":
        raise RunDirectoryError(f"summary.status is {status!r}, not 'completed'")
    config = flatten(read_config(run_dir))
    records = read_metrics(run_dir)
    check_every_epoch(summary, records)
    last = records[-1]
    for key in (*[k for k in FINAL_METRICS if k in last], "train_loss", "test_loss"):
        value = last.get(key, 0.0)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise RunDirectoryError(f"its last epoch's {key} is {value!r} (NaN/inf is logged as "
                                    f"null): the run diverged, not a result")
    summary_columns = {f"summary.{key}": value for key, value in flatten(summary).items()}
    return [{RUN_DIR: name, **config, **summary_columns, **record} for record in records]


def collect_runs(runs_dir: str | os.PathLike) -> Collection:
    """Every completed run under runs_dir as one frame; warns once per skipped directory."""
    runs_dir = Path(runs_dir)
    collection = Collection(frame=pd.DataFrame())
    if not runs_dir.is_dir():
        warnings.warn(f"no runs directory at {runs_dir}; tables will list every preset as missing",
                      SkippedRunWarning, stacklevel=2)
        return collection
    complete, incomplete = find_run_dirs(runs_dir)
    machines = {folder.parent: _read_json_object(folder).get("cpu")
                for folder in [runs_dir / MACHINE_FILE, *runs_dir.glob(f"*/{MACHINE_FILE}")]
                if folder.is_file()}
    collection.broken.extend((str(path), reason) for path, reason in incomplete)
    rows: list[dict] = []
    for run_dir in complete:
        name = run_dir.relative_to(runs_dir).as_posix()
        machine = next((cpu for folder, cpu in machines.items() if folder in run_dir.parents), None)
        try:
            rows.extend({**row, "machine.cpu": machine} if machine else row
                        for row in load_run(run_dir, name))
        except UnfinishedRunError as error:
            collection.unfinished.append((str(run_dir), str(error)))
        except RunDirectoryError as error:
            collection.broken.append((str(run_dir), str(error)))
    for kind, skipped in (("broken", collection.broken), ("unfinished", collection.unfinished)):
        for path, reason in skipped:
            warnings.warn(f"skipping {kind} run {path}: {reason}", SkippedRunWarning, stacklevel=2)
    collection.frame = pd.DataFrame(rows)
    return collection
