"""Comparison tables ("Accordion and its successors"): methods trained on the same seeds, each
stated with a t interval and paired seed by seed against the reference methods.

Final accuracies of a few seeds lie within a point of each other, so a table of means alone
cannot say which method wins. This one gives, per scale, each method's mean ± sample std with
its 95 % t confidence interval, its floats, and every method's difference from each reference
method (Accordion, rank 2) run from the same seed, with the mean, std and t interval of those
differences: a difference whose interval excludes 0 is one the seeds resolve. A trade-off
figure puts every run at its floats and final accuracy. Output is a pure function of the runs.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

import pandas as pd

from accordion_repro.analysis.collect import RUN_DIR, numerics_of
from accordion_repro.analysis.layout import ComparisonSpec, run_command
from accordion_repro.analysis.stats import paired_stats
from accordion_repro.utils import atomic_write_text

DASH = "–"
# The comparison tables whose presets reproduce_cpu.py's cpu_long study queues.
STUDY_QUEUED = ("successors",)


def t_interval(values: list[float]) -> tuple[float, float | None, float | None]:
    """(mean, sample std, half-width of the 95 % t interval) from analysis/stats.py; std and
    half-width are None with fewer than two values (one seed says nothing about the spread)."""
    summary = paired_stats(values)
    half = None if summary.ci_high is None else summary.ci_high - summary.mean
    return summary.mean, summary.std, half


def comparison_runs(spec: ComparisonSpec, runs: pd.DataFrame) -> pd.DataFrame:
    """summarize_runs() rows of the spec's cells (column `cell` = the cell's method), at the
    scales where at least one of the spec's own presets has a run: the borrowed cells
    (Accordion, rank 2 from Table 1) alone would make a table of nothing new."""
    if runs.empty:
        return runs.assign(cell=pd.Series(dtype=object))
    parts = []
    for cell in spec.cells:
        mine = runs[(runs["run.table"] == cell.table) & (runs["run.method"] == cell.method)
                    & (runs["model.name"] == cell.model)]
        parts.append(mine.assign(cell=cell.method, own=cell.table == spec.id))
    rows = pd.concat(parts, ignore_index=True)
    scales = set(rows.loc[rows["own"], "scale.name"])
    return rows[rows["scale.name"].isin(scales)].drop(columns="own").reset_index(drop=True)


def _pm(mean: float, std: float | None, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return format(mean, f"{sign}.2f") + ("" if std is None else f" ± {std:.2f}")


def _ci(mean: float, half: float | None, signed: bool = False) -> str:
    sign = "+" if signed else ""
    return DASH if half is None else f"[{mean - half:{sign}.2f}, {mean + half:{sign}.2f}]"


def _pairs(spec: ComparisonSpec, methods: list[str]) -> list[tuple[str, str]]:
    """(minuend, reference) for every method against each reference method, each pair once."""
    pairs = []
    for reference in spec.pairs:
        for method in methods:
            if method == reference or (method in spec.pairs and
                                        spec.pairs.index(method) > spec.pairs.index(reference)):
                continue
            pairs.append((method, reference))
    return pairs


def _block(spec: ComparisonSpec, scale: str, rows: pd.DataFrame,
           numerics: list[str]) -> tuple[list[str], list[list]]:
    """(markdown lines, csv rows) of one scale."""
    repeated = rows[rows.duplicated(["cell", "seed"], keep=False)]
    if not repeated.empty:  # a copied run directory: a pairing would pick one of them
        raise ValueError(f"{spec.id} at scale {scale}: more than one run per method and seed: "
                         + ", ".join(repeated[RUN_DIR]))
    seeds = sorted(int(s) for s in rows["seed"].unique())
    by_cell = {(row.cell, int(row.seed)): row for row in rows.itertuples()}
    labels = {cell.method: cell.label for cell in spec.cells}
    heading = f"## scale {scale}" + (f" ({' / '.join(numerics)})" if numerics else "")
    lines = [heading, "", "| Method | Seeds | Final accuracy (%), mean ± std | 95 % CI (t) "
             "| Floats per worker (M) | Measured time (s) |", "|---|---:|---:|---:|---:|---:|"]
    out: list[list] = []
    methods, missing = [], []
    for cell in spec.cells:
        finals = [by_cell[(cell.method, s)].final for s in seeds if (cell.method, s) in by_cell]
        if not finals:
            lines.append(f"| {cell.label} | 0 | {DASH} | {DASH} | {DASH} | {DASH} |")
            missing.append(cell)
            continue
        methods.append(cell.method)
        mine = [by_cell[(cell.method, s)] for s in seeds if (cell.method, s) in by_cell]
        mean, std, half = t_interval(finals)
        floats = statistics.fmean(row.total_floats for row in mine) / 1e6
        seconds = statistics.fmean(row.train_time_s for row in mine)
        lines.append(f"| {cell.label} | {len(finals)} | {_pm(mean, std)} | {_ci(mean, half)} "
                     f"| {floats:,.1f} | {seconds:,.0f} |")
        out += [[scale, "run", cell.label, row.seed, f"{row.final:.6f}",
                 f"{row.total_floats:.0f}"] for row in mine]
    lines += ["", "| Paired difference (same seed, points) | "
              + " | ".join(f"seed {s}" for s in seeds) + " | Mean ± std | 95 % CI (t) |",
              "|---|" + "---:|" * (len(seeds) + 2)]
    for method, reference in _pairs(spec, methods):
        differences = {s: by_cell[(method, s)].final - by_cell[(reference, s)].final
                       for s in seeds if (method, s) in by_cell and (reference, s) in by_cell}
        if not differences:
            continue
        name = f"{labels[method]} − {labels[reference]}"
        mean, std, half = t_interval(list(differences.values()))
        cells = [format(differences[s], "+.2f") if s in differences else DASH for s in seeds]
        lines.append(f"| {name} | " + " | ".join(cells)
                     + f" | {_pm(mean, std, signed=True)} | {_ci(mean, half, signed=True)} |")
        out += [[scale, "difference", name, s, f"{value:.6f}", ""]
                for s, value in differences.items()]
    if missing:
        lines += ["", "Missing at this scale; run: " + "; ".join(
            f"`{run_command(cell.preset, scale)}`" for cell in missing)]
    return lines + [""], out


def write_comparison_table(spec: ComparisonSpec, runs: pd.DataFrame,
                           out_dir: str | Path) -> list[Path]:
    """Write <out_dir>/<spec>.md and .csv from comparison_runs() rows; returns the paths.
    No runs: the table says so and lists the commands that make them."""
    lines = [f"{spec.title}: final test accuracy (%) over seeds (mean ± sample std, 95 % t "
             "confidence interval), floats per worker, and each method's difference from "
             + " and from ".join(cell.label for cell in spec.cells if cell.method in spec.pairs)
             + " run from the same seed (points). An interval that excludes 0 is a difference "
             "the seeds resolve.", ""]
    rows: list[list] = []
    for scale in sorted(runs["scale.name"].unique()) if not runs.empty else ():
        scale_runs = runs[runs["scale.name"] == scale]
        block_lines, block_rows = _block(spec, scale, scale_runs, numerics_of(scale_runs))
        lines += block_lines
        rows += block_rows
    if runs.empty:
        queued = (" (the scale=cpu_long study queues them: `python scripts/reproduce_cpu.py "
                  f"--study cpu_long --only '{spec.id}/*'`)" if spec.id in STUDY_QUEUED else "")
        lines += [f"No runs yet; run{queued}:",
                  *(f"- `{run_command(preset, 'cpu_long')}`" for preset in spec.own_presets), ""]
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["scale", "kind", "name", "seed", "value", "floats"])
    writer.writerows(rows)
    out_dir = Path(out_dir)
    return [atomic_write_text(out_dir / f"{spec.id}.md", "\n".join(lines)),
            atomic_write_text(out_dir / f"{spec.id}.csv", buffer.getvalue())]


def tradeoff_figure(spec: ComparisonSpec, runs: pd.DataFrame, frame: pd.DataFrame):
    """Final accuracy against floats per worker, one point per run, one panel per scale;
    frame: the runs' one-row-per-epoch rows (for the provenance line)."""
    from accordion_repro.analysis import figures  # the tables never pay for matplotlib (Agg set)
    import matplotlib.ticker
    import numpy as np

    scales = sorted(runs["scale.name"].unique())
    figure = figures._new_figure(6.6 * len(scales), 4.4)
    panels = np.atleast_1d(figure.subplots(1, len(scales)))
    for axes, scale in zip(panels, scales):
        at_scale = runs[runs["scale.name"] == scale]
        for index, cell in enumerate(spec.cells):
            mine = at_scale[at_scale["cell"] == cell.method].sort_values("seed")
            if mine.empty:
                continue
            axes.scatter(mine["total_floats"] / 1e6, mine["final"], s=28, label=cell.label,
                         color=figures.COLORS[index % len(figures.COLORS)],
                         marker=figures.MARKERS.get(cell.method, "o"),
                         edgecolors="black", linewidths=0.4)
        axes.set_xscale("log")
        axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(
            lambda v, _: f"{v:g}"))
        axes.set_xlabel("Floats communicated per worker (millions, log scale)")
        axes.set_ylabel("Final test accuracy (%)")
        axes.set_title(f"scale {scale}")
        axes.grid(True, alpha=0.3, which="both")
        axes.legend(loc="lower right")
    figure.suptitle(figures._wrapped(f"{spec.title}: final accuracy vs floats, one point per "
                                     f"run\n{figures.provenance(frame)}", figure))
    return figure
