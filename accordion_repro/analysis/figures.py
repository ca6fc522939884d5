"""Figures 2, 9, 10 and one accuracy-versus-communication plot per table.

Figures are drawn on bare matplotlib Figure objects with the Agg canvas (no pyplot state, no
display) and saved without creation dates, so a rebuild from the same runs gives the same bytes.
Curves average the seeds of a method epoch by epoch; runs of different scales are never averaged
together: the build draws each figure once per scale, a builder given several scales draws one
curve per scale (and the title says the scales are mixed), and a trade-off figure refuses them.
Legends list only the methods that have runs. Figures 2, 9 and 10 say under their title what the runs trained
on (scale, data, model width) and what differs from the paper's set-up (a stand-in data set,
the batch sizes run); labels of batch-size curves give the batch sizes the runs logged.
"""

from __future__ import annotations

import itertools
import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.ticker  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

from accordion_repro.analysis.collect import first_value, model_variants, numerics_of  # noqa: E402
from accordion_repro.analysis.labels import (batch_sizes_text, data_text,  # noqa: E402
                                             run_batch_label, stand_in_notes)
from accordion_repro.analysis.layout import (FIGURES, METRIC_TITLES, FigureSpec,  # noqa: E402
                                             TableSpec, level_text)
from accordion_repro.analysis.paired import final_accuracies  # noqa: E402
from accordion_repro.utils import atomic_write  # noqa: E402

def _bundled_fonts_only() -> None:
    """Draw with the DejaVu fonts matplotlib ships, never a system copy of the same family.

    A PDF embeds a subset of the font file it drew with, so the file decides the bytes; the
    font manager picks among equally named files in the order it found them, which differs
    between machines (a system's /usr/share/fonts DejaVu Sans is another version). Keeping only
    matplotlib's own files makes the PDF a function of the matplotlib version constraints.txt
    pins, as the PNG already is."""
    from matplotlib import font_manager

    bundled = Path(matplotlib.get_data_path(), "fonts", "ttf").resolve()
    manager = font_manager.fontManager
    manager.ttflist = [font for font in manager.ttflist
                       if not font.name.startswith("DejaVu")
                       or Path(font.fname).resolve().parent == bundled]
    for cached in (getattr(font_manager, "_get_font", None),
                   getattr(type(manager), "_findfont_cached", None)):
        if hasattr(cached, "cache_clear"):  # what was looked up before this filter
            cached.cache_clear()


_bundled_fonts_only()
STYLE = {"font.size": 9, "axes.titlesize": 9, "axes.labelsize": 9, "legend.fontsize": 8,
         "xtick.labelsize": 8, "ytick.labelsize": 8, "pdf.fonttype": 42, "svg.hashsalt": "accordion"}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#17becf")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1)), (0, (3, 1, 1, 1, 1, 1)), (0, (1, 1)))
MARKERS = {"dense": "s", "static_low": "o", "static_high": "v", "accordion": "*"}
TRACE_PREFERENCE = ("accordion", "static_low", "static_high", "high_inside", "high_outside")
CRITICAL_COLOR = "#ff7f0e"
# PDF and PNG writers stamp a creation date / software version by default; dropping them
# keeps a rebuild from the same runs byte-identical.
METADATA = {"png": {"Software": None}, "pdf": {"CreationDate": None, "Producer": None, "Creator": None}}


def _sorted_unique(frame: pd.DataFrame, column: str) -> list[str]:
    return sorted(frame[column].dropna().astype(str).unique()) if column in frame else []


def provenance(frame: pd.DataFrame) -> str:
    """'scale cpu; runs on synthetic_cifar10': what every figure title must say."""
    scales, datasets = _sorted_unique(frame, "scale.name"), _sorted_unique(frame, "dataset.name")
    scale_text = (f"scale {scales[0]}" if len(scales) == 1
                  else f"MIXED scales {', '.join(scales)}" if scales else "scale unknown")
    variants = model_variants(frame)
    reduced = f"; reduced models: {'; '.join(variants)}" if variants else ""
    numerics = numerics_of(frame)
    computed = f"; computed in {' / '.join(numerics)}" if numerics else ""
    return f"{scale_text}; runs on {', '.join(datasets) or 'unknown data'}{reduced}{computed}"


def setup_text(frame: pd.DataFrame, spec: FigureSpec, differences: list[str] = ()) -> str:
    """Lines under a paper figure's title: provenance() (scale, data set, reduced models, or
    'models at paper size'), what the runs trained on (summary.json's data, examples scored,
    epochs), and what differs from the paper's set-up (a stand-in data set, `differences`)."""
    size = "" if model_variants(frame) else "; models at paper size"
    lines = [f"{provenance(frame)}{size}", f"data: {data_text(frame)}"]
    paper_datasets = dict.fromkeys(cell.dataset for cell in spec.cells)
    notes = [note for dataset in paper_datasets for note in stand_in_notes(frame, dataset)]
    notes += list(differences)
    if notes:
        lines.append("differs from the paper: " + "; ".join(notes))
    twins = _sorted_unique(frame, "twin_of")
    if twins:  # curves read from a table's runs of the same config (analysis/layout.py TWINS)
        lines.append(f"drawn from the same configuration's table runs: {', '.join(twins)}")
    return "\n".join(lines)


def _integer_epochs(axes) -> None:
    axes.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))


def _wrapped(text: str, figure: Figure) -> str:
    """Titles wrapped to the figure's width (about 11 characters per inch at 9 pt), so
    nothing is cut off at paper size."""
    width = max(20, int(figure.get_figwidth() * 11))
    # never inside a word: "CIFAR-10" and "64<->512" stay whole
    return "\n".join(textwrap.fill(line, width, break_on_hyphens=False, break_long_words=False)
                     for line in text.split("\n"))


def _new_figure(width: float, height: float) -> Figure:
    with matplotlib.rc_context(STYLE):
        return Figure(figsize=(width, height), layout="constrained")


def _curve_groups(runs: pd.DataFrame, spec: FigureSpec, label_for=None):
    """(label, method, scale, per-epoch frame) in the layout's curve order, for the methods that
    have runs only. label_for(method, group) may name a curve from its runs (None: the layout's)."""
    scales = _sorted_unique(runs, "scale.name")
    labels = {cell.method: cell.label for cell in spec.cells}
    order = [cell.method for cell in spec.cells]
    order += sorted(set(runs["run.method"].dropna().astype(str)) - set(order))
    for method in order:
        for scale in scales:
            group = runs[(runs["run.method"] == method) & (runs["scale.name"] == scale)]
            if group.empty:
                continue
            label = (label_for(method, group) if label_for else None) or labels.get(method, method)
            label += f" [{scale}]" if len(scales) > 1 else ""
            yield label, method, scale, group


def _plot_accuracy_curves(axes, runs: pd.DataFrame, spec: FigureSpec, metric: str = "test_acc",
                          label_for=None, styled: bool = False):
    """Seed-mean curves with their min-max band; `styled`: each curve also its own line style,
    so that curves lying on one another stay visible."""
    curves = []  # (color, per-epoch rows, label) of each curve drawn
    for index, (label, method, scale, group) in enumerate(_curve_groups(runs, spec, label_for)):
        by_epoch = group.groupby("epoch", sort=True)[metric]
        mean, low, high = by_epoch.mean(), by_epoch.min(), by_epoch.max()
        seeds = group["run_dir"].nunique()
        color = COLORS[index % len(COLORS)]
        curves.append((color, group, label))
        style = LINESTYLES[index % len(LINESTYLES)] if styled else "-"
        axes.plot(mean.index, mean.values, color=color, linewidth=1.4, linestyle=style,
                  label=f"{label} (n={seeds})")
        if seeds > 1:
            axes.fill_between(mean.index, low.values, high.values, color=color, alpha=0.15,
                              linewidth=0)
    axes.set_xlabel("Epoch")
    _integer_epochs(axes)
    axes.set_ylabel(METRIC_TITLES[metric])
    axes.grid(True, alpha=0.3)
    return curves


def _critical_spans(epochs: np.ndarray, critical: np.ndarray) -> list[tuple[float, float]]:
    """(first - 0.5, last + 0.5) of each stretch of consecutive critical epochs."""
    stretches = (list(group) for flag, group in
                 itertools.groupby(zip(epochs, critical), key=lambda pair: bool(pair[1])) if flag)
    return [(stretch[0][0] - 0.5, stretch[-1][0] + 0.5) for stretch in stretches]


def _detector_norms(run: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    epochs, norms = [], []
    for epoch, detector in zip(run["epoch"], run["detector"]):
        if isinstance(detector, dict) and detector.get("norms"):
            epochs.append(epoch)
            norms.append(detector["norms"])
    width = max((len(row) for row in norms), default=0)
    table = np.full((len(norms), width), np.nan)
    for index, row in enumerate(norms):
        table[index, :len(row)] = [np.nan if value is None else value for value in row]
    return np.asarray(epochs), table


def _trace_run(runs: pd.DataFrame) -> pd.DataFrame | None:
    if "detector" not in runs:
        return None
    rank = {method: index for index, method in enumerate(TRACE_PREFERENCE)}
    candidates = []
    for run_dir, run in runs.groupby("run_dir", sort=True):
        if any(isinstance(d, dict) and d.get("norms") for d in run["detector"]):
            candidates.append((rank.get(str(run["run.method"].iloc[0]), len(rank)), run_dir, run))
    if not candidates:
        return None
    return min(candidates, key=lambda item: item[:2])[2].sort_values("epoch", kind="stable")


def _same(a, b) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=1e-12)
    except (TypeError, ValueError):
        return False


def _truthy(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value)) and bool(value)


def _starts_critical(run: pd.DataFrame) -> bool:
    """Whether epoch 0 ran in a critical regime. A record logs the flags decided at its end (they
    hold for the next epoch), so epoch 0's own flags are read from what it ran: the detector
    schedules start critical, at their low level (or B_low); regime windows run their inside
    level when epoch 0 is in a window."""
    first = run.iloc[0]
    if first["epoch"] != 0:
        return False
    name = first_value(run, "schedule.name")
    levels = first.get("layer_levels")
    levels = list(levels) if isinstance(levels, (list, tuple)) else []
    if name in ("accordion", "joint"):
        low = first_value(run, "schedule.low")
        return low is not None and any(_same(level, low) for level in levels)
    if name == "regime_windows":
        inside, outside = first_value(run, "schedule.inside"), first_value(run, "schedule.outside")
        return (inside is not None and not _same(inside, outside) and bool(levels)
                and all(_same(level, inside) for level in levels))
    if name == "batch_accordion":
        low, high = first_value(run, "schedule.low"), first_value(run, "schedule.high")
        return low is not None and not _same(low, high) and _same(first.get("global_batch"), low)
    return False


def _ran_critical(run: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(epochs, flags): whether each epoch of the run ran in a critical regime. The flags logged
    at the end of epoch e (`critical_layers > 0`, or `critical_model` for a model-wide batch
    decision) hold for epoch e + 1; epoch 0 follows _starts_critical."""
    epochs = run["epoch"].to_numpy()
    decided = np.zeros(len(run), dtype=bool)
    if "critical_layers" in run:
        decided |= pd.to_numeric(run["critical_layers"], errors="coerce").fillna(0).to_numpy() > 0
    if "critical_model" in run:
        decided |= np.array([_truthy(value) for value in run["critical_model"]], dtype=bool)
    flags = {int(epoch) + 1: bool(flag) for epoch, flag in zip(epochs, decided)}
    flags[0] = _starts_critical(run)
    return epochs, np.array([flags.get(int(epoch), False) for epoch in epochs], dtype=bool)


def _lr_decays(run: pd.DataFrame) -> list[int]:
    """Epochs whose logged LR is below the previous epoch's: the LR decays (the warm-up only
    rises; a batch schedule's lr_scale is divided out, so going back to B_low is no decay)."""
    if "lr" not in run:
        return []
    lr = pd.to_numeric(run["lr"], errors="coerce").to_numpy(dtype=float)
    if "lr_scale" in run:
        lr = lr / pd.to_numeric(run["lr_scale"], errors="coerce").fillna(1.0).to_numpy(dtype=float)
    epochs = run["epoch"].to_numpy()
    return [int(epochs[i]) for i in range(1, len(lr))
            if np.isfinite(lr[i]) and np.isfinite(lr[i - 1]) and lr[i] < lr[i - 1] * (1 - 1e-6)]


def _shading_label(run: pd.DataFrame) -> str:
    name, compressor = first_value(run, "schedule.name"), first_value(run, "compressor.name")
    if name == "regime_windows":
        inside = first_value(run, "schedule.inside")
        return ("shaded: epochs inside the fixed critical-regime\nwindows"
                + (f" ({level_text(compressor, inside)} there)" if inside is not None else ""))
    low = first_value(run, "schedule.low")
    if name == "batch_accordion" and low is not None:
        return f"shaded: epochs run critical (detector):\nsmall batch B {int(float(low))}"
    if low is not None:
        return ("shaded: epochs run critical (detector):\n"
                f"≥1 layer at low compression, {level_text(compressor, low)}")
    return "shaded: epochs run in a critical regime"


def _statistic(run: pd.DataFrame) -> str | None:
    for detector in run["detector"]:
        if isinstance(detector, dict) and detector.get("statistic"):
            return str(detector["statistic"])
    return first_value(run, "schedule.statistic")


def _plot_norm_trace(axes, figure: Figure, run: pd.DataFrame | None) -> None:
    if run is None:
        axes.text(0.5, 0.5, "no run with detector norms logged", ha="center", va="center",
                  transform=axes.transAxes)
        axes.set_axis_off()
        return
    epochs, norms = _detector_norms(run)
    colormap = matplotlib.colormaps["viridis"]
    layers = norms.shape[1]
    for layer in range(layers):
        axes.plot(epochs, norms[:, layer], color=colormap(layer / max(layers - 1, 1)),
                  linewidth=0.8, marker="." if len(epochs) < 30 else None)
    if (np.isfinite(norms) & (norms > 0)).any():
        axes.set_yscale("log")
    handles = []
    spans = _critical_spans(*_ran_critical(run))
    for start, end in spans:
        axes.axvspan(start, end, color=CRITICAL_COLOR, alpha=0.15, linewidth=0, gid="critical")
    if spans:
        handles.append(Patch(color=CRITICAL_COLOR, alpha=0.3, label=_shading_label(run)))
    decays = _lr_decays(run)
    for epoch in decays:  # between the last epoch at the old LR and the first at the new one
        axes.axvline(epoch - 0.5, color="black", linestyle=":", linewidth=1.0, gid="lr_decay")
    if decays:
        handles.append(Line2D([], [], color="black", linestyle=":",
                              label=f"LR decay (from epoch {', '.join(map(str, decays))})"))
    handles.append(Line2D([], [], color="grey", label="one line per layer"))
    scalar = matplotlib.cm.ScalarMappable(cmap=colormap,
                                          norm=matplotlib.colors.Normalize(0, max(layers - 1, 1)))
    colorbar = figure.colorbar(scalar, ax=axes, label="Layer index (input to output)", pad=0.01)
    colorbar.ax.yaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    axes.legend(handles=handles, loc="best", fontsize=7)
    axes.set_xlabel("Epoch")
    _integer_epochs(axes)
    statistic = _statistic(run)
    what = {"mean": "mean step gradient", "sum": "summed gradient"}.get(
        statistic, f"gradient ({statistic})" if statistic else "gradient")
    axes.set_ylabel(f"Norm of the epoch's {what} (L2)")
    axes.set_title(f"(a) per-layer gradient norm and detected critical regimes\n"
                   f"run {run['run_dir'].iloc[0]}")
    axes.grid(True, alpha=0.3)


def _plot_final_accuracy(axes, curves) -> None:
    """Each run's last test accuracy beside its curve's colour, a run's seed joined across the
    curves: at the end of a run the curves of panel (b) lie within a point of each other, so
    the paired difference per seed, against the spread between seeds, is what answers
    "where or how much" (the numbers: tables/fig2_paired.md)."""
    by_seed: dict = {}
    for position, (color, group, _) in enumerate(curves):
        runs = final_accuracies(group)
        finals = runs["final"].to_numpy(dtype=float)
        axes.scatter(np.full(len(finals), position), finals, color=color, s=22, zorder=3)
        axes.hlines(finals.mean(), position - 0.25, position + 0.25, color=color, linewidth=2.0)
        for seed, final in zip(runs["seed"], finals):
            by_seed.setdefault(seed, []).append((position, final))
    for points in by_seed.values():
        if len(points) > 1:
            axes.plot(*zip(*points), color="grey", linewidth=0.6, alpha=0.6, zorder=2)
    axes.set_xticks(range(len(curves)), [textwrap.fill(label, 13) for *_, label in curves],
                    fontsize=7)
    axes.set_xlim(-0.5, len(curves) - 0.5)
    axes.set_ylabel("Final test accuracy (%)")
    axes.set_title("(c) final test accuracy per run\n(bar: mean; grey line: one seed)")
    axes.grid(True, axis="y", alpha=0.3)


GAP_REFERENCE = "static_low"  # panel (b)'s lower axes: each arm against rank 2, seed by seed


def _plot_gaps(axes, curves, reference: str = GAP_REFERENCE) -> None:
    """Each curve minus the reference method's curve of the same seed, epoch by epoch, averaged
    over the seeds both have: the curves of panel (b) lie within a point of one another at the
    end, so their gaps get axes of their own."""
    refs = [group for _, group, _ in curves if (group["run.method"] == reference).all()]
    axes.axhline(0.0, color="black", linewidth=0.8)
    axes.set_xlabel("Epoch")
    _integer_epochs(axes)
    axes.grid(True, alpha=0.3)
    if not refs:
        axes.text(0.5, 0.5, f"no {reference} runs to compare with", ha="center",
                  transform=axes.transAxes)
        return
    ref = refs[0].pivot_table(index="epoch", columns="seed", values="test_acc")
    label = next(label for _, group, label in curves if (group["run.method"] == reference).all())
    for index, (color, group, _) in enumerate(curves):
        if (group["run.method"] == reference).all():
            continue
        mine = group.pivot_table(index="epoch", columns="seed", values="test_acc")
        seeds = [seed for seed in mine.columns if seed in ref.columns]
        if not seeds:
            continue
        gap = (mine[seeds] - ref[seeds]).mean(axis=1).dropna()
        axes.plot(gap.index, gap.values, color=color, linewidth=1.2,
                  linestyle=LINESTYLES[index % len(LINESTYLES)])
    axes.set_ylabel(f"minus {label}\n(points, same seed)")


def figure2(runs: pd.DataFrame, spec: FigureSpec = FIGURES["fig2"]) -> Figure:
    figure = _new_figure(15.0, 6.4)
    grid = figure.add_gridspec(2, 3, width_ratios=(1.15, 1.0, 0.8), height_ratios=(1.7, 1.0))
    trace_axes, accuracy_axes = figure.add_subplot(grid[:, 0]), figure.add_subplot(grid[0, 1])
    final_axes = figure.add_subplot(grid[:, 2])
    gap_axes = figure.add_subplot(grid[1, 1], sharex=accuracy_axes)
    _plot_norm_trace(trace_axes, figure, _trace_run(runs))
    curves = _plot_accuracy_curves(accuracy_axes, runs, spec, styled=True)
    accuracy_axes.legend(loc="lower right")
    accuracy_axes.set_title("(b) test accuracy with high compression only inside\n"
                            "or only outside the critical regimes; below: each against rank 2")
    _plot_gaps(gap_axes, curves)
    _plot_final_accuracy(final_axes, curves)
    figure.suptitle(_wrapped(f"{spec.title}\n{setup_text(runs, spec)}", figure))
    return figure


def figure9(runs: pd.DataFrame, spec: FigureSpec = FIGURES["fig9"]) -> Figure:
    figure = _new_figure(6.4, 5.0)
    axes = figure.subplots()
    _plot_accuracy_curves(axes, runs, spec)
    axes.legend(loc="lower right")
    figure.suptitle(_wrapped(f"{spec.title}\n{setup_text(runs, spec)}", figure))
    return figure


def _batch_differences(runs: pd.DataFrame, spec: FigureSpec) -> list[str]:
    """'global batch 64 / 2,048 (B 64, Accordion 64<->2048) vs the paper's 512 / 16,384' when
    the runs' batch sizes are not the paper's."""
    paper = batch_sizes_text(value for cell in spec.cells for value in (cell.low, cell.high))
    run_sizes = batch_sizes_text(runs["global_batch"]) if "global_batch" in runs else ""
    if run_sizes == paper:
        return []
    labels = ", ".join(label for label, *_ in _curve_groups(runs, spec, run_batch_label))
    return [f"global batch sizes run {run_sizes or 'not logged'} ({labels}) "
            f"vs the paper's {paper}"]


def figure10(runs: pd.DataFrame, spec: FigureSpec = FIGURES["fig10"]) -> Figure:
    figure = _new_figure(6.8, 5.0)
    axes = figure.subplots()
    curves = _plot_accuracy_curves(axes, runs, spec, label_for=run_batch_label)
    batch_axes = axes.twinx()
    drawn = False
    for color, group, _ in curves:
        if "global_batch" not in group or group["global_batch"].isna().all():
            continue
        batch = group.groupby("epoch", sort=True)["global_batch"].median()
        batch_axes.step(batch.index, batch.values, where="post", color=color, linestyle="--",
                        linewidth=1.0, alpha=0.8)
        drawn = True
    batch_axes.set_yscale("log", base=2)
    batch_axes.set_ylabel("Global batch size (samples, dashed)")
    handles, labels = axes.get_legend_handles_labels()
    if drawn:
        handles.append(Line2D([], [], color="grey", linestyle="--"))
        labels.append("global batch size (right axis)")
    # below the axes: inside, it covered the curves and the dashed batch steps drew over it
    axes.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, -0.17), ncols=2)
    axes.set_ylabel("Test accuracy (%, solid)")
    setup = setup_text(runs, spec, _batch_differences(runs, spec))
    figure.suptitle(_wrapped(f"{spec.title}\n{setup}", figure))
    return figure


def _method_labels(cells, runs: pd.DataFrame) -> list[tuple[str, str]]:
    """One legend entry per method that has runs among cells; the models' levels are joined when
    they differ (e.g. 'Rank 2 / Rank 4'); batch-size cells give the batch sizes their runs used."""
    labels: dict[str, list[str]] = {}
    for cell in cells:
        cell_runs = runs[(runs["model.name"] == cell.model) & (runs["run.method"] == cell.method)]
        if cell_runs.empty:
            continue
        label = (run_batch_label(cell.method, cell_runs) if cell.family == "batch" else None) \
            or cell.label
        labels.setdefault(cell.method, [])
        if label not in labels[cell.method]:
            labels[cell.method].append(label)
    return [(method, " / ".join(names)) for method, names in labels.items()]


def tradeoff_figure(spec: TableSpec, runs: pd.DataFrame, frame: pd.DataFrame) -> Figure:
    """Final metric against floats communicated at one scale, one panel per section of the
    table; a large marker is the mean ± std of one (model, method) cell's seeds.
    runs: summarize_runs() rows of this table at one scale; frame: their run-epoch rows (for
    provenance). Runs of several scales are refused: a marker over them would average a
    12-epoch and a 30-epoch accuracy (build._by_scale draws one figure per scale)."""
    scales = _sorted_unique(runs, "scale.name")
    if len(scales) > 1:
        raise ValueError(f"{spec.id} trade-off figure got runs of scales {', '.join(scales)}: "
                         f"draw one figure per scale")
    sections = [section for section in spec.sections
                if runs["model.name"].isin({cell.model for cell in section.cells}).any()]
    figure = _new_figure(7.4 * len(sections), 4.2)
    all_axes = np.atleast_1d(figure.subplots(1, len(sections)))
    models = list(dict.fromkeys(cell.model for cell in spec.cells))
    for axes, section in zip(all_axes, sections):
        for cell in section.cells:
            cell_runs = runs[(runs["model.name"] == cell.model) & (runs["run.method"] == cell.method)]
            if cell_runs.empty:
                continue
            color = COLORS[models.index(cell.model) % len(COLORS)]
            marker = MARKERS.get(cell.method, "o")
            x = cell_runs["total_floats"].to_numpy() / 1e6
            y = cell_runs["final"].to_numpy()
            axes.scatter(x, y, color=color, marker=marker, alpha=0.35, s=18, linewidths=0)
            axes.errorbar(x.mean(), y.mean(), yerr=y.std(ddof=1) if len(y) > 1 else None,
                          color=color, marker=marker, markersize=8, capsize=3,
                          markeredgecolor="black", markeredgewidth=0.5)
        axes.set_xscale("log")
        axes.xaxis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axes.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        axes.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        axes.set_xlabel("Floats communicated per worker (millions, log scale)")
        axes.set_ylabel(METRIC_TITLES[section.metric])
        axes.set_title(section.title)
        axes.grid(True, alpha=0.3, which="both")
        present_models = [m for m in models if m in set(cell.model for cell in section.cells)
                          and (runs["model.name"] == m).any()]
        handles = [Line2D([], [], color=COLORS[models.index(m) % len(COLORS)], marker="o",
                          linestyle="", label=m) for m in present_models]
        handles += [Line2D([], [], color="grey", marker=MARKERS.get(method, "o"), linestyle="",
                           label=label) for method, label in _method_labels(section.cells, runs)]
        axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    missing = [section.title for section in spec.sections if section not in sections]
    title = (f"{spec.title.split(':', 1)[0]}: {'; '.join(s.title for s in sections)}: final "
             f"metric vs floats communicated"
             + (f" (no runs of {'; '.join(missing)} at this scale)" if missing else ""))
    seeds = sorted({int(seed) for seed in runs["seed"].dropna()}) if "seed" in runs else []
    figure.suptitle(_wrapped(f"{title}\n{provenance(frame)}\ndata: {data_text(frame)}; seeds "
                             f"{', '.join(map(str, seeds)) or 'unknown'}\n"
                             f"large markers: mean ± std over seeds; faint dots: single seeds",
                             figure))
    return figure


def write_figure(figure: Figure, out_dir: str | Path, stem: str) -> list[Path]:
    """<out_dir>/<stem>.png and .pdf, each written whole or not at all."""
    def save(fmt: str) -> Path:
        return atomic_write(Path(out_dir) / f"{stem}.{fmt}",
                            lambda tmp: figure.savefig(tmp, format=fmt, dpi=150, metadata=METADATA[fmt]))

    with matplotlib.rc_context(STYLE):
        return [save("png"), save("pdf")]
