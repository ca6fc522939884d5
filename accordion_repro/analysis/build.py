"""Build every table and figure from a folder of run directories (what `make figures` runs)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pandas as pd

from accordion_repro.analysis.collect import RUN_DIR, SkippedRunWarning, collect_runs
from accordion_repro.analysis.comparison import comparison_runs, write_comparison_table
from accordion_repro.analysis.consistency import check_one_configuration, configuration_check
from accordion_repro.costmodel import check_workers, resolve_network
from accordion_repro.analysis.layout import COMPARISONS, FIGURES, TABLES, TWINS, run_command
from accordion_repro.analysis.paired import write_paired_table, write_table_paired
from accordion_repro.analysis.summarize import summarize_runs
from accordion_repro.analysis.tables import write_table


class MissingFigureWarning(UserWarning):
    """A figure had no runs; the message says which presets to run."""


def _column_equals(frame: pd.DataFrame, column: str, value: str) -> pd.Series:
    if column not in frame:
        return pd.Series(False, index=frame.index)
    return frame[column] == value


def build_all(runs_dir: str | Path = "results/runs", out_dir: str | Path = "results",
              net: str = "10gbit", workers: int | None = None,
              figures: bool = True) -> dict[str, list[Path]]:
    """Write results/tables/table{1..6}.{md,tex,csv}, fig2_paired.{md,csv} (Figure 2 (b)'s
    final accuracies by seed and paired differences with their statistics), the same for the
    cells of PAIRED_TABLES (<table>_paired.{md,csv}) and successors.{md,csv} (Accordion and its
    successors, analysis/comparison.py), results/figures/fig{2,9,10}.{png,pdf} and
    <table>_tradeoff.{png,pdf}, each figure once per scale (_by_scale); returns {output
    name: written paths}. Missing runs never fail the build: tables list the presets to run,
    figures without runs are skipped with a MissingFigureWarning; runs of one cell that are not
    one configuration stop it before anything is written (MixedCellError). figures=False
    writes the tables only (fast)."""
    resolve_network(net)
    if workers is not None:
        check_workers(workers)
    out_dir = Path(out_dir)
    frame = collect_runs(runs_dir).frame
    runs = summarize_runs(frame, net=net, workers=workers)
    configs: dict[str, dict] = {}  # resolved.yaml by run directory
    same = configuration_check(runs_dir, configs)
    table_runs = {table_id: _table_runs(runs, table_id, same) for table_id in TABLES}
    figure_runs = {figure_id: _figure_runs(frame, figure_id, same) for figure_id in FIGURES}
    compared = {spec_id: comparison_runs(spec, runs) for spec_id, spec in COMPARISONS.items()}
    # before anything is written: a mixed cell stops the build
    for owner, owned in (*table_runs.items(), *figure_runs.items(), *compared.items()):
        check_one_configuration(runs_dir, owned, owner, configs)
    written: dict[str, list[Path]] = {}
    for table_id, spec in TABLES.items():
        written[table_id] = write_table(spec, table_runs[table_id], out_dir / "tables", net)
    written["fig2_paired"] = write_paired_table(FIGURES["fig2"], figure_runs["fig2"],
                                                out_dir / "tables")
    for table_id in PAIRED_TABLES:
        written[f"{table_id}_paired"] = write_table_paired(
            TABLES[table_id], _table_epochs(frame, table_id, same), out_dir / "tables")
    for spec_id, spec in COMPARISONS.items():
        written[spec_id] = write_comparison_table(spec, compared[spec_id], out_dir / "tables")
    if figures:
        written.update(_write_figures(frame, table_runs, figure_runs, out_dir / "figures"))
        written.update(_write_comparison_figures(frame, compared, out_dir / "figures"))
    return written


def _write_comparison_figures(frame: pd.DataFrame, compared: dict[str, pd.DataFrame],
                              out_dir: Path) -> dict[str, list[Path]]:
    """<comparison>_tradeoff.{png,pdf} for each comparison table with runs (none without:
    its table already says which presets to run)."""
    from accordion_repro.analysis import figures
    from accordion_repro.analysis.comparison import tradeoff_figure

    written: dict[str, list[Path]] = {}
    for spec_id, runs in compared.items():
        if runs.empty:
            continue
        spec_frame = frame[frame["run_dir"].isin(runs["run_dir"])]
        written[f"{spec_id}_tradeoff"] = figures.write_figure(
            tradeoff_figure(COMPARISONS[spec_id], runs, spec_frame), out_dir, f"{spec_id}_tradeoff")
    return written


# The tables whose cells are also compared seed by seed (<table>_paired.{md,csv}): PowerSGD's
# and Top-K's, the two of the central-claim study (scale=cpu_long).
PAIRED_TABLES = ("table1", "table3")

# The most faithful scale first: a figure whose runs span several scales is drawn once per
# scale, `figN` (or `tableN_tradeoff`) from the first of these that has runs and
# `figN_<scale>` from each other one (curves of 30 and 12 epochs on one axis would compare
# nothing, and a trade-off marker over both would average a 30-epoch and a 12-epoch accuracy).
# cpu_long (whole CIFAR-10, 30 epochs, the paper's LR proportions) is the closest to the paper
# after the paper's own scale.
SCALE_PREFERENCE = ("paper", "cpu_long", "cpu_full", "cpu")


def _by_scale(frame: pd.DataFrame, figure_id: str) -> list[tuple[str, pd.DataFrame]]:
    """(output name, runs of one scale) for a figure's runs, the preferred scale unsuffixed."""
    if frame.empty or "scale.name" not in frame:
        return [(figure_id, frame)]
    scales = sorted(frame["scale.name"].dropna().astype(str).unique(),
                    key=lambda s: (SCALE_PREFERENCE.index(s) if s in SCALE_PREFERENCE
                                   else len(SCALE_PREFERENCE), s))
    return [(figure_id if i == 0 else f"{figure_id}_{scale}", frame[frame["scale.name"] == scale])
            for i, scale in enumerate(scales)] or [(figure_id, frame)]


def _with_twins(frame: pd.DataFrame, own: pd.DataFrame, column: str, owner: str,
                cells, same=None) -> pd.DataFrame:
    """The runs of a table or figure (`own`: its rows of `frame`, where `column` == `owner`)
    plus, at each scale where it has runs of its own, the runs of TWINS standing in for the
    cells it has no run of; these keep their run directory and get `twin_of` = the preset that
    was run. (A scale with only twins gets none: the table or figure would show another's.)
    Where a cell has runs of its own, a twin's run fills a seed the cell lacks only when
    same(own run, twin run) says the two are one configuration (consistency.py)."""
    if own.empty or "scale.name" not in own:
        return own
    scales = set(own["scale.name"])
    twins = []
    for cell in cells:
        preset = TWINS.get(cell.preset)
        if preset is None:
            continue
        mine = own[(own["run.method"] == cell.method) & (own["model.name"] == cell.model)]
        first_own = dict(zip(mine["scale.name"], mine[RUN_DIR]))
        covered = set(zip(mine["scale.name"], mine["seed"]))
        rows = frame[_column_equals(frame, "run.name", preset)]

        def wanted(scale, seed, run_dir) -> bool:
            if scale not in scales or (scale, seed) in covered:
                return False
            return scale not in first_own or (same is not None and same(first_own[scale], run_dir))

        rows = rows[[wanted(*key) for key in zip(rows["scale.name"], rows["seed"],
                                                  rows[RUN_DIR])]].copy()
        if rows.empty:
            continue
        rows[column], rows["run.method"], rows["twin_of"] = owner, cell.method, preset
        twins.append(rows)
    return pd.concat([own, *twins], ignore_index=True) if twins else own


def _table_runs(runs: pd.DataFrame, table_id: str, same=None) -> pd.DataFrame:
    """summarize_runs() rows of one table, twins included."""
    return _with_twins(runs, runs[runs["run.table"] == table_id], "run.table", table_id,
                       TABLES[table_id].cells, same)


def _table_epochs(frame: pd.DataFrame, table_id: str, same=None) -> pd.DataFrame:
    """One-row-per-epoch rows of a table's runs, twins included."""
    own = frame[_column_equals(frame, "run.table", table_id)]
    return _with_twins(frame, own, "run.table", table_id, TABLES[table_id].cells, same)


def _figure_runs(frame: pd.DataFrame, figure_id: str, same=None) -> pd.DataFrame:
    """One-row-per-epoch rows of a figure's runs, twins included."""
    own = frame[_column_equals(frame, "run.figure", figure_id)]
    return _with_twins(frame, own, "run.figure", figure_id, FIGURES[figure_id].cells, same)


def _write_figures(frame: pd.DataFrame, table_runs: dict[str, pd.DataFrame],
                   figure_runs: dict[str, pd.DataFrame], out_dir: Path) -> dict[str, list[Path]]:
    from accordion_repro.analysis import figures  # here: the tables never pay for matplotlib

    written: dict[str, list[Path]] = {}
    for figure_id, builder in {"fig2": figures.figure2, "fig9": figures.figure9,
                               "fig10": figures.figure10}.items():
        for name, figure_frame in _by_scale(figure_runs[figure_id], figure_id):
            present = set(figure_frame["run.method"]) if not figure_frame.empty else set()
            missing = [cell for cell in FIGURES[figure_id].cells if cell.method not in present]
            if missing:
                scale = "paper" if figure_frame.empty else str(figure_frame["scale.name"].iloc[0])
                commands = "; ".join(run_command(cell.preset, scale) for cell in missing)
                state = "no runs" if figure_frame.empty else "curves missing"
                warnings.warn(f"{name}: {state}; run {commands}", MissingFigureWarning, stacklevel=2)
            if not figure_frame.empty:
                written[name] = figures.write_figure(builder(figure_frame), out_dir, name)
    for table_id, spec in TABLES.items():
        # one figure per scale, like the table's blocks: each marker is then one cell that
        # build_all's check_one_configuration passed
        for name, runs in _by_scale(table_runs[table_id], f"{table_id}_tradeoff"):
            if runs.empty:
                continue
            table_frame = frame[frame["run_dir"].isin(runs["run_dir"])]
            written[name] = figures.write_figure(
                figures.tradeoff_figure(spec, runs, table_frame), out_dir, name)
    return written


__all__ = ["build_all", "MissingFigureWarning", "SkippedRunWarning"]
