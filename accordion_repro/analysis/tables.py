"""Tables 1-6 as Markdown, LaTeX and CSV, laid out by accordion_repro.analysis.layout.TABLES.

Every cell of the layout gets a row, filled or marked missing, so a table always has the same
shape and tells the reader which presets to run. Runs of different scales (paper, cpu) are never
averaged together: each scale gets its own block. Output is a pure function of the runs (fixed
formats, stable order, no timestamps) so a rebuild is byte-identical.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from accordion_repro.utils import atomic_write_text
from accordion_repro.analysis.collect import model_variants, numerics_of
from accordion_repro.costmodel import resolve_network
from accordion_repro.analysis.labels import run_batch_label
from accordion_repro.analysis.layout import (DATASET_TITLES, METRIC_TITLES, Cell, Section,
                                             TableSpec, run_command)
from accordion_repro.analysis.reference import official_final

DASH = "–"


@dataclass(frozen=True)
class Row:
    cell: Cell
    label: str                   # the layout's label, or for batch cells the batch sizes run
    seeds: int
    mean: float | None
    std: float | None            # sample std (ddof 1) over seeds; None with one seed
    floats_m: float | None       # mean total floats per worker, millions
    saved: float | None          # static-low floats / this row's floats
    time_s: float | None         # mean measured training time
    speedup: float | None        # static-low time / this row's time
    predicted_s: float | None    # mean cost-model training time
    predicted_speedup: float | None
    official: float | None       # official log's final metric for this cell
    twin_of: str | None = None   # the preset whose runs stand in for this cell's (layout TWINS)


@dataclass(frozen=True)
class Block:
    """One section of a table at one scale."""

    scale: str | None            # None: no runs of this table at all
    section: Section
    rows: tuple[Row, ...]
    datasets: tuple[str, ...]    # dataset.name of the runs behind the block
    workers: tuple[int, ...]     # worker counts used by the predicted-time column
    variants: tuple[str, ...] = ()  # reduced models among the runs, e.g. "resnet18 (width=0.25)"
    numerics: tuple[str, ...] = ()  # the runs' precision and CPU, e.g. "fp32; CPU AMD EPYC, AVX2 cap"

    @property
    def missing(self) -> tuple[Cell, ...]:
        return tuple(row.cell for row in self.rows if row.seeds == 0)


def _mean(values: pd.Series) -> float | None:
    return float(values.mean()) if len(values) else None


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def _cell_runs(runs: pd.DataFrame, cell: Cell) -> pd.DataFrame:
    return runs[(runs["model.name"] == cell.model) & (runs["run.method"] == cell.method)]


def cell_label(cell: Cell, cell_runs: pd.DataFrame) -> str:
    """The layout's label, except in the batch-size tables, whose rows say the global batch
    sizes the runs used ('B 64 (paper: B 512)'); a cell without runs keeps the paper's label."""
    if cell.family != "batch" or cell_runs.empty:
        return cell.label
    label = run_batch_label(cell.method, cell_runs)
    if label is None or label == cell.label:
        return cell.label
    return f"{label} (paper: {cell.label})"


def _twin_of(cell_runs: pd.DataFrame) -> str | None:
    twins = sorted(set(cell_runs["twin_of"].dropna())) if "twin_of" in cell_runs else []
    return ", ".join(twins) or None


def _rows(section: Section, runs: pd.DataFrame) -> tuple[Row, ...]:
    stats = {}
    for cell in section.cells:
        cell_runs = _cell_runs(runs, cell)
        finals = cell_runs["final"]
        stats[cell] = dict(
            label=cell_label(cell, cell_runs), seeds=len(cell_runs), mean=_mean(finals),
            std=float(finals.std(ddof=1)) if len(finals) > 1 else None,
            floats_m=None if cell_runs.empty else _mean(cell_runs["total_floats"]) / 1e6,
            time_s=_mean(cell_runs["train_time_s"]),
            predicted_s=_mean(cell_runs["predicted_time_s"]),
            twin_of=_twin_of(cell_runs),
        )
    rows = []
    for cell in section.cells:
        own = stats[cell]
        base = next((stats[other] for other in section.cells
                     if other.model == cell.model and other.method == "static_low"), {})
        rows.append(Row(  # a cell without runs has no floats or times, so no ratios either
            cell=cell, **own, saved=_ratio(base.get("floats_m"), own["floats_m"]),
            speedup=_ratio(base.get("time_s"), own["time_s"]),
            predicted_speedup=_ratio(base.get("predicted_s"), own["predicted_s"]),
            official=official_final(cell.dataset, cell.family, cell.model, cell.reference_setting),
        ))
    return tuple(rows)


def table_blocks(spec: TableSpec, runs: pd.DataFrame) -> list[Block]:
    """runs: summarize_runs() output. One block per (scale, section), scales sorted."""
    runs = runs[runs["run.table"] == spec.id]
    scales = sorted(runs["scale.name"].dropna().astype(str).unique())
    blocks = []
    for scale in scales or [None]:
        scale_runs = runs[runs["scale.name"] == scale]
        for section in spec.sections:
            used = pd.concat([_cell_runs(scale_runs, cell) for cell in section.cells])
            datasets = tuple(sorted(used["dataset.name"].dropna().astype(str).unique()))
            workers = tuple(sorted({int(w) for w in used["predicted_workers"].dropna()}))
            blocks.append(Block(scale, section, _rows(section, scale_runs), datasets, workers,
                                tuple(model_variants(used)), tuple(numerics_of(used))))
    return blocks


def unmatched_runs(spec: TableSpec, runs: pd.DataFrame) -> list[str]:
    """Run directories that name this table but fit no cell of the layout."""
    runs = runs[runs["run.table"] == spec.id]
    cells = {(cell.model, cell.method) for cell in spec.cells}
    return sorted(str(name) for name, model, method in
                  zip(runs["run_dir"], runs["model.name"], runs["run.method"])
                  if (model, method) not in cells)


# ----------------------------------------------------------------------------- formatting

def _fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return DASH
    return format(value, spec)


def _fmt_quantity(value: float | None) -> str:
    """Floats (millions) and seconds: one decimal, three significant digits below 1."""
    if value is None:
        return DASH
    return format(value, ",.1f") if value >= 1 else format(value, ".3g")


def _fmt_metric(row: Row) -> str:
    if row.seeds == 0:
        return "missing"
    if row.std is None:
        return _fmt(row.mean, ".2f")
    return f"{row.mean:.2f} ± {row.std:.2f}"


def _scale_text(blocks: list[Block]) -> str:
    scales = sorted({block.scale for block in blocks if block.scale is not None})
    if not scales:
        return "Scale: no runs yet"
    if len(scales) == 1:
        return f"Scale: {scales[0]}"
    return f"Scales: {', '.join(scales)} (mixed; one block per scale, never averaged together)"


def _dataset_text(blocks: list[Block]) -> str:
    paper = ", ".join(dict.fromkeys(DATASET_TITLES[block.section.dataset] for block in blocks))
    runs = sorted({name for block in blocks for name in block.datasets})
    variants = sorted({v for block in blocks for v in block.variants})
    reduced = f". Reduced models: {'; '.join(variants)}" if variants else ""
    return f"Dataset of the runs: {', '.join(runs) if runs else 'none yet'} (paper: {paper}){reduced}"


def first_line(spec: TableSpec, blocks: list[Block]) -> str:
    return f"{spec.title}. {_scale_text(blocks)}. {_dataset_text(blocks)}."


def header(block: Block, net: str) -> list[str]:
    workers = "p=" + "/".join(str(w) for w in block.workers) if block.workers else "p=runs' world size"
    return ["Model", "Method", METRIC_TITLES[block.section.metric], "Seeds", "Floats (M)",
            "Saved vs static low", "Time (s)", "Speedup vs static low",
            f"Predicted time, {net} {workers} (s)", "Predicted speedup", "Official final"]


def _fmt_ratio(value: float | None) -> str:
    return _fmt(value, ".2f") + ("x" if value else "")


def row_cells(row: Row) -> list[str]:
    return [row.cell.model, row.label, _fmt_metric(row), str(row.seeds),
            _fmt_quantity(row.floats_m), _fmt_ratio(row.saved), _fmt_quantity(row.time_s),
            _fmt_ratio(row.speedup), _fmt_quantity(row.predicted_s),
            _fmt_ratio(row.predicted_speedup), _fmt(row.official, ".2f")]


def _block_heading(block: Block) -> str:
    scale = "no runs" if block.scale is None else f"scale {block.scale}"
    runs_on = f", runs on {', '.join(block.datasets)}" if block.datasets else ""
    numerics = f"; {' / '.join(block.numerics)}" if block.numerics else ""
    return f"{block.section.title} ({scale}{runs_on}{numerics})"


def _notes(net: str) -> list[str]:
    network = resolve_network(net)
    return [
        "Metric: final epoch, mean ± sample std over seeds (no std with one seed).",
        "Floats: per worker, summed over all steps (official convention: PowerSGD counts P and Q, "
        "Top-K 2 x selected x workers, uncompressed tensors their size).",
        "Time: sum of the measured per-epoch training-loop times (no evaluation).",
        f"Predicted: cost model of docs/analysis.md on {net} ({network.bandwidth_bps / 1e9:g} Gbit/s, "
        f"{network.latency_s * 1e6:g} us latency) with the measured compute time per step.",
        "Official final: final metric of the official run's raw log "
        "(github.com/uw-mad-dash/Accordion raw_data_files; paper scale, one seed).",
    ]


def _twin_lines(block: Block) -> list[str]:
    return [f"{row.label}: the runs of `{row.twin_of}`, the same configuration as "
            f"`{row.cell.preset}` (analysis/layout.py TWINS)." for row in block.rows if row.twin_of]


def _missing_lines(block: Block) -> list[str]:
    scale = block.scale or "paper"
    return [run_command(cell.preset, scale) for cell in block.missing]


def to_markdown(spec: TableSpec, blocks: list[Block], net: str, extra: list[str]) -> str:
    lines = [first_line(spec, blocks), ""]
    for block in blocks:
        columns = header(block, net)
        lines += [f"## {_block_heading(block)}", "",
                  "| " + " | ".join(columns) + " |",
                  "|" + "|".join(["---"] * 2 + ["---:"] * (len(columns) - 2)) + "|"]
        lines += ["| " + " | ".join(row_cells(row)) + " |" for row in block.rows]
        lines.append("")
        twins = _twin_lines(block)
        lines += twins + ([""] if twins else [])
        if block.missing:
            hint = "" if block.scale else " (or scale=cpu for the scaled-down version)"
            lines.append(f"Missing runs: {len(block.missing)} preset(s); run{hint}:")
            lines += [f"- `{command}`" for command in _missing_lines(block)]
            lines.append("")
    if extra:
        lines.append("Runs naming this table that fit no cell: " + ", ".join(extra))
        lines.append("")
    lines += [f"- {note}" for note in _notes(net)]
    return "\n".join(lines) + "\n"


def _latex_escape(text: str) -> str:
    replacements = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
                    "_": r"\_", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                    "^": r"\textasciicircum{}"}
    escaped = "".join(replacements.get(char, char) for char in text)
    return escaped.replace("<->", r"$\leftrightarrow$").replace("±", r"$\pm$").replace(DASH, "--")


def to_latex(spec: TableSpec, blocks: list[Block], net: str, extra: list[str]) -> str:
    lines = [f"% {first_line(spec, blocks)}"]
    for block in blocks:
        columns = header(block, net)
        lines += [r"\begin{table}[t]", r"\centering", r"\footnotesize",
                  r"\caption{" + _latex_escape(f"{spec.title} -- {_block_heading(block)}. "
                                               f"{_dataset_text([block])}.") + "}",
                  r"\begin{tabular}{ll" + "r" * (len(columns) - 2) + "}", r"\toprule",
                  " & ".join(_latex_escape(column) for column in columns) + r" \\", r"\midrule"]
        lines += [" & ".join(_latex_escape(cell) for cell in row_cells(row)) + r" \\"
                  for row in block.rows]
        lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
        lines += [f"% {line}" for line in _twin_lines(block)]
        lines += [f"% missing: {command}" for command in _missing_lines(block)]
    lines += [f"% runs naming this table that fit no cell: {name}" for name in extra]
    lines += [f"% {note}" for note in _notes(net)]
    return "\n".join(lines) + "\n"


CSV_COLUMNS = ["table", "scale", "section", "runs_dataset", "model", "method", "label", "preset",
               "metric", "seeds", "mean", "std", "floats_m", "saved_vs_static_low", "train_time_s",
               "speedup_vs_static_low", "net", "predicted_workers", "predicted_time_s",
               "predicted_speedup", "official_final", "status", "numerics"]


def _csv_number(value: float | None) -> str:
    return "" if value is None else format(value, ".6f")


def to_csv(spec: TableSpec, blocks: list[Block], net: str) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for block in blocks:
        for row in block.rows:
            cell = row.cell
            writer.writerow([
                spec.id, block.scale or "", block.section.title, ";".join(block.datasets),
                cell.model, cell.method, row.label, cell.preset, block.section.metric,
                row.seeds, _csv_number(row.mean), _csv_number(row.std), _csv_number(row.floats_m),
                _csv_number(row.saved), _csv_number(row.time_s), _csv_number(row.speedup), net,
                "/".join(str(w) for w in block.workers), _csv_number(row.predicted_s),
                _csv_number(row.predicted_speedup), _csv_number(row.official),
                "ok" if row.seeds else "missing", " / ".join(block.numerics),
            ])
    return buffer.getvalue()


def write_table(spec: TableSpec, runs: pd.DataFrame, out_dir: str | Path, net: str) -> list[Path]:
    """Write <out_dir>/<table>.md, .tex and .csv; returns the paths."""
    blocks = table_blocks(spec, runs)
    extra = unmatched_runs(spec, runs)
    out_dir = Path(out_dir)
    return [
        atomic_write_text(out_dir / f"{spec.id}.md", to_markdown(spec, blocks, net, extra)),
        atomic_write_text(out_dir / f"{spec.id}.tex", to_latex(spec, blocks, net, extra)),
        atomic_write_text(out_dir / f"{spec.id}.csv", to_csv(spec, blocks, net)),
    ]
