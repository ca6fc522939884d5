"""Labels and set-up notes taken from what the runs did, not from the paper's layout.

The layout (analysis/layout.py) names the paper's cells, e.g. "B 512" and "Accordion 512<->4096";
a run at another scale trains with other batch sizes (scale=cpu: 64 and 512) and another data
set, so tables and figures label such runs with the values they logged: the per-epoch
`global_batch` of metrics.jsonl and `schedule.low` / `schedule.high` of resolved.yaml. Where a
cell has no run, the layout's paper label stays.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

import pandas as pd

from accordion_repro.analysis.collect import run_rows
from accordion_repro.analysis.layout import DATASET_TITLES


def _ints(values: Iterable) -> list[int]:
    """Sorted distinct integers among values (None, NaN and non-numbers left out)."""
    found = set()
    for value in values:
        if isinstance(value, (list, tuple)):
            found.update(_ints(value))
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(number):
            found.add(int(round(number)))
    return sorted(found)


def _column(frame: pd.DataFrame, column: str) -> list:
    return list(frame[column].dropna()) if column in frame else []


def batch_label(method: str, batches: Iterable, lows: Iterable = (), highs: Iterable = ()) -> str | None:
    """'B 64' for a fixed batch, 'Accordion 64<->512' for batch-size Accordion, from the global
    batch sizes the runs used (and, for Accordion, the schedule's low / high); None without data.
    Several values (runs that differ) are joined with '/'."""
    seen = _ints(batches)
    if method == "accordion":
        low, high = _ints(lows), _ints(highs)
        if not (low and high):
            if not seen:
                return None
            low, high = [seen[0]], [seen[-1]]
        return f"Accordion {'/'.join(map(str, low))}<->{'/'.join(map(str, high))}"
    return f"B {'/'.join(map(str, seen))}" if seen else None


def run_batch_label(method: str, frame: pd.DataFrame) -> str | None:
    """batch_label() of the runs in frame: run-epoch rows (`global_batch`) or summarize_runs()
    rows (`global_batches`)."""
    batches = _column(frame, "global_batches") + _column(frame, "global_batch")
    return batch_label(method, batches, _column(frame, "schedule.low"),
                       _column(frame, "schedule.high"))


def batch_sizes_text(values: Iterable) -> str:
    """'512 / 16,384': distinct global batch sizes, thousands separated."""
    return " / ".join(f"{value:,}" for value in _ints(values))


def data_family(row: dict) -> str:
    """The data set a run trained on, in the paper's terms: 'CIFAR-10' for dataset=npz on the
    CIFAR-10 files (told by the file names in summary.json's `data` and `dataset.path`),
    'synthetic CIFAR-10' for the offline stand-in, else the dataset name."""
    name = str(row.get("dataset.name") or "unknown")
    if name in DATASET_TITLES:
        return DATASET_TITLES[name]
    if name.startswith("synthetic_"):
        rest = name[len("synthetic_"):]
        return f"synthetic {DATASET_TITLES.get(rest, rest)}"
    text = f"{row.get('summary.data') or ''} {row.get('dataset.path') or ''}".lower()
    for pattern, title in ((r"cifar-?100", "CIFAR-100"), (r"cifar-?10(?!\d)", "CIFAR-10"),
                           (r"wikitext", "WikiText-2")):
        if re.search(pattern, text):
            return title
    return name


def stand_in_notes(frame: pd.DataFrame, paper_dataset: str) -> list[str]:
    """'CIFAR-10 stand-in for CIFAR-100' for each data set of the runs that is not the paper's."""
    paper = DATASET_TITLES.get(paper_dataset, paper_dataset)
    families = sorted({data_family(row) for row in run_rows(frame).to_dict("records")})
    return [f"{family} stand-in for {paper}" for family in families if family != paper]


def data_text(frame: pd.DataFrame) -> str:
    """What the runs trained and were scored on, from summary.json's `data` (its head, before
    the parenthesised detail), the examples evaluated and the epochs run."""
    if frame.empty:
        return "no runs"
    rows = run_rows(frame)
    described = sorted({str(text).split(" (", 1)[0] for text in _column(rows, "summary.data")})
    parts = ["; ".join(described) if described
             else ", ".join(sorted(set(map(str, _column(rows, "dataset.name"))))) or "unknown data"]
    evaluated = _ints(_column(frame, "eval_examples"))
    if evaluated:
        parts.append(f"scored on {'/'.join(map(str, evaluated))} test examples")
    if "epoch" in frame and "run_dir" in frame:
        epochs = _ints(frame.groupby("run_dir")["epoch"].max() + 1)
        if epochs:
            parts.append(f"{'/'.join(map(str, epochs))} epochs")
    return "; ".join(parts)
