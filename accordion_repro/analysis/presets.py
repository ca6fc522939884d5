"""conf/experiment/ written from analysis/layout.py: the layout is the one list of cells, and each
preset file is rendered from its cell, so which cells exist is said once.

    python -m accordion_repro.analysis.presets           # rewrite every cell's preset
    python -m accordion_repro.analysis.presets --check   # exit 1 naming each file that differs

tests/test_presets.py checks that conf/experiment/ holds exactly these files, byte for byte. A
preset is a delta from a family base (conf/experiment/_base/, written by hand: the official
set-up): the cell's `run:` block, its model, dataset, compressor and schedule, and its levels.
What a cell's fields cannot say (Figure 2's arms, the successors' tuned schedules, a comment)
is kept here in NOTES, HEADERS and BODIES, keyed by the preset it belongs to.

A schedule that sets every layer's level (accordion, regime_windows, the successors') gets no
compressor level: it would never be read, and the config refuses one (config.check_level_owner).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from accordion_repro.comm.registry import level_option
from accordion_repro.run_layout import CONF_DIR
from accordion_repro.analysis.layout import (COMPARISONS, DATASET_TITLES, FIGURES, TABLES,
                                             level_text)

EXPERIMENT_DIR = CONF_DIR / "experiment"
MODEL_TITLES = {"resnet18": "ResNet-18", "vgg19bn": "VGG-19bn", "senet18": "SE-ResNet-18",
                "densenet": "DenseNet (densenet_cifar)", "googlenet": "GoogLeNet",
                "lstm": "LSTM 3x650"}
PAPER_BATCH = 512  # the base's global batch (4 workers x 128): B_low of the batch cells
BASE_BATCH_RATIO = 8  # _base/paper_batch_accordion's B_high = 8 x B_low
STATIC_METHODS = ("static_low", "static_high", "rank1", "rank2", "rank4")

# Comment lines after a preset's generated title line.
NOTES: dict[str, str] = {
    "fig2/resnet18_accordion": "# Its detector logs the per-layer gradient norms every epoch: "
                               "the norm trace of Figure 2.",
    **{f"fig2/resnet18_{arm}": ("# The windows are the paper's critical regimes as fractions of "
                                "the run: epochs 0-19, 150-159, 250-259 of 300.")
       for arm in ("high_inside", "high_outside")},
    **{f"fig10/resnet18_{method}": "# B_high = 16,384 global (appendix; facts sections 4 and 7)."
       for method in ("static_low", "static_high", "accordion")},
}


def _control_arm(how: str) -> str:
    return ("# Figure 2 (b), a control arm: rank 1 in as many epochs as the inside arm, in each LR "
            "phase the\n"
            f"# {how} of a reference run at rank 2 with\n"
            "# schedule.detect=true (analysis/regime_plan.py). The epochs come from that run's "
            "plan, so this\n"
            "# preset runs only with them: `python -m accordion_repro.analysis.regime_plan "
            "REF_RUN` prints the\n"
            "# schedule.windows override (scripts/reproduce_cpu.py --study cpu_long passes it).")


# Comment lines that replace a preset's generated title (a method the cell's label does not say).
HEADERS: dict[str, str] = {
    "fig2/resnet18_high_earliest": _control_arm("earliest non-critical ones"),
    "fig2/resnet18_high_random": _control_arm(
        "non-critical ones drawn at random (a committed seed)"),
    "successors/resnet18_acp_powersgd": (
        "# Accordion and its successors -- ResNet-18 on CIFAR-10: ACP-SGD at rank 2 (P and Q "
        "sent on\n# alternate steps, one compressed all-reduce per step; docs/compressors.md), "
        "all run long."),
    "successors/resnet18_acp_accordion": (
        "# Accordion and its successors -- ResNet-18 on CIFAR-10: ACP-SGD under Accordion "
        "2<->1: the\n# detector picks rank 2 (critical) or 1 per layer, and ACP-SGD sends "
        "that rank's P or Q\n# on alternate steps (docs/compressors.md, docs/schedules.md)."),
    "successors/resnet18_lgreco": (
        "# Accordion and its successors -- ResNet-18 on CIFAR-10: L-GreCo (MLSys 2024) with "
        "r0 = 2,\n# candidate ranks 1..4 (gamma 0.5, beta 2) and alpha 1: each epoch the ranks "
        "of least size whose\n# summed compression error is at most that of rank 2 everywhere "
        "(docs/schedules.md).\n# Compared with table1's Accordion 2<->1 and rank-2 runs of the "
        "same seeds (analysis/layout.py)."),
    "successors/resnet18_lgreco_accordion": (
        "# Accordion and its successors -- ResNet-18 on CIFAR-10: L-GreCo + Accordion: "
        "Accordion's\n# detector picks rank 2 (critical) or 1 per layer, and the error of that "
        "choice is L-GreCo's\n# budget over ranks 1..4 (r0 = 2, gamma 0.5, beta 2, alpha 1; "
        "docs/schedules.md)."),
    "successors/resnet18_phase_rule": (
        "# Accordion and its successors -- ResNet-18 on CIFAR-10: a zero-cost phase/size "
        "rule (after\n# LEGACY), tuned to Accordion 2<->1's average floats at scale=cpu_long "
        "(width 0.25, 30 epochs):\n# rank 2 everywhere for the first 1/15 of the run, then rank "
        "2 for layers below 10,000 entries\n# and rank 1 for the rest until 1/3 of the run, then "
        "rank 1 everywhere. At cpu_long that is\n# 12,738 floats per step against Accordion's "
        "12,754 (mean of its three committed seeds);\n# tests/test_successors.py checks the "
        "match. At other widths the split keeps other layers small."),
    **{f"precision/resnet18_accordion_{low}_fp8": (
        f"# Accordion over transport precision -- ResNet-18 on CIFAR-10: Accordion {low}<->fp8: "
        f"the\n# detector sends each layer's gradient in {low} inside critical regimes and in "
        "fp8 (e4m3, one fp32\n# scale per 256 values) outside them, summed in fp32 "
        "(docs/compressors.md, \"Transport precision\").\n# Compared with table1's dense runs "
        "of the same seeds (analysis/layout.py).") for low in ("fp32", "bf16")},
}

# The schedule options of a cell whose method has no rule below (the successors' tuned ones).
BODIES: dict[str, str] = {
    "successors/resnet18_acp_powersgd": "compressor:\n  rank: 2\n",
    "successors/resnet18_acp_accordion": "schedule:\n  low: 2\n  high: 1\n",
    "successors/resnet18_lgreco": "schedule:\n  r0: 2\n  gamma: 0.5\n  beta: 2.0\n  alpha: 1.0\n",
    "successors/resnet18_lgreco_accordion": "schedule:\n  r0: 2\n  low: 2\n  high: 1\n",
    # precision's levels are bits per value: 32 fp32, 16 bf16, 8 fp8
    "precision/resnet18_accordion_fp32_fp8": "schedule:\n  low: 32\n  high: 8\n",
    "precision/resnet18_accordion_bf16_fp8": "schedule:\n  low: 16\n  high: 8\n",
    "successors/resnet18_phase_rule": (
        "schedule:\n"
        "  boundaries: [0.0666666667, 0.3333333333]  # epochs 2 and 10 of 30, 20 and 100 of 300\n"
        "  splits: [10000]\n"
        "  levels:\n"
        "    - [2, 2]\n"
        "    - [2, 1]\n"
        "    - [1, 1]\n"),
}


@dataclass(frozen=True)
class PresetCell:
    """What a preset is rendered from: a table, figure or comparison cell, in one shape."""

    preset: str
    owner: str               # "table" or "figure": the run.* key naming the cell's owner
    owner_id: str            # table1, fig2, successors, ...
    title: str               # the owner's title
    model: str
    dataset: str
    family: str              # powersgd | topk | acp_powersgd | batch
    method: str
    label: str
    low: int | float | None
    high: int | float | None
    schedule: str | None = None  # a comparison cell's schedule (others follow the method)


def preset_cells() -> list[PresetCell]:
    """Every cell that has a preset of its own, in layout order."""
    cells = [PresetCell(c.preset, "table", t.id, t.title, c.model, c.dataset, c.family, c.method,
                        c.label, c.low, c.high)
             for t in TABLES.values() for c in t.cells]
    cells += [PresetCell(c.preset, "figure", f.id, f.title, c.model, c.dataset,
                         "batch" if c.compressor == "none" else c.compressor, c.method, c.label,
                         c.low, c.high)
              for f in FIGURES.values() for c in f.cells]
    cells += [PresetCell(c.preset, "table", spec.id, spec.title, c.model, c.dataset, c.compressor,
                         c.method, c.label, None, None, schedule=c.schedule)
              for spec in COMPARISONS.values() for c in spec.cells if c.table == spec.id]
    return cells


def _what(cell: PresetCell) -> str:
    """The title line's end: what the cell runs."""
    if cell.method == "dense":
        return ("dense all-reduce, no compression (our baseline: the official material has "
                "none)")
    if cell.owner == "figure" or cell.method == "accordion":
        return cell.label
    level = cell.high if cell.method == "static_high" else cell.low
    if cell.family == "batch":
        return f"static global batch {level}"
    text = level_text(cell.family, level)
    end = "high" if cell.method == "static_high" else "low"
    return f"static {text[0].lower()}{text[1:]} ({end} compression)"


def _header(cell: PresetCell) -> list[str]:
    if cell.preset in HEADERS:
        return HEADERS[cell.preset].splitlines()
    note = NOTES.get(cell.preset)
    if cell.owner == "figure":
        lines = [f"# {cell.title}: {_what(cell)}."]
    else:
        lines = [f"# {cell.title} -- {MODEL_TITLES[cell.model]} on "
                 f"{DATASET_TITLES[cell.dataset]}: {_what(cell)}."]
        official = ("the official README (facts section 7)" if cell.owner_id == "table2" else
                    "ours (the official README names only Table 2; facts section 7)")
        lines.append(f"# Table assignment: {official}. Values: facts sections 3-5.")
    return lines + (note.splitlines() if note is not None else [])


def _kind(cell: PresetCell) -> str:
    """dense | static | accordion | windows | plan_windows | <a comparison cell's schedule>."""
    if cell.schedule is not None:
        return cell.schedule
    if cell.method == "dense":
        return "dense"
    if cell.method in STATIC_METHODS:
        return "static"
    if cell.method in ("high_inside", "high_outside"):
        return "windows"
    if cell.method in ("high_earliest", "high_random"):
        return "plan_windows"
    if cell.method == "accordion" or cell.method.startswith("accordion_"):
        return "accordion"
    raise ValueError(f"{cell.preset}: no preset rule for method {cell.method!r}")


def _base(cell: PresetCell) -> str:
    if cell.model == "lstm":
        return "paper_lstm"
    if cell.family != "batch":
        return "paper_cifar"
    return "paper_batch" if cell.method == "static_low" else "paper_batch_accordion"


def _defaults(cell: PresetCell, kind: str) -> list[str]:
    lines = ["defaults:", f"  - /experiment/_base/{_base(cell)}"]
    if cell.model != "lstm":
        lines.append(f"  - override /model: {cell.model}")
    if cell.dataset == "cifar100":
        lines.append("  - override /dataset: cifar100")
    if cell.family != "batch" and kind != "dense":
        lines.append(f"  - override /compressor: {cell.family}")
        schedule = cell.schedule or {"accordion": "accordion", "windows": "regime_windows",
                                     "plan_windows": "regime_windows"}.get(kind)
        if schedule is not None:
            lines.append(f"  - override /schedule: {schedule}")
    return lines


def _run_block(cell: PresetCell) -> list[str]:
    return ["run:", f"  name: {cell.preset}", f"  {cell.owner}: {cell.owner_id}",
            f"  method: {cell.method}", f'  label: "{cell.label}"']


def _batch_high(cell: PresetCell) -> list[str]:
    """B_high, where it is not the base's 8 x B_low."""
    ratio = cell.high // PAPER_BATCH
    if ratio == BASE_BATCH_RATIO:
        return []
    return [f"  high: ${{acc.mul:${{trainer.batch_size}},${{dist.nproc_per_node}},{ratio}}}"
            f"  # B_high = {ratio} x B_low ({cell.high})"]


def _body(cell: PresetCell, kind: str) -> str:
    if cell.preset in BODIES:
        return BODIES[cell.preset]
    level = cell.high if cell.method == "static_high" else cell.low
    if cell.family == "batch":
        lines = []
        if cell.method != "static_low":
            lines = ["schedule:"]
            if kind == "static":
                lines += ["  mode: fixed_epoch        # B_high from epoch 0 on: a static large batch",
                          "  switch_epoch: 0"]
            lines += _batch_high(cell)
        return "\n".join(lines) + "\n" if len(lines) > 1 else ""
    if kind == "static":
        return f"compressor:\n  {level_option(cell.family)}: {level!r}\n"
    if kind == "accordion":
        return f"schedule:\n  low: {cell.low!r}\n  high: {cell.high!r}\n"
    if kind == "windows":
        inside, outside = ((cell.high, cell.low) if cell.method == "high_inside"
                           else (cell.low, cell.high))
        return (f"schedule:\n  inside: {inside}           # rank inside the critical regimes\n"
                f"  outside: {outside}          # rank outside them\n")
    if kind == "plan_windows":
        arm = cell.method.removeprefix("high_")
        return (f"schedule:\n  windows: plan:{arm}   # refused until replaced by the plan's "
                f"windows\n  inside: {cell.high}            # rank in the plan's epochs\n"
                f"  outside: {cell.low}           # rank elsewhere\n")
    return ""


def render(cell: PresetCell) -> str:
    """The text of `cell`'s preset file."""
    kind = _kind(cell)
    lines = ["# @package _global_", *_header(cell), *_defaults(cell, kind), "",
             *_run_block(cell)]
    body = _body(cell, kind)
    return "\n".join(lines) + "\n" + (f"\n{body}" if body else "")


def preset_path(preset: str) -> Path:
    return EXPERIMENT_DIR / f"{preset}.yaml"


def stale_files() -> list[str]:
    """Presets under conf/experiment/ (family bases aside) that differ from their rendering,
    are missing, or fill no cell."""
    rendered = {cell.preset: render(cell) for cell in preset_cells()}
    on_disk = {path.relative_to(EXPERIMENT_DIR).with_suffix("").as_posix()
               for path in EXPERIMENT_DIR.rglob("*.yaml")
               if "_base" not in path.relative_to(EXPERIMENT_DIR).parts}
    stale = [name for name, text in rendered.items()
             if not preset_path(name).exists() or preset_path(name).read_text() != text]
    return sorted(stale + sorted(on_disk - set(rendered)))


def write_all() -> list[str]:
    """Write every cell's preset; the names of those that changed."""
    changed = []
    for cell in preset_cells():
        path, text = preset_path(cell.preset), render(cell)
        if not path.exists() or path.read_text() != text:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            changed.append(cell.preset)
    return changed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        stale = stale_files()
        for name in stale:
            print(f"conf/experiment/{name}.yaml differs from analysis/layout.py's cell "
                  "(python -m accordion_repro.analysis.presets rewrites it)", file=sys.stderr)
        return 1 if stale else 0
    if argv:
        print("usage: python -m accordion_repro.analysis.presets [--check]", file=sys.stderr)
        return 2
    for name in write_all():
        print(f"wrote conf/experiment/{name}.yaml")
    return 0


if __name__ == "__main__":
    sys.exit(main())
