"""Experiment presets: one per cell of analysis/layout.py (rendered from it by
analysis/presets.py), the official values at scale=paper, the same experiment shrunk at
scale=cpu, and every piece buildable from the composed config."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from accordion_repro.accordion import SCHEDULES, build_schedule
from accordion_repro.analysis.layout import COMPARISONS, FIGURES, TABLES, all_presets
from accordion_repro.comm import build_reducer, validate_compressor
from accordion_repro.comm.config import level_of
from accordion_repro.comm.registry import level_option
from accordion_repro.config import check_level_owner, validate, world_size_of
from accordion_repro.engine.lr import build_epoch_lr, decay_epochs
from accordion_repro.engine.settings import DistSettings, OptimSettings
from accordion_repro.errors import DatasetMissingError
from accordion_repro.models import build_model, count_parameters
from conftest import CONF_DIR, compose_cfg, read_metrics, read_summary, train, train_in_pool

EXPERIMENT_DIR = CONF_DIR / "experiment"
CELLS = {cell.preset: cell for table in TABLES.values() for cell in table.cells}
CELLS.update({cell.preset: cell for figure in FIGURES.values() for cell in figure.cells})
# the comparison tables' own presets (the cells they borrow are another table's, above)
COMPARED = {cell.preset: cell for spec in COMPARISONS.values() for cell in spec.cells
            if cell.table == spec.id}
CELLS.update(COMPARED)
PRESETS = all_presets()
SYNTHETIC = {"cifar10": "synthetic_cifar10", "cifar100": "synthetic_cifar100",
             "wikitext2": "synthetic_text"}
DATASET_NAMES = sorted(path.stem for path in (CONF_DIR / "dataset").glob("*.yaml"))

# ---- the official set-up, written from accordion-facts.md (not from the presets) ------------
# Section 5: CIFAR and WikiText-2 training set-ups; section 2: detector interval.
OFFICIAL_SETUP = {
    "image": dict(workers=4, batch=128, lr=0.1, peak_lr=0.4, warmup=5, decays=[150, 250],
                  epochs=300, interval=10, momentum=0.9, weight_decay=1e-4, clip=None),
    "text": dict(workers=4, batch=128, lr=2.5, peak_lr=10.0, warmup=5, decays=[60, 80],
                 epochs=90, interval=5, momentum=0.9, weight_decay=0.0, clip=0.4),
}
# Section 3: (low, high) levels per (dataset, compressor, model); section 4 and 7: batches.
OFFICIAL_LEVELS = {
    ("cifar10", "powersgd", "resnet18"): (2, 1),
    ("cifar10", "powersgd", "vgg19bn"): (4, 1),
    ("cifar10", "powersgd", "senet18"): (4, 1),
    **{("cifar100", "powersgd", m): (2, 1) for m in ("resnet18", "densenet", "senet18")},
    **{("cifar10", "topk", m): (0.99, 0.10) for m in ("resnet18", "googlenet", "senet18")},
    **{("cifar100", "topk", m): (0.99, 0.25) for m in ("resnet18", "googlenet", "senet18")},
    ("wikitext2", "topk", "lstm"): (0.99, 0.02),
    **{(d, "batch", m): (512, 4096) for d in ("cifar10", "cifar100")
       for m in ("resnet18", "densenet", "googlenet")},
}
# Section 6: parameter counts of the paper models (SE-ResNet-18 at its intended 512 channels).
OFFICIAL_PARAMS = {
    ("resnet18", 10): 11_173_962, ("resnet18", 100): 11_220_132,
    ("vgg19bn", 10): 20_565_834, ("vgg19bn", 100): 39_327_652,
    ("senet18", 10): 11_267_842, ("senet18", 100): 11_314_012,
    ("densenet", 10): 1_000_618, ("densenet", 100): 1_035_268,
    ("googlenet", 10): 6_166_250, ("googlenet", 100): 6_258_500,
    ("lstm", 33_278): 31_819_578,
}
WIKITEXT2_VOCAB = 33_278


# Figure 2 (b)'s control arms take their epochs from a detect run's plan (schedule.windows:
# plan:<arm> until an override gives them); here a plan's windows as fractions of the run.
PLAN_ARMS = ("high_earliest", "high_random")
PLAN_WINDOWS = "schedule.windows=[[0.1,0.2],[0.6,0.7]]"


def with_plan(preset: str) -> list[str]:
    return [PLAN_WINDOWS] if CELLS[preset].method in PLAN_ARMS else []


@lru_cache(maxsize=None)
def composed(preset: str, scale: str, *extra: str, plan: bool = True) -> dict:
    """Composed and resolved once per test session (each composition costs ~0.1 s); a control
    arm with a plan's windows unless plan=False."""
    cfg = compose_cfg([f"experiment={preset}", f"scale={scale}",
                       *(with_plan(preset) if plan else []), *extra])
    return OmegaConf.to_container(cfg, resolve=True)


def preset_files() -> set[str]:
    return {path.relative_to(EXPERIMENT_DIR).with_suffix("").as_posix()
            for path in EXPERIMENT_DIR.rglob("*.yaml")
            if "_base" not in path.relative_to(EXPERIMENT_DIR).parts}  # _base/: family bases


def is_text(cell) -> bool:
    return cell.dataset == "wikitext2"


def build_pieces(c: dict):
    """Model (on the meta device: shapes only), reducer and schedule from a resolved config."""
    num_classes = None if c["model"]["name"] == "lstm" else (100 if "100" in c["dataset"]["name"] else 10)
    vocab_size = WIKITEXT2_VOCAB if c["model"]["name"] == "lstm" else None
    options = {k: v for k, v in c["model"].items() if k != "name"}
    with torch.device("meta"):
        model = build_model(c["model"]["name"], num_classes=num_classes, vocab_size=vocab_size,
                            **options)
    params = [p for p in model.parameters() if p.requires_grad]
    comp = dict(c["compressor"])
    comp_name = comp.pop("name")
    compressor = validate_compressor(comp_name, comp)
    reducer = build_reducer(compressor, params)
    world = world_size_of(DistSettings.from_config(c["dist"]))
    sched = dict(c["schedule"])
    schedule = build_schedule(sched.pop("name"), num_layers=reducer.num_compressible,
                              compressor=comp_name, default_level=level_of(compressor),
                              base_global_batch=c["trainer"]["batch_size"] * world,
                              world_size=world, total_epochs=c["trainer"]["epochs"],
                              layer_shapes=reducer.matrix_shapes, **sched)
    return model, reducer, schedule


# ---- one preset per cell, one cell per preset: the layout's rendering ------------------------
def test_the_presets_are_exactly_what_the_layout_renders():
    """conf/experiment/ is written from analysis/layout.py (analysis/presets.py), one preset per
    cell: a cell added, changed or removed there without rewriting the presets, a preset that
    fills no cell, or one edited by hand, fails."""
    from accordion_repro.analysis.presets import main, preset_cells, stale_files

    assert len(PRESETS) == len(set(PRESETS)) == len(preset_files())
    assert [cell.preset for cell in preset_cells()] == PRESETS
    assert stale_files() == [], ("run `python -m accordion_repro.analysis.presets` to rewrite "
                                 "them from analysis/layout.py")
    assert main(["--check"]) == 0


def test_the_renderers_notes_belong_to_cells():
    from accordion_repro.analysis.presets import BODIES, HEADERS, NOTES

    assert set(NOTES) | set(HEADERS) | set(BODIES) <= set(PRESETS)


def test_a_changed_or_removed_cell_leaves_a_stale_preset(monkeypatch):
    """The check can fail: a level changed in the layout makes that cell's file stale, a cell
    removed leaves its file filling no cell."""
    from dataclasses import replace

    from accordion_repro.analysis import presets

    name = "table1/resnet18_powersgd_accordion"
    changed = [replace(c, low=8) if c.preset == name else c for c in presets.preset_cells()]
    monkeypatch.setattr(presets, "preset_cells", lambda: changed)
    assert presets.stale_files() == [name]
    assert "  low: 8\n" in presets.render(next(c for c in changed if c.preset == name))
    monkeypatch.setattr(presets, "preset_cells", lambda: [c for c in changed if c.preset != name])
    assert presets.stale_files() == [name]


@pytest.mark.parametrize("preset", PRESETS)
def test_no_preset_sets_a_level_its_schedule_never_reads(preset):
    """Under a schedule that sets every layer's level (accordion, regime_windows, the
    successors') compressor.rank / ratio is null; one a preset set would be refused."""
    c = composed(preset, "paper")
    comp = {k: v for k, v in c["compressor"].items() if k != "name"}
    check_level_owner(c["compressor"]["name"], comp, c["schedule"]["name"])


def test_every_compression_table_has_a_dense_baseline():
    for table in TABLES.values():
        for section in table.sections:
            if section.family == "batch":
                continue
            for model in {cell.model for cell in section.cells}:
                assert f"{table.id}/{model}_{section.family}_dense" in PRESETS


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_preset_fills_its_cell(preset):
    """run.* and the model, dataset, compressor and levels are those of the layout's cell."""
    cell = CELLS[preset]
    c = composed(preset, "paper")
    assert c["run"]["name"] == preset
    assert c["run"]["method"] == cell.method and c["run"]["label"] == cell.label
    assert c["run"]["table"] == getattr(cell, "table", None)
    assert c["run"]["figure"] == getattr(cell, "figure", None)
    assert (c["model"]["name"], c["dataset"]["name"]) == (cell.model, cell.dataset)
    assert c["compressor"]["name"] == cell.compressor
    assert c["scale"]["name"] == "paper"
    if preset in COMPARED:  # a compared method: its schedule, at table 1's rank 2
        assert c["schedule"]["name"] == cell.schedule
        # the compressor's own level where the schedule keeps it, else null (never read)
        own = c["compressor"][level_option(cell.compressor)]
        assert own == (None if SCHEDULES[cell.schedule].sets_levels else 2)
        if cell.compressor == "precision":  # Accordion fp32<->fp8 or bf16<->fp8, in bits
            low = {"fp32": 32, "bf16": 16}[cell.method.split("_")[1]]
            assert (c["schedule"]["low"], c["schedule"]["high"]) == (low, 8)
        return
    levels = preset_levels(c)
    if cell.method == "dense":
        assert levels == (None, None) and c["schedule"]["name"] == "static"
    elif cell.method in ("static_low", "rank4", "rank2", "rank1"):
        assert levels == (cell.low, cell.low)
    elif cell.method == "static_high":
        assert levels == (cell.high, cell.high)
    elif cell.method == "high_inside":
        assert (c["schedule"]["inside"], c["schedule"]["outside"]) == (cell.high, cell.low)
    elif cell.method == "high_outside":
        assert (c["schedule"]["inside"], c["schedule"]["outside"]) == (cell.low, cell.high)
    elif cell.method in PLAN_ARMS:  # rank 1 in the plan's epochs, which the preset cannot know
        assert (c["schedule"]["inside"], c["schedule"]["outside"]) == (cell.high, cell.low)
        assert composed(preset, "paper", plan=False)["schedule"]["windows"] == \
            "plan:" + cell.method.removeprefix("high_")
    else:  # accordion, accordion_4_1, accordion_4_2: the detector switches between the two
        assert c["schedule"]["name"] in ("accordion", "batch_accordion")
        assert c["schedule"].get("mode", "detector") == "detector"
        assert levels == (cell.low, cell.high)


def preset_levels(c: dict) -> tuple:
    """(level at the start, level outside critical regimes): ranks, ratios or global batches."""
    sched, comp = c["schedule"], c["compressor"]
    base_batch = c["trainer"]["batch_size"] * c["dist"]["nproc_per_node"]
    if sched["name"] == "batch_accordion":
        if sched["mode"] == "fixed_epoch":
            assert sched["switch_epoch"] == 0 and sched["low"] == base_batch
            return sched["high"], sched["high"]
        assert sched["low"] == base_batch, "B_low must be the trainer's global batch (LR basis)"
        return sched["low"], sched["high"]
    if sched["name"] == "accordion":  # sets every layer's level: the compressor has none
        assert _own_level(comp) is None
        return sched["low"], sched["high"]
    if sched["name"] == "static" and comp["name"] == "none":
        return (base_batch, base_batch) if c["run"]["method"] != "dense" else (None, None)
    level = _own_level(comp)
    return level, level


def _own_level(comp: dict):
    """The compressor's own level in a resolved config, read as the trainer reads it."""
    options = {k: v for k, v in comp.items() if k != "name"}
    return level_of(validate_compressor(comp["name"], options))


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["paper", "cpu", "cpu_full", "cpu_long"])
@pytest.mark.parametrize("preset", sorted(COMPARED))
def test_comparison_presets_compose_and_build_at_every_scale(preset, scale):
    """The comparison tables' presets at every scale: composed, and their reducer and schedule
    built over the model's real layers (the schedules weigh layers by their shapes)."""
    c = composed(preset, scale)
    assert c["scale"]["name"] == scale and c["run"]["table"] == COMPARED[preset].table
    _, reducer, schedule = build_pieces(c)
    levels = schedule.initial_plan().levels  # None: the compressor's own rank everywhere
    assert levels is None or len(levels) == reducer.num_compressible
    assert reducer.floats_per_step(levels) > 0


# ---- paper scale: the official values ----------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_paper_scale_carries_the_official_setup(preset):
    cell = CELLS[preset]
    c = composed(preset, "paper")
    want = OFFICIAL_SETUP["text" if is_text(cell) else "image"]
    trainer, optim = c["trainer"], c["optim"]
    assert c["dist"]["nproc_per_node"] == want["workers"]
    assert trainer["batch_size"] == want["batch"] and trainer["epochs"] == want["epochs"]
    assert optim["lr"] == want["lr"] and optim["warmup_epochs"] == want["warmup"]
    assert optim["momentum"] == want["momentum"] and not optim["nesterov"]
    assert optim["weight_decay"] == want["weight_decay"]
    assert optim["clip_grad_norm"] == want["clip"]
    assert decay_epochs(optim["decay_at"], trainer["epochs"]) == want["decays"]
    lr = build_epoch_lr(OptimSettings.from_config(optim), total_epochs=trainer["epochs"], world_size=want["workers"],
                        batch_size=trainer["batch_size"])
    assert lr(0) == pytest.approx(want["lr"])
    assert lr(want["warmup"]) == pytest.approx(want["peak_lr"])
    assert lr(want["decays"][0]) == pytest.approx(want["peak_lr"] / 10)
    assert lr(want["decays"][1]) == pytest.approx(want["peak_lr"] / 100)
    if "interval" in c["schedule"]:
        assert c["schedule"]["interval"] == want["interval"]
    if is_text(cell):
        model = c["model"]
        assert (model["num_layers"], model["hidden_size"], model["embedding_size"]) == (3, 650, 650)
        assert model["tied"] and model["dropout"] == 0.4 and c["dataset"]["bptt"] == 30
    if cell.model == "resnet18":
        assert c["model"]["width"] == 1.0


@pytest.mark.parametrize("preset", [p for p in PRESETS if p.startswith("table")])
def test_paper_scale_levels_are_the_official_ones(preset):
    cell = CELLS[preset]
    low, high = OFFICIAL_LEVELS[(cell.dataset, cell.family, cell.model)]
    c = composed(preset, "paper")
    expected = {"dense": (None, None), "static_low": (low, low), "static_high": (high, high),
                "accordion": (low, high)}[cell.method]
    assert preset_levels(c) == expected


def test_figure_presets_use_the_paper_levels_and_windows():
    fig2 = composed("fig2/resnet18_high_inside", "paper")
    assert fig2["schedule"]["name"] == "regime_windows"
    windows = [[round(a * 300), round(b * 300)] for a, b in fig2["schedule"]["windows"]]
    assert windows == [[0, 20], [150, 160], [250, 260]]
    assert (fig2["schedule"]["inside"], fig2["schedule"]["outside"]) == (1, 2)
    outside = composed("fig2/resnet18_high_outside", "paper")["schedule"]
    assert (outside["inside"], outside["outside"]) == (2, 1)
    assert preset_levels(composed("fig9/vgg19bn_accordion_4_2", "paper")) == (4, 2)
    assert preset_levels(composed("fig10/resnet18_accordion", "paper")) == (512, 16384)
    assert preset_levels(composed("fig10/resnet18_static_high", "paper")) == (16384, 16384)


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("scale", ["paper", "cpu"])
def test_preset_validates_and_builds_its_model_reducer_and_schedule(preset, scale, tmp_path):
    """Validated and built as the trainer would; the dataset files are absent (an empty root),
    so validation must get through every check and stop only at the files."""
    cell = CELLS[preset]
    c = composed(preset, scale)
    missing = OmegaConf.create(c)
    missing.paths.data_dir = str(tmp_path)
    for key in ("root", "path"):
        if key in missing.dataset:
            missing.dataset[key] = str(tmp_path / "absent")
    with pytest.raises(DatasetMissingError):
        validate(missing)
    model, reducer, schedule = build_pieces(c)
    assert reducer.num_compressible == schedule.num_layers >= 1
    plan = schedule.initial_plan()
    if plan.levels is not None:
        reducer.floats_per_step(plan.levels)
    if scale == "paper":
        key = WIKITEXT2_VOCAB if is_text(cell) else (100 if cell.dataset == "cifar100" else 10)
        assert count_parameters(model) == OFFICIAL_PARAMS[(cell.model, key)]


# ---- cpu scale: the same experiment, shrunk ----------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_cpu_scale_shrinks_the_same_experiment(preset):
    cell = CELLS[preset]
    paper, cpu = composed(preset, "paper"), composed(preset, "cpu")
    assert cpu["scale"]["name"] == "cpu" and cpu["dist"]["nproc_per_node"] == 2
    assert cpu["run"] == paper["run"]
    for section in ("compressor",):
        assert cpu[section] == paper[section]
    text = is_text(cell)
    epochs = cpu["trainer"]["epochs"]
    assert epochs == cpu["scale"]["by_dataset"][cpu["dataset"]["name"]]["epochs"]
    assert epochs < paper["trainer"]["epochs"]
    assert cpu["trainer"]["batch_size"] < paper["trainer"]["batch_size"]
    assert cpu["dataset"]["subset"] is not None and cpu["trainer"]["max_eval_steps"] is not None
    # the decays sit at the same fractions of the run (to the nearest epoch)
    decays = decay_epochs(cpu["optim"]["decay_at"], epochs)
    paper_decays = decay_epochs(paper["optim"]["decay_at"], paper["trainer"]["epochs"])
    assert paper_decays == ([60, 80] if text else [150, 250])
    assert [d / epochs for d in decays] == pytest.approx(
        [d / paper["trainer"]["epochs"] for d in paper_decays], abs=0.5 / epochs)
    if "interval" in cpu["schedule"]:
        assert cpu["schedule"]["interval"] == 1
    if cpu["schedule"]["name"] == "batch_accordion":  # B_low / B_high follow the batch
        base = cpu["trainer"]["batch_size"] * 2
        ratio = paper["schedule"]["high"] // paper["schedule"]["low"]
        assert (cpu["schedule"]["low"], cpu["schedule"]["high"]) == (base, base * ratio)
    if cell.model == "resnet18":
        assert cpu["model"]["width"] < 1.0
    if text:
        assert cpu["model"]["hidden_size"] == cpu["model"]["embedding_size"] < 650


@pytest.mark.slow
@pytest.mark.parametrize("scale", ["paper", "cpu", "cpu_full", "cpu_long"])
@pytest.mark.parametrize("dataset", DATASET_NAMES)
def test_scale_maps_cover_every_dataset(scale, dataset):
    """The per-dataset values resolve through nested interpolation for each dataset config."""
    cfg = compose_cfg([f"dataset={dataset}", f"scale={scale}", "schedule=accordion"])
    c = OmegaConf.to_container(cfg, resolve=True)
    family = c["dataset"]["name"]  # dataset=cifar10_jpeg is read by the npz loader
    text = family in ("wikitext2", "synthetic_text")
    assert c["scale"]["name"] == scale
    assert c["scale"]["detector_interval"] == (
        {"paper": 5, "cpu": 1, "cpu_full": 1, "cpu_long": 1}[scale] if text
        else {"paper": 10, "cpu": 1, "cpu_full": 2, "cpu_long": 1}[scale])
    if scale != "paper":
        assert c["trainer"]["epochs"] == c["scale"]["by_dataset"][family]["epochs"] < (90 if text else 300)


def test_cpu_full_scale_trains_on_the_whole_cifar10_and_tests_on_all_of_it():
    c = composed("table1/resnet18_powersgd_static_low", "cpu_full", "dataset=cifar10_jpeg")
    assert c["dataset"]["name"] == "npz" and c["dataset"]["subset"] is None
    assert c["dataset"]["path"].endswith("cifar10-jpeg-full/cifar10_jpeg_50k_10k.npz")
    assert c["trainer"]["max_eval_steps"] is None
    assert c["scale"]["detector_interval"] > 1
    assert c["model"]["width"] == 0.25


def test_cpu_long_scale_keeps_the_papers_proportions_over_30_epochs():
    """scale=cpu_long: the whole CIFAR-10, decays at 1/2 and 5/6 of the run (epochs 15 and 25),
    a detector check every 10/300 of the run (one epoch), bf16 with channels_last."""
    from accordion_repro.engine.lr import build_epoch_lr

    c = composed("table1/resnet18_powersgd_accordion", "cpu_long", "dataset=cifar10_jpeg")
    assert c["dataset"]["subset"] is None and c["trainer"]["max_eval_steps"] is None
    assert c["trainer"]["epochs"] == 30 and c["schedule"]["interval"] == 1 == 30 * 10 // 300
    assert c["trainer"]["precision"] == "bf16" and c["trainer"]["channels_last"] is True
    assert c["model"]["width"] == 0.25 and c["optim"]["warmup_epochs"] == 1
    lr = build_epoch_lr(OptimSettings.from_config(c["optim"]), total_epochs=30, world_size=2, batch_size=64)
    decays = [e for e in range(1, 30) if lr(e) < lr(e - 1)]
    assert decays == [15, 25]


def test_cpu_scale_data_subsets_fit_the_real_sample_data():
    """npz at scale=cpu draws a subset of the 14,000 real images in ../shared/data."""
    c = composed("table1/resnet18_powersgd_static_low", "cpu", "dataset=npz")
    assert c["dataset"]["name"] == "npz" and 0 < c["dataset"]["subset"] <= 14_000
    assert c["trainer"]["epochs"] == c["scale"]["by_dataset"]["npz"]["epochs"] < 300
    assert c["schedule"]["name"] == "static"


# ---- every preset trains (slow) ----------------------------------------------------------------
TINY = {
    "synthetic_cifar10": ["dataset.train_size=128", "dataset.test_size=8"],  # B_high 64 at batch 2
    "synthetic_cifar100": ["dataset.train_size=128", "dataset.test_size=8"],
    "synthetic_text": ["dataset.train_tokens=2000", "dataset.eval_tokens=400",
                       "dataset.vocab_size=50", "dataset.eval_batch_size=2"],
}


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_trains_two_steps_at_cpu_scale(preset, tmp_path):
    """Each preset at scale=cpu on its synthetic stand-in, one epoch of 2 steps, one process
    (one test id per preset, so a failure or a timeout names it).

    The Figure 2 windows are fractions of the run and vanish in a 1-epoch run (a ConfigError),
    so those presets keep their 30 epochs and stop after the first (status "stopped")."""
    dataset = SYNTHETIC[CELLS[preset].dataset]
    windows = CELLS[preset].method in ("high_inside", "high_outside", *PLAN_ARMS)
    length = ["trainer.stop_after_epoch=0"] if windows else ["trainer.epochs=1"]
    run_dir = tmp_path / "run"
    train([f"experiment={preset}", "scale=cpu", f"dataset={dataset}", *TINY[dataset],
           *with_plan(preset),
           "dataset.subset=null", "dist.nproc_per_node=1", *length,
           "trainer.max_steps_per_epoch=2", "trainer.max_eval_steps=1",
           "trainer.batch_size=2", "trainer.eval_batch_size=2", "trainer.checkpoint=false"],
          run_dir)
    metrics, summary = read_metrics(run_dir), read_summary(run_dir)
    assert summary["status"] == ("stopped" if windows else "completed")
    assert summary["scale"] == "cpu" and [m["steps"] for m in metrics] == [2]


@pytest.mark.parametrize("preset", [p for p in PRESETS if CELLS[p].method in PLAN_ARMS])
def test_a_control_arm_without_its_plans_windows_is_refused_naming_the_plan_tool(preset, tmp_path):
    from accordion_repro.errors import ConfigError

    c = OmegaConf.create(composed(preset, "cpu", "dataset=synthetic_cifar10", plan=False))
    c.paths.data_dir = str(tmp_path)
    with pytest.raises(ConfigError, match=r"schedule.windows: this arm's epochs come from a "
                                          r"reference run's plan .*analysis.regime_plan"):
        validate(c)


def test_a_long_override_list_still_makes_a_valid_directory_name():
    from accordion_repro.config import MAX_SUBDIR, _subdir
    long = ",".join(f"dataset.option_{i}={i}" for i in range(40))
    a, b = _subdir(long), _subdir(long + ",x=1")
    assert len(a.encode()) <= MAX_SUBDIR + 1 and a.endswith("/") and a != b
    assert _subdir("compressor.rank=4") == "compressor.rank=4/" and _subdir("") == ""


SHARDED_PRESETS = [preset for preset in PRESETS if preset.split("/")[0] in ("table1", "table3")]


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("preset", SHARDED_PRESETS)
def test_table1_and_table3_presets_train_a_step_under_fsdp(preset, rank_pool, tmp_path):
    """dist.strategy=fsdp (issue 40): each Table 1 and Table 3 preset at scale=cpu on its
    synthetic stand-in, 2 ranks, one step: the preset's reducer runs inside FSDP's
    reduce-scatter of every unit (the LSTM's local clipping in its one unit)."""
    dataset = SYNTHETIC[CELLS[preset].dataset]
    run_dir = train_in_pool(rank_pool, [
        f"experiment={preset}", "scale=cpu", f"dataset={dataset}", *TINY[dataset],
        "dataset.subset=null", "dist.nproc_per_node=2", "dist.strategy=fsdp",
        "trainer.epochs=1", "trainer.max_steps_per_epoch=1", "trainer.max_eval_steps=1",
        "trainer.batch_size=2", "trainer.eval_batch_size=2", "trainer.checkpoint=false"],
        tmp_path / "run")
    metrics, summary = read_metrics(run_dir), read_summary(run_dir)
    assert summary["status"] == "completed" and [m["steps"] for m in metrics] == [1]
    assert metrics[0]["bytes_sent"] > 0 and summary["world_size"] == 2
