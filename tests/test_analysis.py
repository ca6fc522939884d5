"""Collecting run directories, Tables 1-6, figures and the build entry point.

Until the trainer writes real runs, run directories here come from `write_run`, a small fixture
writer that follows the run-directory contract of docs/architecture.md. They are test inputs.
"""

import csv
import io
import re
import json
import math
import statistics
import warnings
from pathlib import Path

import matplotlib.ticker
import numpy as np
import pytest
import yaml

from accordion_repro.analysis.build import MissingFigureWarning, build_all
from accordion_repro.analysis.collect import SkippedRunWarning, collect_runs
from accordion_repro.analysis.consistency import MixedCellError
from accordion_repro.costmodel import ALLREDUCE, predict_epoch_time
from accordion_repro.analysis.layout import FIGURES, TABLES, TWINS, all_presets, run_command
from accordion_repro.analysis.reference import official_final, official_results


# ----------------------------------------------------------------------------- fixture writer

def write_run(root: Path, name: str, *, table="table1", figure=None, model="resnet18",
              method="static_low", label="Rank 2", seed=0, scale="cpu",
              dataset="synthetic_cifar10", compressor="powersgd", rank=2, accs=(50.0, 60.0, 70.0),
              metric="test_acc", floats=1000, bytes_per_float=4, epoch_time=2.0, compute=1.5,
              steps=10, collectives=6, world_size=2, status="completed", layers=3,
              critical=None, global_batch=None, schedule=None, lrs=None, lr_scales=None,
              data=None, width=None, critical_model=None, preset=None, numerics=None,
              machine=None) -> Path:
    """A run directory as the trainer writes it; epoch e's accuracy is accs[e].
    schedule: keys that replace the default static schedule's; lrs / lr_scales / critical_model:
    per-epoch values; data: summary.json's data description; width: model.width; numerics:
    trainer keys such as {"precision": "bf16"}."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = {"run": {"name": preset or f"{table or figure}/{model}_{method}", "table": table,
                      "figure": figure, "method": method, "label": label},
              "seed": seed, "scale": {"name": scale, "epochs_factor": 1},
              "model": {"name": model, **({"width": width} if width is not None else {})},
              "dataset": {"name": dataset, "subset": 0.1},
              "compressor": {"name": compressor, "rank": rank},
              "schedule": {"name": "static", "low": rank, "high": 1, **(schedule or {})},
              "trainer": {"epochs": len(accs), **(numerics or {})}, "dist": {"world_size": world_size}}
    (run_dir / "resolved.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for epoch, value in enumerate(accs):
        floats_sent = floats * (epoch + 1)
        record = {"epoch": epoch, "lr": lrs[epoch] if lrs else 0.1, "train_loss": 1.0, "test_loss": 1.0, metric: value,
                  "steps": steps, "batch_size": 128, "floats_sent": floats_sent,
                  "bytes_sent": floats_sent * bytes_per_float, "collectives": collectives,
                  "epoch_time_s": epoch_time, "compute_time_s": compute,
                  "comm_time_s": epoch_time - compute, "levels": {str(rank): layers},
                  "layer_levels": [rank] * layers,
                  "critical_layers": (critical[epoch] if critical else 0),
                  "critical_model": critical_model[epoch] if critical_model else None,
                  "lr_scale": lr_scales[epoch] if lr_scales else 1.0,
                  "global_batch": (global_batch[epoch] if global_batch else 256),
                  "detector": {"checked": True, "ratios": [None] * layers, "lr_rule": False,
                               "norms": [float(10 * (layer + 1) / (epoch + 1))
                                         for layer in range(layers)]}}
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"num_params": 1234, "world_size": world_size, "status": status,
               f"final_{metric}": accs[-1], "epochs_completed": len(accs),
               **({"data": data} if data is not None else {}),
               **({"numerics": machine} if machine is not None else {})}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def read_csv(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


def quiet_build(*args, figures=False, **kwargs):
    """Tables only unless asked: drawing figures is the slow part of a build."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_all(*args, figures=figures, **kwargs)


# ----------------------------------------------------------------------------- layout

def test_layout_presets_are_unique_and_official_rows_exist():
    presets = all_presets()
    assert len(presets) == len(set(presets))
    assert "table1/resnet18_powersgd_accordion" in presets
    for spec in TABLES.values():
        for cell in spec.cells:
            assert cell.preset.startswith(f"{cell.table}/")
            if cell.method == "dense":
                assert cell.reference_setting is None
            else:   # every compressed cell has its official run
                assert official_final(cell.dataset, cell.family, cell.model,
                                      cell.reference_setting) is not None, cell
    assert len(official_results()) == 57
    assert official_final("cifar10", "powersgd", "resnet18", "accordion_r2_r1") == 94.72
    assert [cell.method for cell in FIGURES["fig9"].cells] == [
        "rank4", "rank1", "rank2", "accordion_4_1", "accordion_4_2"]
    assert [c.label for c in TABLES["table1"].cells if c.model == "vgg19bn"] == [
        "Dense (no compression)", "Rank 4", "Rank 1", "Accordion 4<->1"]


# ----------------------------------------------------------------------------- collect

def test_collect_gives_one_row_per_run_epoch_with_flat_config(tmp_path):
    write_run(tmp_path, "a/b/seed0", seed=0)
    write_run(tmp_path, "c/seed1", seed=1, accs=(1.0, 2.0))
    collection = collect_runs(tmp_path)
    frame = collection.frame
    assert len(frame) == 5 and not collection.broken and not collection.unfinished
    for column in ("model.name", "compressor.rank", "run.table", "seed", "scale.name",
                   "dataset.name", "summary.world_size", "test_acc", "floats_sent", "run_dir"):
        assert column in frame.columns, column
    assert sorted(frame["run_dir"].unique()) == ["a/b/seed0", "c/seed1"]
    assert set(frame["compressor.rank"]) == {2}


def test_broken_and_unfinished_runs_are_skipped_with_warnings(tmp_path):
    write_run(tmp_path, "good", accs=(10.0, 20.0))
    no_summary = write_run(tmp_path, "no_summary")
    (no_summary / "summary.json").unlink()
    bad_line = write_run(tmp_path, "bad_line")
    with open(bad_line / "metrics.jsonl", "a") as handle:
        handle.write('{"epoch": 3, "test_acc": \n')
    write_run(tmp_path, "failed", status="failed")
    write_run(tmp_path, "running", status="running")
    write_run(tmp_path, "stopped", status="stopped")
    with pytest.warns(SkippedRunWarning) as caught:
        collection = collect_runs(tmp_path)
    messages = "\n".join(str(warning.message) for warning in caught)
    for name in ("no_summary", "bad_line", "failed", "running"):
        assert name in messages
    assert "missing summary.json" in messages and "line 4" in messages
    assert list(collection.frame["run_dir"].unique()) == ["good"]
    assert [Path(path).name for path, _ in collection.unfinished] == ["running", "stopped"]
    assert sorted(Path(path).name for path, _ in collection.broken) == [
        "bad_line", "failed", "no_summary"]


@pytest.mark.parametrize("lost", [2, 1], ids=["last_line", "middle_line"])
def test_a_completed_run_with_a_lost_metrics_line_is_refused_naming_the_epochs(tmp_path, lost):
    """Issue 37 item 2: its earlier epoch must not silently become the run's result."""
    write_run(tmp_path, "good", accs=(10.0, 20.0, 30.0))
    damaged = write_run(tmp_path, "damaged", accs=(10.0, 20.0, 30.0))
    lines = (damaged / "metrics.jsonl").read_text().splitlines(keepends=True)
    (damaged / "metrics.jsonl").write_text("".join(lines[:lost] + lines[lost + 1:]))
    with pytest.warns(SkippedRunWarning) as caught:
        collection = collect_runs(tmp_path)
    [message] = [str(w.message) for w in caught]
    assert str(damaged) in message and f"lacks epochs [{lost}]" in message
    assert "completed after 3 epochs" in message
    assert list(collection.frame["run_dir"].unique()) == ["good"]
    assert [path for path, _ in collection.broken] == [str(damaged)]


# ----------------------------------------------------------------------------- tables

def _table1_resnet_runs(root: Path) -> dict[str, list[Path]]:
    runs = {"static_low": [], "static_high": [], "accordion": []}
    for seed, accs in enumerate([(50.0, 91.0), (52.0, 92.5), (49.0, 90.1)]):
        runs["static_low"].append(write_run(root, f"low/s{seed}", seed=seed, accs=accs,
                                            floats=4000, epoch_time=3.0, compute=2.0))
    runs["static_high"].append(write_run(root, "high/s0", method="static_high", label="Rank 1",
                                         rank=1, accs=(40.0, 88.0), floats=1000,
                                         epoch_time=2.0, compute=1.5))
    for seed, accs in enumerate([(45.0, 91.5), (46.0, 90.5)]):
        runs["accordion"].append(write_run(root, f"acc/s{seed}", seed=seed, method="accordion",
                                           label="Accordion 2<->1", accs=accs,
                                           floats=2000 + 500 * seed, epoch_time=2.5,
                                           compute=1.8))
    return runs


def _expected(run_dirs: list[Path]) -> dict:
    finals = [read_metrics(d)[-1]["test_acc"] for d in run_dirs]
    floats = [sum(r["floats_sent"] for r in read_metrics(d)) / 1e6 for d in run_dirs]
    times = [sum(r["epoch_time_s"] for r in read_metrics(d)) for d in run_dirs]
    return {"mean": statistics.mean(finals),
            "std": statistics.stdev(finals) if len(finals) > 1 else None,
            "floats_m": statistics.mean(floats), "time": statistics.mean(times)}


def test_table_numbers_match_the_runs_metrics(tmp_path):
    runs = _table1_resnet_runs(tmp_path / "runs")
    written = quiet_build(tmp_path / "runs", tmp_path / "out", net="1gbit")
    rows = {row["method"]: row for row in read_csv(tmp_path / "out/tables/table1.csv")
            if row["model"] == "resnet18"}
    low = _expected(runs["static_low"])
    for method, run_dirs in runs.items():
        expected, row = _expected(run_dirs), rows[method]
        assert int(row["seeds"]) == len(run_dirs)
        assert float(row["mean"]) == pytest.approx(expected["mean"], abs=1e-6)
        if expected["std"] is None:
            assert row["std"] == ""
        else:
            assert float(row["std"]) == pytest.approx(expected["std"], abs=1e-6)
        assert float(row["floats_m"]) == pytest.approx(expected["floats_m"], abs=1e-6)
        assert float(row["saved_vs_static_low"]) == pytest.approx(
            low["floats_m"] / expected["floats_m"], abs=1e-6)
        assert float(row["speedup_vs_static_low"]) == pytest.approx(
            low["time"] / expected["time"], abs=1e-6)
        assert row["scale"] == "cpu" and row["runs_dataset"] == "synthetic_cifar10"
        assert row["status"] == "ok"
    assert float(rows["static_high"]["saved_vs_static_low"]) == pytest.approx(4.0)
    assert float(rows["static_low"]["official_final"]) == 94.49
    assert rows["dense"]["status"] == "missing"

    # predicted time: the cost model applied epoch by epoch with the run's own world size
    metrics = read_metrics(runs["static_high"][0])
    predicted = sum(predict_epoch_time(r["compute_time_s"] / r["steps"], r["steps"],
                                       r["bytes_sent"] / r["steps"], r["collectives"] / r["steps"],
                                       ALLREDUCE, "1gbit", 2) for r in metrics)
    assert float(rows["static_high"]["predicted_time_s"]) == pytest.approx(predicted, abs=1e-6)

    markdown = (tmp_path / "out/tables/table1.md").read_text()
    first = markdown.splitlines()[0]
    assert "Scale: cpu" in first and "synthetic_cifar10" in first
    assert f"{low['mean']:.2f} ± {low['std']:.2f}" in markdown
    assert "| resnet18 | Rank 1 | 88.00 | 1 |" in markdown
    assert "Predicted time, 1gbit p=2 (s)" in markdown
    assert "vgg19bn_powersgd_accordion scale=cpu" in markdown
    latex = (tmp_path / "out/tables/table1.tex").read_text()
    assert latex.startswith("% Table 1") and r"Accordion 2$\leftrightarrow$1" in latex
    assert set(written["table1"]) == {tmp_path / f"out/tables/table1.{ext}"
                                      for ext in ("md", "tex", "csv")}


def test_workers_option_overrides_the_world_size(tmp_path):
    write_run(tmp_path / "runs", "low", floats=10**6)
    quiet_build(tmp_path / "runs", tmp_path / "two", net="1gbit")
    quiet_build(tmp_path / "runs", tmp_path / "sixteen", net="1gbit", workers=16)
    two = read_csv(tmp_path / "two/tables/table1.csv")[1]
    sixteen = read_csv(tmp_path / "sixteen/tables/table1.csv")[1]
    assert two["predicted_workers"] == "2" and sixteen["predicted_workers"] == "16"
    assert float(sixteen["predicted_time_s"]) > float(two["predicted_time_s"])


MIXED_CASES = {  # (first run's config changes, second run's): is the cell one configuration?
    "another-eta": ({"schedule": {"name": "accordion", "eta": 0.5}},
                    {"schedule": {"name": "accordion", "eta": 0.3}}, "schedule.eta"),
    "another-precision": ({}, {"trainer": {"precision": "bf16"}}, "trainer.precision"),
    "seeds-only": ({"compressor": {"seed": 42}}, {"compressor": {"seed": 43}}, None),
    "a-static-run-with-its-detector-watching": ({}, {"schedule": {"detect": True, "eta": 0.3}},
                                                None),
    "a-key-added-after-the-first-ran": ({}, {"trainer": {"nan_policy": "stop"}}, None),
}


@pytest.mark.parametrize("case", MIXED_CASES, ids=list(MIXED_CASES))
def test_a_cell_whose_runs_are_not_one_configuration_stops_the_build_before_writing(tmp_path,
                                                                                  case):
    first, second, key = MIXED_CASES[case]
    for seed, changes in ((42, first), (43, second)):
        run_dir = write_run(tmp_path / "runs", f"table1/resnet18_accordion/v{seed}_seed{seed}",
                            method="accordion", seed=seed)
        config = yaml.safe_load((run_dir / "resolved.yaml").read_text())
        for group, values in changes.items():
            config[group] = {**config.get(group, {}), **values}
        (run_dir / "resolved.yaml").write_text(yaml.safe_dump(config))
    if key is None:
        quiet_build(tmp_path / "runs", tmp_path / "out")
        assert "| resnet18 | Accordion 2<->1 | 70.00 ± 0.00 | 2 |" in (
            tmp_path / "out/tables/table1.md").read_text()
        return
    with pytest.raises(MixedCellError, match=rf"table1, resnet18 accordion at scale cpu: "
                       rf"table1/resnet18_accordion/v42_seed42 and .*v43_seed43 .*{key}"):
        quiet_build(tmp_path / "runs", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_missing_tables_list_presets_and_commands(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = build_all(tmp_path / "no_runs_here", tmp_path / "out")
    assert any(issubclass(w.category, MissingFigureWarning) and "fig9/vgg19bn_rank4" in
               str(w.message) for w in caught)
    assert set(written) == ({f"table{i}" for i in range(1, 7)}
                            | {"fig2_paired", "table1_paired", "table3_paired", "successors",
                               "precision"})
    markdown = (tmp_path / "out/tables/table4.md").read_text()
    assert markdown.splitlines()[0].startswith("Table 4") and "no runs yet" in markdown
    for cell in TABLES["table4"].cells:
        assert run_command(cell.preset, "paper") in markdown
    rows = read_csv(tmp_path / "out/tables/table4.csv")
    assert len(rows) == len(TABLES["table4"].cells)
    assert {row["status"] for row in rows} == {"missing"}


def test_mixed_scales_get_separate_blocks(tmp_path):
    write_run(tmp_path / "runs", "cpu", scale="cpu", accs=(60.0,))
    write_run(tmp_path / "runs", "paper", scale="paper", dataset="cifar10", accs=(94.0,))
    quiet_build(tmp_path / "runs", tmp_path / "out")
    markdown = (tmp_path / "out/tables/table1.md").read_text()
    assert "Scales: cpu, paper (mixed" in markdown.splitlines()[0]
    assert ("## CIFAR-10, PowerSGD (scale cpu, runs on synthetic_cifar10; fp32; CPU not recorded)"
            in markdown)
    assert "## CIFAR-10, PowerSGD (scale paper, runs on cifar10; fp32; CPU not recorded)" in markdown
    means = [row["mean"] for row in read_csv(tmp_path / "out/tables/table1.csv")
             if row["method"] == "static_low" and row["model"] == "resnet18"]
    assert means == ["60.000000", "94.000000"]


def test_lstm_rows_use_perplexity_in_table3(tmp_path):
    write_run(tmp_path / "runs", "lstm", table="table3", model="lstm", method="accordion",
              compressor="topk", dataset="synthetic_text", metric="val_ppl", accs=(300.0, 150.0))
    quiet_build(tmp_path / "runs", tmp_path / "out")
    rows = [row for row in read_csv(tmp_path / "out/tables/table3.csv") if row["model"] == "lstm"]
    accordion = next(row for row in rows if row["method"] == "accordion")
    assert accordion["metric"] == "val_ppl" and float(accordion["mean"]) == 150.0
    assert float(accordion["official_final"]) == 97.15
    assert "Validation perplexity" in (tmp_path / "out/tables/table3.md").read_text()


# ----------------------------------------------------------------------------- build

def test_rebuilt_tables_are_byte_identical_and_leave_no_temporary_files(tmp_path):
    _table1_resnet_runs(tmp_path / "runs")
    write_run(tmp_path / "runs", "lstm", table="table3", model="lstm", method="static_low",
              compressor="topk", metric="val_ppl", accs=(200.0, 150.0))
    written = quiet_build(tmp_path / "runs", tmp_path / "out")
    paths = sorted(path for paths in written.values() for path in paths)
    first = {path: path.read_bytes() for path in paths}
    quiet_build(tmp_path / "runs", tmp_path / "out")
    assert {path: path.read_bytes() for path in paths} == first
    produced = sorted(p for p in (tmp_path / "out").rglob("*") if p.is_file())
    # 6 tables x 3 formats and the md and csv of fig2_paired, table1_paired, table3_paired,
    # successors and precision, no .tmp leftovers
    assert produced == paths and len(paths) == 28


def _spans(axes) -> list[tuple[float, float]]:
    return [(p.get_x(), p.get_x() + p.get_width()) for p in axes.patches if p.get_gid() == "critical"]


def _legend(axes) -> list[str]:
    return [text.get_text() for text in axes.get_legend().get_texts()]


NPZ_DATA = ("npz[cifar10_lossless_5k.npz, cifar10_jpeg_train10k_test10k.npz]: 3072 train / "
            "10000 test images, 10 classes (subset 3072 -> 3072 of 14000, augment on)")
ACCORDION = {"name": "accordion", "low": 2, "high": 1, "statistic": "mean"}


def _figure_runs(root: Path, fig10: bool = True):
    critical = (3, 3, 0, 0, 3)
    for method in ("high_inside", "high_outside", "accordion"):
        write_run(root, f"fig2/{method}", table=None, figure="fig2", method=method,
                  accs=(30.0, 50.0, 60.0, 65.0, 70.0), critical=critical)
    if fig10:
        write_run(root, "fig10/accordion", table=None, figure="fig10", method="accordion",
                  compressor="none", accs=(30.0, 50.0, 60.0, 65.0, 70.0), critical=critical,
                  global_batch=(512, 512, 16384, 16384, 512))


@pytest.mark.slow
def test_figures_are_reproducible_and_missing_ones_are_named(tmp_path):
    write_run(tmp_path / "runs", "fig10/accordion", table=None, figure="fig10",
              method="accordion", compressor="none", accs=(30.0, 60.0),
              global_batch=(512, 16384))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = build_all(tmp_path / "runs", tmp_path / "out")
    messages = [str(w.message) for w in caught if issubclass(w.category, MissingFigureWarning)]
    assert any("fig2: no runs" in m and "fig2/resnet18_high_inside" in m for m in messages)
    assert any("fig10: curves missing" in m and "fig10/resnet18_static_high scale=cpu" in m
               for m in messages)
    assert "fig2" not in written and "table1_tradeoff" not in written
    first = {path: path.read_bytes() for path in written["fig10"]}
    assert sorted(path.suffix for path in first) == [".pdf", ".png"]
    quiet_build(tmp_path / "runs", tmp_path / "out", figures=True)
    assert {path: path.read_bytes() for path in first} == first
    png, pdf = sorted(first, key=lambda path: path.suffix, reverse=True)
    assert first[png][:4] == b"\x89PNG" and b"CreationDate" not in first[pdf]


def test_figure_titles_say_scale_and_data_and_axes_have_units(tmp_path):
    from accordion_repro.analysis import figures
    from accordion_repro.analysis.summarize import summarize_runs

    _figure_runs(tmp_path / "runs")
    frame = collect_runs(tmp_path / "runs").frame
    fig2 = figures.figure2(frame[frame["run.figure"] == "fig2"])
    assert "scale cpu; runs on synthetic_cifar10" in fig2.get_suptitle()
    trace, accuracy = fig2.axes[:2]
    assert "accordion" in trace.get_title()          # the detector trace prefers Accordion
    assert len(trace.lines) == 3 and trace.get_yscale() == "log"
    # flags logged at the end of epochs 0, 1 and 4 hold for epochs 1-2 and 5; epoch 5 never ran,
    # and a static schedule's epoch 0 is not critical
    assert _spans(trace) == [(0.5, 2.5)]
    assert accuracy.get_ylabel() == "Test accuracy (%)" and accuracy.get_xlabel() == "Epoch"
    assert [t.get_text() for t in accuracy.get_legend().get_texts()] == [
        "Rank 1 only inside critical regimes (n=1)", "Rank 1 only outside critical regimes (n=1)",
        "Accordion 2<->1 (n=1)"]
    fig10 = figures.figure10(frame[frame["run.figure"] == "fig10"])
    batch_axes = fig10.axes[1]
    assert "Global batch size" in batch_axes.get_ylabel()
    assert list(batch_axes.lines[0].get_ydata()) == [512, 512, 16384, 16384, 512]

    _table1_resnet_runs(tmp_path / "table")
    table_frame = collect_runs(tmp_path / "table").frame
    runs = summarize_runs(table_frame)
    tradeoff = figures.tradeoff_figure(TABLES["table1"], runs, table_frame)
    assert "Table 1" in tradeoff.get_suptitle() and "scale cpu" in tradeoff.get_suptitle()
    assert "millions" in tradeoff.axes[0].get_xlabel()


def test_figure2_panel_c_puts_each_runs_last_accuracy_by_its_arm_and_joins_a_seeds_runs(tmp_path):
    from accordion_repro.analysis import figures

    finals = {("high_inside", 42): 84.4, ("high_inside", 43): 84.6,
              ("high_outside", 42): 85.2, ("high_outside", 43): 85.3}
    for (method, seed), final in finals.items():
        write_run(tmp_path / "runs", f"fig2/{method}/seed{seed}", table=None, figure="fig2",
                  method=method, seed=seed, accs=(30.0, 99.0, final))
    frame = collect_runs(tmp_path / "runs").frame
    panel = figures.figure2(frame).axes[2]
    assert panel.get_ylabel() == "Final test accuracy (%)"
    assert [t.get_text() for t in panel.get_xticklabels()] == [
        "Rank 1 only\ninside\ncritical\nregimes", "Rank 1 only\noutside\ncritical\nregimes"]
    dots = [sorted(map(tuple, points.get_offsets().tolist())) for points in panel.collections
            if points.get_offsets().shape[1:] == (2,) and len(points.get_offsets()) == 2]
    assert dots == [[(0.0, 84.4), (0.0, 84.6)], [(1.0, 85.2), (1.0, 85.3)]]
    joined = sorted(tuple(line.get_ydata()) for line in panel.lines)
    assert joined == [(84.4, 85.2), (84.6, 85.3)]  # seed 42's pair, seed 43's pair


def test_figure2_paired_table_states_each_seeds_finals_and_the_same_seed_differences(tmp_path):
    from accordion_repro.analysis.paired import write_paired_table

    finals = {("high_inside", 42): 84.4, ("high_inside", 43): 84.6, ("high_outside", 42): 85.2,
              ("high_outside", 43): 85.3, ("static_low", 42): 85.1}
    for (method, seed), final in finals.items():
        write_run(tmp_path / "runs", f"fig2/{method}/seed{seed}", table=None, figure="fig2",
                  method=method, seed=seed, scale="cpu_long", accs=(30.0, final), floats=500_000,
                  numerics={"precision": "bf16"})
    frame = collect_runs(tmp_path / "runs").frame
    md, csv_path = write_paired_table(FIGURES["fig2"], frame, tmp_path / "tables")
    text = md.read_text()
    assert "## scale cpu_long (bf16 autocast; CPU not recorded)" in text
    # floats per run: 0.5M + 1M (the helper logs floats x (epoch + 1))
    assert "| Rank 1 only inside critical regimes | 84.40 | 84.60 | 84.50 ± 0.14 | 1.5 |" in text
    assert "| Rank 2 | 85.10 | – | 85.10 | 1.5 |" in text
    # two differences, +0.8 and +0.7: std 0.0707, t = 0.75 / 0.05 = 15 with one degree of
    # freedom, p = 1 - 2 atan(15) / pi = 0.0424, 95 % CI 0.75 -+ 12.706 x 0.05
    assert ("| Rank 1 only outside critical regimes − Rank 1 only inside critical regimes "
            "| +0.80 | +0.70 | +0.75 ± 0.07 | [+0.11, +1.39] | 0.042 | 0.042 | 2 of 2 | – |") in text
    # Holm over the one headline contrast the block has: its own p; "matches" needs 3 seeds
    assert "| Accordion" not in text and "Rank 2 − " not in text  # no runs, no row
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert [(r["kind"], r["seed"], round(float(r["value"]), 2)) for r in rows
            if r["name"] == "Rank 1 only outside critical regimes − Rank 1 only inside critical "
            "regimes"] == [
        ("difference", "42", 0.8), ("difference", "43", 0.7), ("mean", "", 0.75),
        ("std", "", 0.07), ("ci95_low", "", 0.11), ("ci95_high", "", 1.39),
        ("p_paired_t", "", 0.04), ("positive", "", 2), ("n", "", 2), ("p_holm", "", 0.04)]
    write_run(tmp_path / "runs", "fig2/high_inside/rank4_seed42", table=None, figure="fig2",
              method="high_inside", seed=42, scale="cpu_long", accs=(30.0, 80.0))
    with pytest.raises(ValueError, match="more than one run per method and seed: .*rank4_seed42"):
        write_paired_table(FIGURES["fig2"], collect_runs(tmp_path / "runs").frame, tmp_path / "x")
    empty = write_paired_table(FIGURES["fig2"], frame.iloc[0:0], tmp_path / "none")[0]
    assert "No runs yet" in empty.read_text()
    assert run_command("fig2/resnet18_high_inside", "paper") in empty.read_text()


def test_table_paired_compares_each_models_cells_seed_by_seed_in_the_sections_metric(tmp_path):
    from accordion_repro.analysis.build import _table_epochs
    from accordion_repro.analysis.paired import write_table_paired

    finals = {("static_low", 0.99, 42): 84.0, ("static_low", 0.99, 43): 85.0,
              ("accordion", 0.1, 42): 84.5, ("accordion", 0.1, 43): 84.5}
    for (method, level, seed), final in finals.items():
        write_run(tmp_path / "runs", f"t3/{method}/seed{seed}", table="table3", method=method,
                  seed=seed, scale="cpu_long", compressor="topk", rank=level, accs=(30.0, final))
    for method, ppl in (("static_low", 150.0), ("accordion", 140.0)):
        write_run(tmp_path / "runs", f"t3/lstm_{method}", table="table3", model="lstm",
                  method=method, seed=42, scale="cpu", compressor="topk", metric="val_ppl",
                  accs=(200.0, ppl), dataset="synthetic_text")
    write_run(tmp_path / "runs", "t3/googlenet", table="table3", model="googlenet",
              method="static_low", seed=42, scale="cpu_long", compressor="topk", accs=(1.0, 2.0))
    frame = collect_runs(tmp_path / "runs").frame
    md, csv_path = write_table_paired(TABLES["table3"], _table_epochs(frame, "table3"), tmp_path)
    text = md.read_text()
    assert ("## scale cpu_long (fp32; CPU not recorded): resnet18, CIFAR-10, Top-K, final test "
            "accuracy (%)") in text
    # +0.5 and -0.5: mean 0, std 0.71, p = 1, one positive of two
    assert ("| Accordion 99%<->10% − K 99% | +0.50 | -0.50 | +0.00 ± 0.71 | [-6.35, +6.35] "
            "| 1.000 | 1.000 | 1 of 2 | – |") in text
    assert ("## scale cpu (fp32; CPU not recorded): lstm, WikiText-2, Top-K, final validation "
            "perplexity") in text
    assert "| Accordion 99%<->2% − K 99% | -10.00 | -10.00 | – | – | – | 0 of 1 | – |" in text
    assert "googlenet" not in text  # one cell of a model compares nothing
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert {r["scale"] for r in rows} == {"cpu_long/resnet18", "cpu/lstm"}


def test_norm_trace_shades_epoch_zero_marks_lr_decays_and_explains_itself(tmp_path):
    from accordion_repro.analysis import figures

    # Accordion starts critical (epoch 0 at rank 2, its low level); the flags logged at the
    # end of epochs 2 and 4 make epochs 3 and 5 critical; the LR warms up, then decays at 3 and 5.
    write_run(tmp_path / "runs", "fig2/accordion", table=None, figure="fig2", method="accordion",
              schedule=ACCORDION, accs=(10.0, 20.0, 30.0, 40.0, 50.0, 60.0),
              critical=(0, 0, 3, 0, 3, 0), lrs=(0.05, 0.1, 0.1, 0.01, 0.01, 0.001))
    frame = collect_runs(tmp_path / "runs").frame
    trace = figures.figure2(frame).axes[0]
    assert _spans(trace) == [(-0.5, 0.5), (2.5, 3.5), (4.5, 5.5)]
    decays = [line.get_xdata()[0] for line in trace.lines if line.get_gid() == "lr_decay"]
    assert decays == [2.5, 4.5]          # between the last epoch at the old LR and the first at the new
    legend = _legend(trace)
    assert legend[0].startswith("shaded: epochs run critical") and "rank 2" in legend[0]
    assert legend[1] == "LR decay (from epoch 3, 5)" and legend[2] == "one line per layer"
    assert trace.get_ylabel() == "Norm of the epoch's mean step gradient (L2)"
    locator = trace.xaxis.get_major_locator()
    assert isinstance(locator, matplotlib.ticker.MaxNLocator) and locator._integer

    # No critical epoch and a constant LR: neither shading nor decay lines, nor their legend entries.
    write_run(tmp_path / "quiet", "fig2/high_inside", table=None, figure="fig2",
              method="high_inside", accs=(10.0, 20.0, 30.0))
    quiet = figures.figure2(collect_runs(tmp_path / "quiet").frame).axes[0]
    assert _spans(quiet) == [] and _legend(quiet) == ["one line per layer"]
    assert not [line for line in quiet.lines if line.get_gid() == "lr_decay"]


def test_batch_schedule_lr_scale_is_no_decay_and_model_flags_shade(tmp_path):
    from accordion_repro.analysis import figures

    # B_high epochs run at 8x the LR (lr_scale 8); going back to B_low is no LR decay.
    write_run(tmp_path / "runs", "fig2/accordion", table=None, figure="fig2", method="accordion",
              compressor="none", schedule={"name": "batch_accordion", "low": 64, "high": 512},
              accs=(10.0, 20.0, 30.0, 40.0), global_batch=(64, 512, 64, 64),
              lrs=(0.1, 0.8, 0.1, 0.01), lr_scales=(1, 8, 1, 1),
              critical_model=(False, True, False, False))
    trace = figures.figure2(collect_runs(tmp_path / "runs").frame).axes[0]
    assert [line.get_xdata()[0] for line in trace.lines if line.get_gid() == "lr_decay"] == [2.5]
    assert _spans(trace) == [(-0.5, 0.5), (1.5, 2.5)]
    assert "small batch B 64" in _legend(trace)[0]


def test_every_epoch_axis_has_integer_ticks(tmp_path):
    from accordion_repro.analysis import figures

    _figure_runs(tmp_path / "runs")
    frame = collect_runs(tmp_path / "runs").frame
    built = [figures.figure2(frame[frame["run.figure"] == "fig2"]),
             figures.figure10(frame[frame["run.figure"] == "fig10"])]
    epoch_axes = [axes for figure in built for axes in figure.axes if axes.get_xlabel() == "Epoch"]
    assert len(epoch_axes) == 4  # Figure 2 (b)'s curves and their gaps to rank 2, Figure 10
    for axes in epoch_axes:
        locator = axes.xaxis.get_major_locator()
        assert isinstance(locator, matplotlib.ticker.MaxNLocator) and locator._integer
        assert all(float(tick).is_integer() for tick in axes.get_xticks())


def test_legends_list_only_methods_with_runs(tmp_path):
    from accordion_repro.analysis import figures
    from accordion_repro.analysis.summarize import summarize_runs

    _table1_resnet_runs(tmp_path / "runs")      # no dense run, no VGG or SENet
    frame = collect_runs(tmp_path / "runs").frame
    tradeoff = figures.tradeoff_figure(TABLES["table1"], summarize_runs(frame), frame)
    assert _legend(tradeoff.axes[0]) == ["resnet18", "Rank 2", "Rank 1", "Accordion 2<->1"]

    write_run(tmp_path / "fig9", "fig9/rank4", table=None, figure="fig9", model="vgg19bn",
              method="rank4", rank=4)
    fig9 = figures.figure9(collect_runs(tmp_path / "fig9").frame)
    assert _legend(fig9.axes[0]) == ["Rank 4 (n=1)"]


def _batch_runs(root: Path, table="table5", figure=None):
    """Batch-size runs at scale cpu: B_low 64 and B_high 512 global (the paper's 512 / 4096)."""
    schedule = {"name": "batch_accordion", "low": 64, "high": 512}
    write_run(root, f"{table or figure}/low", table=table, figure=figure, method="static_low",
              label="B 512", compressor="none", schedule={"name": "static"},
              global_batch=(64, 64, 64))
    write_run(root, f"{table or figure}/high", table=table, figure=figure, method="static_high",
              label="B 4096", compressor="none", schedule=schedule, global_batch=(512, 512, 512))
    write_run(root, f"{table or figure}/acc", table=table, figure=figure, method="accordion",
              label="Accordion 512<->4096", compressor="none", schedule=schedule,
              global_batch=(64, 512, 64), critical_model=(True, False, False))


def test_batch_labels_give_the_batch_sizes_run(tmp_path):
    from accordion_repro.analysis import figures

    _batch_runs(tmp_path / "runs")
    quiet_build(tmp_path / "runs", tmp_path / "out", figures=True)
    labels = {(row["model"], row["method"]): row["label"]
              for row in read_csv(tmp_path / "out/tables/table5.csv")}
    assert labels[("resnet18", "static_low")] == "B 64 (paper: B 512)"
    assert labels[("resnet18", "static_high")] == "B 512 (paper: B 4096)"
    assert labels[("resnet18", "accordion")] == "Accordion 64<->512 (paper: Accordion 512<->4096)"
    assert labels[("densenet", "static_low")] == "B 512"     # no run: the paper's label stays
    markdown = (tmp_path / "out/tables/table5.md").read_text()
    assert "| resnet18 | B 64 (paper: B 512) |" in markdown
    assert r"Accordion 64$\leftrightarrow$512" in (tmp_path / "out/tables/table5.tex").read_text()

    runs = collect_runs(tmp_path / "runs").frame
    from accordion_repro.analysis.summarize import summarize_runs
    tradeoff = figures.tradeoff_figure(TABLES["table5"], summarize_runs(runs), runs)
    assert _legend(tradeoff.axes[0]) == ["resnet18", "B 64", "B 512", "Accordion 64<->512"]

    _batch_runs(tmp_path / "fig10", table=None, figure="fig10")
    fig10 = figures.figure10(collect_runs(tmp_path / "fig10").frame)
    assert _legend(fig10.axes[0]) == ["B 64 (n=1)", "B 512 (n=1)", "Accordion 64<->512 (n=1)",
                                      "global batch size (right axis)"]
    title = " ".join(fig10.get_suptitle().split())
    assert ("differs from the paper: synthetic CIFAR-10 stand-in for CIFAR-10; global batch sizes "
            "run 64 / 512 (B 64, B 512, Accordion 64<->512) vs the paper's 512 / 16,384") in title


def test_paper_figures_state_scale_data_width_and_stand_ins(tmp_path):
    from accordion_repro.analysis import figures

    for method in ("rank4", "accordion_4_1"):
        write_run(tmp_path / "npz", f"fig9/{method}", table=None, figure="fig9", model="vgg19bn",
                  method=method, rank=4, dataset="npz", data=NPZ_DATA, width=0.25)
    title = " ".join(figures.figure9(collect_runs(tmp_path / "npz").frame).get_suptitle().split())
    assert "scale cpu; runs on npz; reduced models: vgg19bn (width=0.25)" in title
    assert ("data: npz[cifar10_lossless_5k.npz, cifar10_jpeg_train10k_test10k.npz]: 3072 train / "
            "10000 test images, 10 classes; 3 epochs") in title
    assert "differs from the paper: CIFAR-10 stand-in for CIFAR-100" in title

    write_run(tmp_path / "c100", "fig9/rank4", table=None, figure="fig9", model="vgg19bn",
              method="rank4", rank=4, dataset="cifar100", scale="paper")
    title = " ".join(figures.figure9(collect_runs(tmp_path / "c100").frame).get_suptitle().split())
    assert ("scale paper; runs on cifar100; computed in fp32; CPU not recorded; models at paper "
            "size") in title
    assert "stand-in" not in title and "differs from the paper" not in title

    _figure_runs(tmp_path / "synthetic")
    frame = collect_runs(tmp_path / "synthetic").frame
    title = " ".join(figures.figure2(frame[frame["run.figure"] == "fig2"]).get_suptitle().split())
    assert "synthetic CIFAR-10 stand-in for CIFAR-10" in title
    assert "models at paper size data: synthetic_cifar10; 5 epochs" in title


@pytest.mark.slow
def test_new_figure_elements_rebuild_byte_identical(tmp_path):
    _figure_runs(tmp_path / "runs", fig10=False)  # _batch_runs brings fig10's Accordion run
    # another configuration than _figure_runs' Accordion run, so another scale (one curve each)
    write_run(tmp_path / "runs", "fig2/trace", table=None, figure="fig2", method="accordion",
              schedule=ACCORDION, accs=(10.0, 20.0, 30.0, 40.0), critical=(3, 0, 3, 0),
              lrs=(0.05, 0.1, 0.01, 0.01), data=NPZ_DATA, dataset="npz", width=0.25,
              scale="cpu_full")
    _batch_runs(tmp_path / "runs", table=None, figure="fig10")
    written = quiet_build(tmp_path / "runs", tmp_path / "out", figures=True)
    paths = [path for key in ("fig2", "fig2_cpu", "fig10") for path in written[key]]
    first = {path: path.read_bytes() for path in paths}
    quiet_build(tmp_path / "runs", tmp_path / "out", figures=True)
    assert {path: path.read_bytes() for path in paths} == first


def test_command_line_entry_point(tmp_path, capsys):
    from accordion_repro.analysis.__main__ import main, parse_args

    defaults = parse_args([])
    assert (defaults.runs, defaults.out, defaults.net, defaults.workers) == (
        "results/runs", "results", "10gbit", None)
    write_run(tmp_path / "runs", "low")
    code = main(["--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
                 "--net", "25gbit", "--workers", "4"])
    assert code == 0
    out = capsys.readouterr()
    assert "table1:" in out.out and "fig9" in out.err
    assert "25gbit p=4" in (tmp_path / "out/tables/table1.md").read_text()
    assert not math.isnan(float(read_csv(tmp_path / "out/tables/table1.csv")[1]["predicted_time_s"]))


@pytest.mark.slow
def test_a_figure_over_several_scales_is_drawn_once_per_scale(tmp_path):
    """fig2 from the most faithful scale present, fig2_<scale> from each other: curves of
    different run lengths never share an axis."""
    runs = tmp_path / "runs"
    for scale, accs in (("cpu", (30.0, 50.0, 60.0, 65.0)), ("cpu_full", (40.0, 70.0))):
        for method in ("high_inside", "high_outside"):
            write_run(runs, f"{scale}/fig2/{method}", table=None, figure="fig2", method=method,
                      scale=scale, accs=accs)
    written = quiet_build(runs, tmp_path / "out", figures=True)
    assert {"fig2", "fig2_cpu"} <= set(written) and "fig2_cpu_full" not in written
    from accordion_repro.analysis.build import _by_scale
    from accordion_repro.analysis.collect import collect_runs

    frame = collect_runs(runs).frame
    parts = dict(_by_scale(frame, "fig2"))
    assert set(parts["fig2"]["scale.name"]) == {"cpu_full"}
    assert set(parts["fig2_cpu"]["scale.name"]) == {"cpu"}


# Final accuracies of each scale's fixture runs lie in their own band; a marker or curve that
# averaged runs of both scales would fall between the bands.
SCALE_BANDS = {"cpu": (20.0, 45.0), "cpu_long": (70.0, 95.0)}
TABLE1_METHODS = {"dense": {"compressor": "none"}, "static_low": {},
                  "static_high": {"rank": 1}, "accordion": {"schedule": ACCORDION}}


def _two_scale_runs(root: Path) -> None:
    """Table 1's four ResNet-18 cells, Figure 2 (b)'s arms, a Figure 9 curve and Figure 10's
    Accordion run at scales cpu and cpu_long, two seeds each (Figures 2 and 10 draw Table 1's
    twins)."""
    for scale, (low, _) in SCALE_BANDS.items():
        for offset, seed in enumerate((42, 43)):
            for index, (method, extra) in enumerate(TABLE1_METHODS.items()):
                final = low + 5.0 + 3.0 * index + 2.0 * offset
                write_run(root, f"{scale}/table1/{method}/seed{seed}", method=method, seed=seed,
                          scale=scale, accs=(low + 1.0, final), critical=(3, 0),
                          preset=f"table1/resnet18_powersgd_{method}", **extra)
            for index, method in enumerate(("high_inside", "high_outside")):
                write_run(root, f"{scale}/fig2/{method}/seed{seed}", table=None, figure="fig2",
                          method=method, seed=seed, scale=scale, critical=(3, 0),
                          accs=(low + 1.0, low + 6.0 + index + offset))
            write_run(root, f"{scale}/fig9/rank4/seed{seed}", table=None, figure="fig9",
                      model="vgg19bn", method="rank4", rank=4, seed=seed, scale=scale,
                      accs=(low + 1.0, low + 8.0 + offset))
            write_run(root, f"{scale}/fig10/accordion/seed{seed}", table=None, figure="fig10",
                      method="accordion", compressor="none", seed=seed, scale=scale,
                      accs=(low + 1.0, low + 9.0 + offset), global_batch=(512, 16384),
                      schedule={"name": "batch_accordion", "low": 512, "high": 16384})


def _drawn_values(axes) -> np.ndarray:
    """Every y value drawn on an axes: lines and markers, error bars, bands, scatter points."""
    from matplotlib.collections import PathCollection

    values = [np.asarray(line.get_ydata(), dtype=float) for line in axes.lines]
    for collection in axes.collections:
        if isinstance(collection, PathCollection):      # scatter: the points are the offsets
            values.append(np.asarray(collection.get_offsets(), dtype=float)[:, 1])
        else:
            values += [path.vertices[:, 1] for path in collection.get_paths()]
    values = np.concatenate(values) if values else np.array([])
    return values[np.isfinite(values)]


@pytest.mark.slow
def test_no_figure_marker_or_curve_mixes_scales(tmp_path, monkeypatch):
    """The real build on runs of two scales: every value any figure draws on an accuracy axis
    (curves, bands, trade-off markers and their error bars, panel (c)'s finals) lies in one
    scale's band, that scale's band only, and the figure's title names that scale; the most
    faithful scale keeps the unsuffixed name."""
    from accordion_repro.analysis import figures

    drawn = {}
    write_figure = figures.write_figure

    def capture(figure, out_dir, stem):
        drawn[stem] = figure
        return write_figure(figure, out_dir, stem)

    monkeypatch.setattr(figures, "write_figure", capture)
    _two_scale_runs(tmp_path / "runs")
    quiet_build(tmp_path / "runs", tmp_path / "out", figures=True)
    for stem, figure in sorted(drawn.items()):
        values = np.concatenate([_drawn_values(axes) for axes in figure.axes
                                 if "accuracy" in axes.get_ylabel().lower()])
        assert values.size, stem
        scales = {scale for value in values for scale, (low, high) in SCALE_BANDS.items()
                  if low <= value <= high}
        between = sorted({round(float(v), 2) for v in values
                          if not any(low <= v <= high for low, high in SCALE_BANDS.values())})
        assert not between and len(scales) == 1, (
            f"{stem} mixes scales: values {between} between the scales' bands, bands of {scales}")
        assert f"scale {scales.pop()};" in " ".join(figure.get_suptitle().split()), stem
    assert set(drawn) == {"fig2", "fig2_cpu", "fig9", "fig9_cpu", "fig10", "fig10_cpu",
                          "table1_tradeoff", "table1_tradeoff_cpu"}
    assert "scale cpu_long;" in drawn["table1_tradeoff"].get_suptitle()

    from accordion_repro.analysis.summarize import summarize_runs

    frame = collect_runs(tmp_path / "runs").frame           # the builder refuses both scales
    with pytest.raises(ValueError, match="table1 trade-off figure got runs of scales cpu, cpu_long"):
        figures.tradeoff_figure(TABLES["table1"], summarize_runs(frame), frame)
    # a curve's runs pass the same one-configuration check as a table cell's
    write_run(tmp_path / "runs", "cpu/fig10/accordion/seed44", table=None, figure="fig10",
              method="accordion", compressor="none", seed=44, accs=(21.0, 29.0),
              schedule={"name": "batch_accordion", "low": 512, "high": 4096})
    with pytest.raises(MixedCellError, match="fig10, resnet18 accordion at scale cpu: .*schedule.high"):
        quiet_build(tmp_path / "runs", tmp_path / "out2", figures=True)
    assert not (tmp_path / "out2").exists()


def test_figure2_draws_table1_runs_of_the_same_config_where_it_has_none(tmp_path):
    """The whole-CIFAR study runs Table 1's ResNet-18 cells once; Figure 2 reads them for its
    Rank 2 / Rank 1 / Accordion curves and its norm trace, and says so; a figure run of its
    own preset at that scale wins over the twin."""
    from accordion_repro.analysis.build import _with_twins
    from accordion_repro.analysis.collect import collect_runs
    from accordion_repro.analysis.figures import setup_text

    runs = tmp_path / "runs"
    write_run(runs, "fig2/high_inside", table=None, figure="fig2", method="high_inside")
    write_run(runs, "table1/accordion", method="accordion", label="Accordion 2<->1",
              preset="table1/resnet18_powersgd_accordion")
    write_run(runs, "table1/static_high", method="static_high", label="Rank 1", rank=1,
              preset="table1/resnet18_powersgd_static_high")
    write_run(runs, "fig2/static_high", table=None, figure="fig2", method="static_high", rank=1)
    frame = collect_runs(runs).frame
    own = frame[frame["run.figure"] == "fig2"]
    merged = _with_twins(frame, own, "run.figure", "fig2", FIGURES["fig2"].cells)
    twins = merged[merged["twin_of"].notna()]
    assert set(twins["twin_of"]) == {"table1/resnet18_powersgd_accordion"}
    assert set(twins["run.figure"]) == {"fig2"} and set(twins["run.method"]) == {"accordion"}
    assert set(merged["run.method"]) == {"high_inside", "static_high", "accordion"}
    assert len(merged[merged["run.method"] == "static_high"]["run_dir"].unique()) == 1
    assert "table runs: table1/resnet18_powersgd_accordion" in setup_text(merged, FIGURES["fig2"])
    # a scale where the figure has no run of its own gets no twins (and so no figure)
    write_run(runs, "cpu_full/table1/accordion", method="accordion", scale="cpu_full",
              preset="table1/resnet18_powersgd_accordion")
    frame = collect_runs(runs).frame
    merged = _with_twins(frame, frame[frame["run.figure"] == "fig2"], "run.figure", "fig2",
                         FIGURES["fig2"].cells)
    assert set(merged["scale.name"]) == {"cpu"}


def test_table5_shows_table1_dense_run_as_its_b_low_row_and_says_so(tmp_path):
    """Table 5's ResNet-18 B_low cell is Table 1's dense configuration: at a scale where Table 5
    has runs of its own, the dense run fills that row (named under the table); at a scale where
    it has none, Table 5 stays empty; a run of the cell's own preset wins over the twin."""
    runs = tmp_path / "runs"
    write_run(runs, "cpu/table1/dense", method="dense", label="Dense (no compression)",
              compressor="none", accs=(50.0, 71.5), preset="table1/resnet18_powersgd_dense")
    write_run(runs, "cpu_full/table1/dense", method="dense", label="Dense (no compression)",
              compressor="none", scale="cpu_full", accs=(50.0, 80.5),
              preset="table1/resnet18_powersgd_dense")
    write_run(runs, "cpu/table5/accordion", table="table5", method="accordion", compressor="none",
              label="Accordion 512<->4096", accs=(40.0, 66.25), global_batch=(128, 1024),
              schedule={"name": "batch_accordion", "low": 128, "high": 1024})
    quiet_build(runs, tmp_path / "out")
    text = (tmp_path / "out" / "tables" / "table5.md").read_text()
    cpu = text.split("(scale cpu,", 1)[1].split("## ", 1)[0]
    low = next(line for line in cpu.splitlines() if line.startswith("| resnet18 | B 256"))
    assert "| 71.50 | 1 |" in low
    assert "the runs of `table1/resnet18_powersgd_dense`, the same configuration as " \
           "`table5/resnet18_batch_static_low`" in cpu
    assert "scale cpu_full" not in text and "80.50" not in text
    assert "table1/resnet18_powersgd_dense" in (tmp_path / "out" / "tables" / "table5.tex").read_text()
    write_run(runs, "cpu/table5/static_low", table="table5", method="static_low",
              compressor="none", accs=(50.0, 70.25), preset="table5/resnet18_batch_static_low")
    quiet_build(runs, tmp_path / "out")
    text = (tmp_path / "out" / "tables" / "table5.md").read_text()
    assert "70.25" in text and "71.50" not in text and "TWINS" not in text


@pytest.mark.slow
@pytest.mark.parametrize("own", sorted(TWINS))
@pytest.mark.parametrize("scale", ["paper", "cpu", "cpu_full"])
def test_a_cell_and_its_twin_are_one_configuration(own, scale):
    """A table or figure may show another table's run in place of its own preset's only if the
    two presets resolve to the same config at every scale, apart from the names."""
    from omegaconf import OmegaConf

    from conftest import compose_cfg

    assert own in all_presets()

    def resolved(preset):
        cfg = OmegaConf.to_container(compose_cfg([f"experiment={preset}", f"scale={scale}"]),
                                     resolve=True)
        cfg.pop("run")
        cfg["logger"]["wandb"].pop("group", None)
        # A micro-batch cap at or above the per-worker batch splits nothing (the batch
        # presets set one for their B_high; their B_low cell never reaches it).
        trainer = cfg["trainer"]
        if trainer["max_micro_batch"] is not None and trainer["max_micro_batch"] >= trainer["batch_size"] \
                and cfg["schedule"]["name"] == "static":
            trainer["max_micro_batch"] = None
        return cfg

    assert resolved(own) == resolved(TWINS[own])


def test_runs_not_computed_in_fp32_say_so_in_their_table_block_and_figure(tmp_path):
    """A scale run in bf16 autocast with channels_last (scale=cpu_long) names it in its own
    table block (md heading, tex caption, csv column) and in every figure's provenance line;
    an fp32 block beside it says fp32; both say which CPU ran them (here: not recorded)."""
    from accordion_repro.analysis.collect import collect_runs as collect
    from accordion_repro.analysis.figures import provenance

    runs = tmp_path / "runs"
    write_run(runs, "cpu_full/table1/rank2", scale="cpu_full", accs=(40.0, 70.0))
    fast = {"precision": "bf16", "channels_last": True}
    write_run(runs, "cpu_long/table1/rank2", scale="cpu_long", accs=(45.0, 75.0), numerics=fast)
    write_run(runs, "cpu_long/fig2/inside", table=None, figure="fig2", method="high_inside",
              label="Rank 1 only inside critical regimes", scale="cpu_long", numerics=fast)
    out = tmp_path / "out"
    quiet_build(runs, out)
    md = (out / "tables" / "table1.md").read_text()
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert any("scale cpu_long" in h and "bf16 autocast, channels_last" in h for h in headings)
    assert any("scale cpu_full" in h and "bf16" not in h for h in headings)
    assert r"bf16 autocast, channels\_last" in (out / "tables" / "table1.tex").read_text()
    numerics = {row["scale"]: row["numerics"] for row in read_csv(out / "tables" / "table1.csv")}
    assert numerics == {"cpu_full": "fp32; CPU not recorded",
                        "cpu_long": "bf16 autocast, channels_last; CPU not recorded"}
    frame = collect(runs).frame
    assert provenance(frame[frame["scale.name"] == "cpu_long"]).endswith(
        "computed in bf16 autocast, channels_last; CPU not recorded")
    assert provenance(frame[frame["scale.name"] == "cpu_full"]).endswith(
        "computed in fp32; CPU not recorded")


def test_plateau_reports_each_lr_phases_last_third_and_its_trend():
    """analysis/plateau.py: phases split where the LR drops (warm-up rises stay in the first);
    the last third of each (at least two epochs) gives first/last accuracy, range and the
    least-squares trend over it."""
    from accordion_repro.analysis.plateau import phase_ends

    lrs = [0.05, 0.1, 0.1, 0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.001, 0.001]
    accs = [10, 30, 50, 60, 62, 61, 70, 70.2, 70.4, 71, 71]
    records = [{"epoch": e, "lr": lr, "test_acc": acc} for e, (lr, acc) in enumerate(zip(lrs, accs))]
    ends = phase_ends(records)
    assert [end.epochs for end in ends] == [(4, 5), (7, 8), (9, 10)]
    assert (ends[0].first_acc, ends[0].last_acc, ends[0].spread) == (62, 61, 1)
    assert ends[0].trend == pytest.approx(-1.0) and not ends[0].flat(0.5)
    assert ends[1].trend == pytest.approx(0.2) and ends[1].flat(0.5)
    assert ends[2].trend == pytest.approx(0.0)
    # a last phase of one epoch (a decay at the final epoch) has no trend: it is left out
    one_epoch = [*records, {"epoch": 11, "lr": 0.0001, "test_acc": 71.5}]
    assert [end.epochs for end in phase_ends(one_epoch)] == [(4, 5), (7, 8), (9, 10)]


@pytest.mark.parametrize("case", ["per_phase", "shortfall", "impossible"])
def test_the_outside_arm_takes_the_latest_quiet_epochs_of_each_phase(case):
    """analysis/regime_plan.py's stated rule: per LR phase as many epochs as the inside arm has
    there, the latest non-critical ones; a phase without enough borrows the latest left
    anywhere; more critical than quiet epochs is refused."""
    from accordion_repro.analysis.regime_plan import outside_epochs, windows

    phases = [0] * 6 + [1] * 4
    held = {"per_phase": [1, 1, 0, 0, 0, 0, 1, 0, 0, 0],
            "shortfall": [1, 0, 0, 0, 0, 0, 1, 1, 1, 0],
            "impossible": [1, 1, 1, 1, 1, 0, 1, 1, 0, 0]}[case]
    held = [bool(flag) for flag in held]
    if case == "impossible":
        with pytest.raises(ValueError, match="7 of 10 epochs critical"):
            outside_epochs(held, phases)
        return
    chosen = outside_epochs(held, phases)
    assert chosen == {"per_phase": [4, 5, 9], "shortfall": [3, 4, 5, 9]}[case]
    assert len(chosen) == sum(held) and not any(held[e] for e in chosen)
    assert windows([0, 1, 2, 6, 8, 9]) == [[0, 3], [6, 7], [8, 10]]


FP32_MACHINE = {"cpu_model": "AMD EPYC", "cpu_capability": "AVX2", "bf16": "native",
                "isa_cap": {"ATEN_CPU_CAPABILITY": "avx2"}, "powersgd_packing": "aligned64"}


@pytest.mark.parametrize("differing, numerics, machine, key", [
    ("precision", {"precision": "bf16"}, FP32_MACHINE, "trainer.precision"),
    ("packing", None, {**FP32_MACHINE, "powersgd_packing": None}, "numerics.powersgd_packing"),
    ("instruction set", None, {**FP32_MACHINE, "cpu_capability": "AVX512", "isa_cap": {}},
     "numerics.cpu_capability"),
], ids=["precision", "packing", "instruction_set"])
def test_a_pair_of_runs_that_compute_differently_is_refused_naming_the_key(
        tmp_path, differing, numerics, machine, key):
    """Issue 55: two runs of one seed are never paired across precisions, PowerSGD packings or
    instruction sets; the refusal is one line naming the key and both runs."""
    from accordion_repro.analysis.paired import PairingError, write_paired_table

    write_run(tmp_path / "runs", "fig2/inside/seed42", table=None, figure="fig2",
              method="high_inside", seed=42, scale="cpu_fp32", machine=FP32_MACHINE)
    write_run(tmp_path / "runs", "fig2/outside/seed42", table=None, figure="fig2",
              method="high_outside", seed=42, scale="cpu_fp32", numerics=numerics,
              machine={k: v for k, v in machine.items() if v is not None})
    frame = collect_runs(tmp_path / "runs").frame
    with pytest.raises(PairingError, match=rf"refusing to pair .*outside/seed42 with "
                                           rf".*inside/seed42: {re.escape(key)} is") as error:
        write_paired_table(FIGURES["fig2"], frame, tmp_path / "tables")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "tables" / "fig2_paired.md").exists()


def test_the_matches_column_reads_each_arm_against_its_reference_over_three_seeds(tmp_path):
    """MLPerf's reading: the first run's seed mean within the second's mean ± 2 sample std.
    Rank 2 at 85.0 / 85.2 / 85.4 (mean 85.2, std 0.2): outside at 85.3 mean matches it, inside
    at 84.5 does not; with 2 seeds nothing is said."""
    from accordion_repro.analysis.paired import write_paired_table

    finals = {"static_low": (85.0, 85.2, 85.4), "high_outside": (85.1, 85.3, 85.5),
              "high_inside": (84.4, 84.5, 84.6), "accordion": (85.0, 85.2, 85.4)}
    for method, values in finals.items():
        for seed, final in zip((42, 43, 44), values):
            write_run(tmp_path / "runs", f"fig2/{method}/seed{seed}", table=None, figure="fig2",
                      method=method, seed=seed, scale="cpu_fp32", accs=(30.0, final),
                      machine=FP32_MACHINE)
    frame = collect_runs(tmp_path / "runs").frame
    md, csv_path = write_paired_table(FIGURES["fig2"], frame, tmp_path / "tables")
    rows = {(r["name"], r["kind"]): r["value"] for r in csv.DictReader(csv_path.open())}
    assert rows[("Rank 1 only outside critical regimes − Rank 1 only inside critical regimes",
                 "matches")] == "no"  # inside's std is 0.1: 85.3 is 0.8 off
    assert rows[("Accordion 2<->1 − Rank 2", "matches")] == "yes"
    assert "fp32; CPU AMD EPYC, AVX2 cap" in md.read_text().splitlines()[4]
    two = write_paired_table(FIGURES["fig2"], frame[frame["seed"] != 44], tmp_path / "two")[1]
    assert not any(r["kind"] == "matches" for r in csv.DictReader(two.open()))
