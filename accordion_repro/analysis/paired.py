"""Figure 2 (b) in numbers: each arm's final accuracy per seed, and paired differences.

At the end of a run the curves of Figure 2 (b) lie within a point of each other, about as far
apart as the seeds move one arm. Whether *where* high compression is applied matters more than
*how much* is then a question of a difference between two arms trained from the same seed (the
same initialisation and data order) against the spread of each arm between seeds; this table
states both, one block per scale, so that a reader need not redo them from the run directories.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

import pandas as pd

from accordion_repro.analysis.collect import RUN_DIR, numerics_of
from accordion_repro.analysis.layout import FigureSpec, run_command
from accordion_repro.utils import atomic_write_text

DASH = "–"
# (minuend, subtrahend) methods of the paired differences: where rank 1 goes at equal floats,
# whether Accordion keeps the low level's accuracy, and how far apart the two static levels are.
PAIRS = (("high_outside", "high_inside"), ("accordion", "static_low"),
         ("accordion", "static_high"), ("static_low", "static_high"))


def final_accuracies(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run of a one-row-per-epoch frame: its method, scale, seed, the test
    accuracy of its last epoch (`final`) and its floats in all (`floats`, per worker)."""
    rows = []
    for run_dir, epochs in frame.groupby(RUN_DIR, sort=True):
        last = epochs.sort_values("epoch", kind="stable").iloc[-1]
        rows.append({RUN_DIR: run_dir, "method": last["run.method"], "scale": last["scale.name"],
                     "seed": int(last["seed"]), "final": float(last["test_acc"]),
                     "floats": float(epochs["floats_sent"].sum())})
    return pd.DataFrame(rows, columns=[RUN_DIR, "method", "scale", "seed", "final", "floats"])


def _mean_std(values: list[float], signed: bool = False) -> str:
    sign = "+" if signed else ""
    if not values:
        return DASH
    if len(values) == 1:
        return format(values[0], f"{sign}.2f")
    return f"{statistics.mean(values):{sign}.2f} ± {statistics.stdev(values):.2f}"


def _block(spec: FigureSpec, scale: str, finals: pd.DataFrame,
           numerics: list[str]) -> tuple[list[str], list[list]]:
    """(markdown lines, csv rows) of one scale."""
    seeds = sorted(finals["seed"].unique())
    repeated = finals[finals.duplicated(["method", "seed"], keep=False)]
    if not repeated.empty:  # e.g. a copied run directory: a pairing would pick one of them
        raise ValueError(f"{spec.id} at scale {scale}: more than one run per method and seed: "
                         + ", ".join(repeated[RUN_DIR]))
    by_cell = {(row.method, row.seed): row for row in finals.itertuples()}
    labels = {cell.method: cell.label for cell in spec.cells}
    methods = [cell.method for cell in spec.cells if (finals["method"] == cell.method).any()]
    seed_columns = [f"seed {seed}" for seed in seeds]
    heading = f"## scale {scale}" + (f" ({' / '.join(numerics)})" if numerics else "")
    lines = [heading, "", "| Run | " + " | ".join(seed_columns) + " | Mean ± std | Floats (M) |",
             "|---|" + "---:|" * (len(seeds) + 2)]
    rows = []
    for method in methods:
        values = [by_cell[(method, seed)].final for seed in seeds if (method, seed) in by_cell]
        floats = statistics.mean(row.floats for (m, _), row in by_cell.items() if m == method)
        cells = [format(by_cell[(method, s)].final, ".2f") if (method, s) in by_cell else DASH
                 for s in seeds]
        lines.append(f"| {labels[method]} | " + " | ".join(cells)
                     + f" | {_mean_std(values)} | {floats / 1e6:,.1f} |")
        rows += [[scale, "run", labels[method], seed, f"{by_cell[(method, seed)].final:.6f}"]
                 for seed in seeds if (method, seed) in by_cell]
    lines += ["", "| Paired difference (same seed, points) | " + " | ".join(seed_columns)
              + " | Mean ± std |", "|---|" + "---:|" * (len(seeds) + 1)]
    for minuend, subtrahend in PAIRS:
        if minuend not in methods or subtrahend not in methods:
            continue
        name = f"{labels[minuend]} − {labels[subtrahend]}"
        differences = {seed: by_cell[(minuend, seed)].final - by_cell[(subtrahend, seed)].final
                       for seed in seeds
                       if (minuend, seed) in by_cell and (subtrahend, seed) in by_cell}
        cells = [format(differences[s], "+.2f") if s in differences else DASH for s in seeds]
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {_mean_std(list(differences.values()), signed=True)} |")
        rows += [[scale, "difference", name, seed, f"{value:.6f}"]
                 for seed, value in differences.items()]
    return lines + [""], rows


def write_paired_table(spec: FigureSpec, frame: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write <out_dir>/<figure>_paired.md and .csv from the figure's one-row-per-epoch runs
    (twins included); returns the paths. No runs: the commands that make them."""
    finals = final_accuracies(frame if not frame.empty else pd.DataFrame(columns=[RUN_DIR]))
    lines = [f"{spec.title}, panel (b) in numbers: final test accuracy (%) of each run by seed, "
             "mean ± sample std over seeds, and differences between two runs of the same seed "
             "(points).", ""]
    rows: list[list] = []
    for scale in sorted(finals["scale"].unique()):
        numerics = numerics_of(frame[frame["scale.name"] == scale])
        block_lines, block_rows = _block(spec, scale, finals[finals["scale"] == scale], numerics)
        lines += block_lines
        rows += block_rows
    if finals.empty:
        lines += ["No runs yet; run:", *(f"- `{run_command(cell.preset, 'paper')}`"
                                         for cell in spec.cells), ""]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["scale", "kind", "name", "seed", "value"])
    writer.writerows(rows)
    out_dir = Path(out_dir)
    return [atomic_write_text(out_dir / f"{spec.id}_paired.md", "\n".join(lines)),
            atomic_write_text(out_dir / f"{spec.id}_paired.csv", buffer.getvalue())]
