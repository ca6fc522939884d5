"""Same-seed comparisons in numbers: each run's final value per seed, and paired differences.

At the end of a run the curves of Figure 2 (b) lie within a point of each other, about as far
apart as the seeds move one arm. Whether *where* high compression is applied matters more than
*how much*, or whether Accordion keeps the low level's accuracy, is then a question of a
difference between two runs trained from the same seed (the same initialisation and data order)
against the spread between seeds. Each difference row states what its seeds allow
(analysis/stats.py): mean ± sample std, a 95 % t interval, the paired-t p value and on how many
seeds the difference is positive; one block per scale (and per model for a table), so that a
reader need not redo them from the run directories.
"""

from __future__ import annotations

import csv
import io
import statistics
from pathlib import Path

import pandas as pd

from accordion_repro.analysis.collect import RUN_DIR, numerics_of
from accordion_repro.analysis.layout import FigureSpec, TableSpec, run_command
from accordion_repro.analysis.stats import PairedStats, holm, matches, paired_stats
from accordion_repro.utils import atomic_write_text

DASH = "–"
# (minuend, subtrahend) methods of the paired differences: where rank 1 goes at equal floats
# (the inside arm against each arm outside the critical regimes, the latest against the earliest
# quiet epochs, the latest against no rank 1 at all), whether Accordion keeps the
# low level's accuracy, and how far apart the two static levels are. A pair is shown where both
# methods have runs.
PAIRS = (("high_outside", "high_inside"), ("high_earliest", "high_inside"),
         ("high_random", "high_inside"), ("high_outside", "high_earliest"),
         ("high_outside", "static_low"), ("accordion", "static_low"),
         ("accordion", "static_high"), ("static_low", "static_high"))
# The study's three headline contrasts (issue 55), reported with Holm-adjusted p values as well
# as raw ones: rank 1 just before each decay (the latest non-critical epochs) or at random
# non-critical epochs, against rank 1 in the critical ones; and whether Accordion keeps rank 2's
# accuracy. The fp32 study runs more seeds of any of them whose interval spans zero.
HEADLINE = (("high_outside", "high_inside"), ("high_random", "high_inside"),
            ("accordion", "static_low"))
METRIC_WORDS = {"test_acc": "final test accuracy (%)", "val_ppl": "final validation perplexity"}


# What two runs compared seed by seed must share: the scale and sizes, the numerics (precision,
# layout, threads), and what decides the last bits of the code that ran (PowerSGD's packing,
# the instruction set and any cap on it). Runs from before a key was recorded read "unrecorded".
PAIRING_KEYS = ("scale.name", "dataset.name", "model.width", "trainer.epochs",
                "trainer.batch_size", "trainer.precision", "trainer.channels_last",
                "summary.cpu_threads", "summary.numerics.powersgd_packing",
                "summary.numerics.cpu_capability")
PAIRING_PREFIXES = ("summary.numerics.isa_cap.",)  # one column per capped library
UNRECORDED = "unrecorded"


class PairingError(ValueError):
    """Two runs of one seed that differ in what a paired comparison must hold equal."""


def _pairing_key(row: pd.Series) -> dict:
    keys = [*PAIRING_KEYS, *(c for c in row.index if c.startswith(PAIRING_PREFIXES))]
    key = {}
    for column in keys:
        value = row.get(column)
        key[column] = UNRECORDED if value is None or (not isinstance(value, str) and pd.isna(value)) \
            else value
    return key


def final_accuracies(frame: pd.DataFrame, metric: str = "test_acc") -> pd.DataFrame:
    """One row per run of a one-row-per-epoch frame: its method, scale, model, seed, the
    `metric` of its last epoch (`final`), its floats in all (`floats`, per worker) and what a
    pairing must hold equal (`key`, PAIRING_KEYS)."""
    rows = []
    for run_dir, epochs in frame.groupby(RUN_DIR, sort=True):
        last = epochs.sort_values("epoch", kind="stable").iloc[-1]
        rows.append({RUN_DIR: run_dir, "method": last["run.method"], "scale": last["scale.name"],
                     "model": last.get("model.name"), "seed": int(last["seed"]),
                     "final": float(last[metric]),
                     "floats": float(epochs["floats_sent"].sum()), "key": _pairing_key(last)})
    return pd.DataFrame(rows, columns=[RUN_DIR, "method", "scale", "model", "seed", "final",
                                       "floats", "key"])


def check_pairable(a, b) -> None:
    """PairingError naming the first key two runs (final_accuracies rows) differ in; a key one
    of them lacks counts as different (a run from before the key was recorded)."""
    for column in sorted(set(a.key) | set(b.key)):
        left, right = a.key.get(column, UNRECORDED), b.key.get(column, UNRECORDED)
        if left != right:
            name = column.removeprefix("summary.")
            raise PairingError(f"refusing to pair {getattr(a, RUN_DIR)} with {getattr(b, RUN_DIR)}"
                               f": {name} is {left!r} against {right!r}")


def _mean_std(values: list[float], signed: bool = False) -> str:
    sign = "+" if signed else ""
    if not values:
        return DASH
    if len(values) == 1:
        return format(values[0], f"{sign}.2f")
    return f"{statistics.mean(values):{sign}.2f} ± {statistics.stdev(values):.2f}"


def _p_text(p: float | None) -> str:
    return DASH if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"


def _statistics_cells(stats: PairedStats) -> list[str]:
    """95 % CI, p and the sign count of one difference row."""
    if stats.ci_low is None:
        return [DASH, DASH, f"{stats.positive} of {stats.n}"]
    return [f"[{stats.ci_low:+.2f}, {stats.ci_high:+.2f}]", _p_text(stats.p),
            f"{stats.positive} of {stats.n}"]


def _statistics_rows(scale: str, name: str, stats: PairedStats) -> list[list]:
    values = {"mean": stats.mean, "std": stats.std, "ci95_low": stats.ci_low,
              "ci95_high": stats.ci_high, "p_paired_t": stats.p, "positive": stats.positive,
              "n": stats.n}
    return [[scale, kind, name, "", f"{value:.6f}" if isinstance(value, float) else value]
            for kind, value in values.items() if value is not None]


def _block(heading: str, scale: str, cells: list[tuple[str, str]], finals: pd.DataFrame,
           owner: str) -> tuple[list[str], list[list]]:
    """(markdown lines, csv rows) of one block: `cells` are the (method, label) pairs shown."""
    seeds = sorted(finals["seed"].unique())
    repeated = finals[finals.duplicated(["method", "seed"], keep=False)]
    if not repeated.empty:  # e.g. a copied run directory: a pairing would pick one of them
        raise ValueError(f"{owner} at scale {scale}: more than one run per method and seed: "
                         + ", ".join(repeated[RUN_DIR]))
    by_cell = {(row.method, row.seed): row for row in finals.itertuples()}
    labels = dict(cells)
    methods = [method for method, _ in cells if (finals["method"] == method).any()]
    seed_columns = [f"seed {seed}" for seed in seeds]
    lines = [heading, "", "| Run | " + " | ".join(seed_columns) + " | Mean ± std | Floats (M) |",
             "|---|" + "---:|" * (len(seeds) + 2)]
    rows = []
    for method in methods:
        values = [by_cell[(method, seed)].final for seed in seeds if (method, seed) in by_cell]
        floats = statistics.mean(row.floats for (m, _), row in by_cell.items() if m == method)
        shown = [format(by_cell[(method, s)].final, ".2f") if (method, s) in by_cell else DASH
                 for s in seeds]
        lines.append(f"| {labels[method]} | " + " | ".join(shown)
                     + f" | {_mean_std(values)} | {floats / 1e6:,.1f} |")
        rows += [[scale, "run", labels[method], seed, f"{by_cell[(method, seed)].final:.6f}"]
                 for seed in seeds if (method, seed) in by_cell]
    pairs = [(a, b) for a, b in PAIRS if a in methods and b in methods]
    if not pairs:
        return lines + [""], rows
    lines += ["", "| Paired difference (same seed) | " + " | ".join(seed_columns)
              + " | Mean ± std | 95 % CI | p (paired t) | p (Holm) | > 0 | Matches |",
              "|---|" + "---:|" * (len(seeds) + 6)]
    found = []
    for minuend, subtrahend in pairs:
        differences = {}
        for seed in seeds:
            if (minuend, seed) in by_cell and (subtrahend, seed) in by_cell:
                a, b = by_cell[(minuend, seed)], by_cell[(subtrahend, seed)]
                check_pairable(a, b)
                differences[seed] = a.final - b.final
        if differences:
            found.append((minuend, subtrahend, differences, paired_stats(list(differences.values()))))
    headline = [i for i, (a, b, _, stats) in enumerate(found)
                if (a, b) in HEADLINE and stats.p is not None]
    adjusted = dict(zip(headline, holm([found[i][3].p for i in headline])))
    for index, (minuend, subtrahend, differences, stats) in enumerate(found):
        name = f"{labels[minuend]} − {labels[subtrahend]}"
        shown = [format(differences[s], "+.2f") if s in differences else DASH for s in seeds]
        match = matches([by_cell[(minuend, s)].final for s in differences],
                        [by_cell[(subtrahend, s)].final for s in differences])
        cells = _statistics_cells(stats)
        holm_p = adjusted.get(index)
        lines.append(f"| {name} | " + " | ".join(shown)
                     + f" | {_mean_std(list(differences.values()), signed=True)} | "
                     + " | ".join([*cells[:2], _p_text(holm_p), cells[2],
                                   {None: DASH, True: "yes", False: "no"}[match]]) + " |")
        rows += [[scale, "difference", name, seed, f"{value:.6f}"]
                 for seed, value in differences.items()]
        rows += _statistics_rows(scale, name, stats)
        if holm_p is not None:
            rows.append([scale, "p_holm", name, "", f"{holm_p:.6f}"])
        if match is not None:
            rows.append([scale, "matches", name, "", "yes" if match else "no"])
    return lines + [""], rows


def _numerics_note(frame: pd.DataFrame, scale: str) -> str:
    numerics = numerics_of(frame[frame["scale.name"] == scale])
    return f" ({' / '.join(numerics)})" if numerics else ""


def _write(out_dir: str | Path, stem: str, lines: list[str], rows: list[list]) -> list[Path]:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["scale", "kind", "name", "seed", "value"])
    writer.writerows(rows)
    out_dir = Path(out_dir)
    return [atomic_write_text(out_dir / f"{stem}.md", "\n".join(lines)),
            atomic_write_text(out_dir / f"{stem}.csv", buffer.getvalue())]


HOW_TO_READ = ("Difference rows: mean ± sample std over seeds, the 95 % Student-t interval of the "
               "mean difference (undecided where it spans zero), the two-sided paired-t p value, "
               "the same p Holm-adjusted over the block's headline contrasts (rank 1 in the "
               "latest or random non-critical epochs against rank 1 in the critical ones, "
               "Accordion against rank 2; – for the others), on how many seeds the difference "
               "is positive, and whether the first run's seed mean matches the second's as "
               "MLPerf reads a reference (within its mean ± 2 sample std; at least 3 seeds each, "
               "else –). Runs are paired only when their scale, sizes, precision, layout, "
               "threads, PowerSGD packing and instruction set agree.")


def write_paired_table(spec: FigureSpec, frame: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write <out_dir>/<figure>_paired.md and .csv from the figure's one-row-per-epoch runs
    (twins included); returns the paths. No runs: the commands that make them."""
    finals = final_accuracies(frame if not frame.empty else pd.DataFrame(columns=[RUN_DIR]))
    lines = [f"{spec.title}, panel (b) in numbers: final test accuracy (%) of each run by seed, "
             "mean ± sample std over seeds, and differences between two runs of the same seed "
             "(points).", "", HOW_TO_READ, ""]
    rows: list[list] = []
    cells = [(cell.method, cell.label) for cell in spec.cells]
    for scale in sorted(finals["scale"].unique()):
        heading = f"## scale {scale}{_numerics_note(frame, scale)}"
        block_lines, block_rows = _block(heading, scale, cells, finals[finals["scale"] == scale],
                                         spec.id)
        lines += block_lines
        rows += block_rows
    if finals.empty:
        lines += ["No runs yet; run:", *(f"- `{run_command(cell.preset, 'paper')}`"
                                         for cell in spec.cells), ""]
    return _write(out_dir, f"{spec.id}_paired", lines, rows)


def write_table_paired(spec: TableSpec, frame: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Write <out_dir>/<table>_paired.md and .csv: the table's cells compared seed by seed,
    one block per scale, section and model with runs of at least two of its cells."""
    lines = [f"{spec.title}, same-seed comparisons: the final value of each run by seed, mean ± "
             "sample std over seeds, and differences between two runs of the same seed.", "",
             HOW_TO_READ, ""]
    rows: list[list] = []
    for section in spec.sections:
        mine = frame[frame["model.name"].isin({cell.model for cell in section.cells})] \
            if not frame.empty else frame
        if mine.empty:
            continue
        finals = final_accuracies(mine, section.metric)
        for scale in sorted(finals["scale"].unique()):
            for model in dict.fromkeys(cell.model for cell in section.cells):
                cells = [(c.method, c.label) for c in section.cells if c.model == model]
                block = finals[(finals["scale"] == scale) & (finals["model"] == model)]
                if block["method"].nunique() < 2:
                    continue
                heading = (f"## scale {scale}{_numerics_note(frame, scale)}: {model}, "
                           f"{section.title}, {METRIC_WORDS[section.metric]}")
                block_lines, block_rows = _block(heading, scale, cells, block, spec.id)
                lines += block_lines
                rows += [[f"{scale}/{model}", *row[1:]] for row in block_rows]
    if not rows:
        lines += ["No scale has runs of two cells of one model yet.", ""]
    return _write(out_dir, f"{spec.id}_paired", lines, rows)
