"""The paper's tables and figures as data: which preset fills which cell.

One structure serves both sides: the table builder groups runs by it, and conf/experiment/ is
written from it (analysis/presets.py renders one preset per cell, `run.name`; tests/test_presets.py
checks that the committed files are that rendering), so which cells exist is said once.
A run belongs to a table cell when its `run.table`, `model.name` and `run.method` match the cell;
the preset name is what the user is told to run when a cell is empty.

Levels: PowerSGD ranks are ints, Top-K levels are the kept fraction of each layer (float), the
batch-size tables give global batch sizes (ints). "static_low" is always the low-compression /
small-batch end (the accurate, expensive baseline); "static_high" the high-compression /
large-batch end.
"""

from __future__ import annotations

from dataclasses import dataclass

RUN_COMMAND = "python -m accordion_repro.train experiment={preset} scale={scale}"

DATASET_TITLES = {
    "cifar10": "CIFAR-10",
    "cifar100": "CIFAR-100",
    "wikitext2": "WikiText-2",
}
METRIC_TITLES = {"test_acc": "Test accuracy (%)", "val_ppl": "Validation perplexity"}


@dataclass(frozen=True)
class Cell:
    """One row of a paper table: a model trained with one method."""

    preset: str              # run.name of the experiment preset, e.g. table1/resnet18_powersgd_accordion
    table: str               # run.table
    model: str               # model.name
    method: str              # run.method: dense | static_low | static_high | accordion
    label: str               # run.label, e.g. "Accordion 2<->1"
    dataset: str             # the paper's dataset (cifar10, cifar100, wikitext2)
    family: str              # powersgd | topk | batch (the official-log "method" column)
    compressor: str          # compressor.name the preset uses: none | powersgd | topk
    low: int | float         # low-compression level (rank, kept fraction) or small batch
    high: int | float        # high-compression level or large batch
    reference_setting: str | None  # official-log "setting" for this cell (None: no official run)


@dataclass(frozen=True)
class Section:
    """Rows of a table that share a dataset, a compressor family and a metric."""

    title: str
    dataset: str
    family: str
    metric: str              # test_acc (higher is better) | val_ppl (lower is better)
    cells: tuple[Cell, ...]


@dataclass(frozen=True)
class TableSpec:
    id: str
    title: str
    sections: tuple[Section, ...]

    @property
    def cells(self) -> tuple[Cell, ...]:
        return tuple(cell for section in self.sections for cell in section.cells)


@dataclass(frozen=True)
class FigureCell:
    """One curve of a paper figure."""

    preset: str
    figure: str              # run.figure
    model: str
    dataset: str
    method: str              # run.method
    label: str
    compressor: str
    low: int | float
    high: int | float


@dataclass(frozen=True)
class FigureSpec:
    id: str
    title: str
    cells: tuple[FigureCell, ...]


def level_text(family: str, level: int | float, short: bool = False) -> str:
    """'rank 2', 'K 99%', 'B 512'; short: '2', '99%', '512'. `family` is a compressor name or
    "batch"; any other is 'level 2'. The layout's labels and the figures' notes say it alike."""
    text = f"{float(level) * 100:g}%" if family == "topk" else f"{float(level):g}"
    unit = {"powersgd": "rank", "topk": "K", "batch": "B"}.get(family, "level")
    return text if short else f"{unit} {text}"


def _cells(table: str, dataset: str, family: str,
           models: tuple[tuple[str, int | float, int | float], ...]) -> tuple[Cell, ...]:
    compressor = "none" if family == "batch" else family

    def ref(level: int | float, short: bool = False) -> str:
        prefix = {"powersgd": "r" if short else "rank", "topk": "k", "batch": "b"}[family]
        return f"{prefix}{round(level * 100) if family == 'topk' else level}"

    cells = []
    for model, low, high in models:
        methods = [("dense", "Dense (no compression)", None, "none")] if family != "batch" else []
        methods += [
            ("static_low", level_text(family, low).capitalize(), ref(low), compressor),
            ("static_high", level_text(family, high).capitalize(), ref(high), compressor),
            ("accordion", f"Accordion {level_text(family, low, True)}<->{level_text(family, high, True)}",
             f"accordion_{ref(low, short=True)}_{ref(high, short=True)}", compressor),
        ]
        for method, label, setting, cell_compressor in methods:
            cells.append(Cell(
                preset=f"{table}/{model}_{family}_{method}", table=table, model=model,
                method=method, label=label, dataset=dataset, family=family,
                compressor=cell_compressor, low=low, high=high, reference_setting=setting,
            ))
    return tuple(cells)


def _section(table: str, dataset: str, family: str, models, *, metric: str = "test_acc") -> Section:
    family_title = {"powersgd": "PowerSGD", "topk": "Top-K", "batch": "batch size"}[family]
    return Section(title=f"{DATASET_TITLES[dataset]}, {family_title}", dataset=dataset,
                   family=family, metric=metric,
                   cells=_cells(table, dataset, family, tuple(models)))


TABLES: dict[str, TableSpec] = {
    "table1": TableSpec("table1", "Table 1: PowerSGD on CIFAR-10", (
        _section("table1", "cifar10", "powersgd",
                 [("resnet18", 2, 1), ("vgg19bn", 4, 1), ("senet18", 4, 1)]),
    )),
    "table2": TableSpec("table2", "Table 2: PowerSGD on CIFAR-100", (
        _section("table2", "cifar100", "powersgd",
                 [("resnet18", 2, 1), ("densenet", 2, 1), ("senet18", 2, 1)]),
    )),
    "table3": TableSpec("table3", "Table 3: Top-K on CIFAR-10 and WikiText-2", (
        _section("table3", "cifar10", "topk",
                 [("resnet18", 0.99, 0.10), ("googlenet", 0.99, 0.10), ("senet18", 0.99, 0.10)]),
        _section("table3", "wikitext2", "topk", [("lstm", 0.99, 0.02)], metric="val_ppl"),
    )),
    "table4": TableSpec("table4", "Table 4: Top-K on CIFAR-100", (
        _section("table4", "cifar100", "topk",
                 [("resnet18", 0.99, 0.25), ("googlenet", 0.99, 0.25), ("senet18", 0.99, 0.25)]),
    )),
    "table5": TableSpec("table5", "Table 5: batch-size Accordion on CIFAR-10", (
        _section("table5", "cifar10", "batch",
                 [("resnet18", 512, 4096), ("densenet", 512, 4096), ("googlenet", 512, 4096)]),
    )),
    "table6": TableSpec("table6", "Table 6: batch-size Accordion on CIFAR-100", (
        _section("table6", "cifar100", "batch",
                 [("resnet18", 512, 4096), ("densenet", 512, 4096), ("googlenet", 512, 4096)]),
    )),
}


def _figure_cells(figure: str, model: str, dataset: str, compressor: str,
                  curves: tuple[tuple[str, str, int | float, int | float], ...]) -> tuple[FigureCell, ...]:
    return tuple(FigureCell(preset=f"{figure}/{model}_{method}", figure=figure, model=model,
                            dataset=dataset, method=method, label=label, compressor=compressor,
                            low=low, high=high)
                 for method, label, low, high in curves)


FIGURES: dict[str, FigureSpec] = {
    "fig2": FigureSpec(
        "fig2", "Figure 2: critical regimes (ResNet-18, CIFAR-10, PowerSGD rank 2 / rank 1)",
        _figure_cells("fig2", "resnet18", "cifar10", "powersgd", (
            ("high_inside", "Rank 1 only inside critical regimes", 2, 1),
            ("high_outside", "Rank 1 only outside critical regimes", 2, 1),
            ("high_earliest", "Rank 1 in the earliest non-critical epochs", 2, 1),
            ("high_random", "Rank 1 in random non-critical epochs", 2, 1),
            ("static_low", "Rank 2", 2, 2),
            ("static_high", "Rank 1", 1, 1),
            ("accordion", "Accordion 2<->1", 2, 1),
        ))),
    "fig9": FigureSpec(
        "fig9", "Figure 9: over-aggressive high compression (VGG-19bn, CIFAR-100, PowerSGD)",
        _figure_cells("fig9", "vgg19bn", "cifar100", "powersgd", (
            ("rank4", "Rank 4", 4, 4),
            ("rank1", "Rank 1", 1, 1),
            ("rank2", "Rank 2", 2, 2),
            ("accordion_4_1", "Accordion 4<->1", 4, 1),
            ("accordion_4_2", "Accordion 4<->2", 4, 2),
        ))),
    "fig10": FigureSpec(
        "fig10", "Figure 10: extremely large batch (ResNet-18, CIFAR-10)",
        _figure_cells("fig10", "resnet18", "cifar10", "none", (
            ("static_low", "B 512", 512, 512),
            ("static_high", "B 16384", 16384, 16384),
            ("accordion", "Accordion 512<->16384", 512, 16384),
        ))),
}


# Cells whose preset is another table cell's configuration under another name: where a scale has
# no run of the cell's own preset, the other table's run of that scale stands in for it (the
# whole-CIFAR study runs each of these configurations once; a test checks that each pair
# composes to the same config apart from its names). Own preset -> the preset that was run.
TWINS: dict[str, str] = {
    "fig2/resnet18_static_low": "table1/resnet18_powersgd_static_low",
    "fig2/resnet18_static_high": "table1/resnet18_powersgd_static_high",
    "fig2/resnet18_accordion": "table1/resnet18_powersgd_accordion",
    # B_low without compression is Table 1's dense run (same batch, LR and schedule).
    "fig10/resnet18_static_low": "table1/resnet18_powersgd_dense",
    "table5/resnet18_batch_static_low": "table1/resnet18_powersgd_dense",
    # The uncompressed baseline is the same run whichever compressor the table is about.
    "table3/resnet18_topk_dense": "table1/resnet18_powersgd_dense",
    "table3/senet18_topk_dense": "table1/senet18_powersgd_dense",
}


@dataclass(frozen=True)
class ComparisonCell:
    """One method of a comparison table; its runs are those with its `run.table` and
    `run.method` (a cell may borrow another table's preset: its `table` is then that one's)."""

    preset: str
    table: str               # run.table of the preset's runs
    model: str
    dataset: str
    method: str              # run.method
    label: str
    compressor: str
    schedule: str            # schedule.name


@dataclass(frozen=True)
class ComparisonSpec:
    """A table of methods trained on the same seeds, each compared with `pairs`' methods seed
    by seed (the paired differences), and drawn as accuracy against floats."""

    id: str
    title: str
    cells: tuple[ComparisonCell, ...]
    pairs: tuple[str, ...]   # the methods every other one is paired against

    @property
    def own_presets(self) -> tuple[str, ...]:
        """The presets written for this table (not borrowed from another)."""
        return tuple(cell.preset for cell in self.cells if cell.table == self.id)


def _successor(method: str, label: str, compressor: str = "powersgd",
               schedule: str | None = None) -> ComparisonCell:
    return ComparisonCell(preset=f"successors/resnet18_{method}", table="successors",
                          model="resnet18", dataset="cifar10", method=method, label=label,
                          compressor=compressor, schedule=schedule or method)


# Accordion's successors run beside Table 1's Accordion 2<->1 and rank-2 runs of the same seeds
# (docs/schedules.md and docs/compressors.md describe each method).
SUCCESSORS = ComparisonSpec(
    "successors", "Accordion and its successors (ResNet-18, CIFAR-10, PowerSGD)",
    (ComparisonCell("table1/resnet18_powersgd_accordion", "table1", "resnet18", "cifar10",
                    "accordion", "Accordion 2<->1", "powersgd", "accordion"),
     ComparisonCell("table1/resnet18_powersgd_static_low", "table1", "resnet18", "cifar10",
                    "static_low", "Rank 2", "powersgd", "static"),
     _successor("lgreco", "L-GreCo r0=2 (ranks 1..4, alpha 1)"),
     _successor("lgreco_accordion", "L-GreCo + Accordion 2<->1"),
     _successor("acp_powersgd", "ACP-SGD rank 2", compressor="acp_powersgd", schedule="static"),
     _successor("acp_accordion", "ACP-SGD Accordion 2<->1", compressor="acp_powersgd",
                schedule="accordion"),
     _successor("phase_rule", "Phase rule (Accordion's floats)")),
    pairs=("accordion", "static_low"))


def _precision(method: str, label: str) -> ComparisonCell:
    return ComparisonCell(preset=f"precision/resnet18_{method}", table="precision",
                          model="resnet18", dataset="cifar10", method=method, label=label,
                          compressor="precision", schedule="accordion")


# Accordion over transport precision (comm/precision.py): the detector picks each layer's wire
# format, fp32 (or bf16) inside critical regimes and fp8 outside, against the dense run of the
# same seeds (the fp32 level is that run's all-reduce, bit for bit).
PRECISION = ComparisonSpec(
    "precision", "Accordion over transport precision (ResNet-18, CIFAR-10)",
    (ComparisonCell("table1/resnet18_powersgd_dense", "table1", "resnet18", "cifar10", "dense",
                    "Dense (no compression)", "none", "static"),
     _precision("accordion_fp32_fp8", "Accordion fp32<->fp8"),
     _precision("accordion_bf16_fp8", "Accordion bf16<->fp8")),
    pairs=("dense",))
COMPARISONS: dict[str, ComparisonSpec] = {SUCCESSORS.id: SUCCESSORS, PRECISION.id: PRECISION}


def all_presets() -> list[str]:
    """Every preset name the tables and figures need, in layout order."""
    names = [cell.preset for table in TABLES.values() for cell in table.cells]
    names += [cell.preset for figure in FIGURES.values() for cell in figure.cells]
    names += [preset for spec in COMPARISONS.values() for preset in spec.own_presets]
    return names


def run_command(preset: str, scale: str) -> str:
    return RUN_COMMAND.format(preset=preset, scale=scale)
