"""Collecting run directories, Tables 1-6, figures and the build entry point.

Until the trainer writes real runs, run directories here come from `write_run`, a small fixture
writer that follows the run-directory contract of docs/architecture.md. They are test inputs.
"""

import csv
import io
import json
import math
import statistics
import warnings
from pathlib import Path

import pytest
import yaml

from accordion_repro.analysis.build import MissingFigureWarning, build_all
from accordion_repro.analysis.collect import SkippedRunWarning, collect_runs
from accordion_repro.analysis.costmodel import collective_op, predict_epoch_time
from accordion_repro.analysis.layout import FIGURES, TABLES, all_presets, run_command
from accordion_repro.analysis.reference import official_final, official_results


# ----------------------------------------------------------------------------- fixture writer

def write_run(root: Path, name: str, *, table="table1", figure=None, model="resnet18",
              method="static_low", label="Rank 2", seed=0, scale="cpu",
              dataset="synthetic_cifar10", compressor="powersgd", rank=2, accs=(50.0, 60.0, 70.0),
              metric="test_acc", floats=1000, bytes_per_float=4, epoch_time=2.0, compute=1.5,
              steps=10, collectives=6, world_size=2, status="completed", layers=3,
              critical=None, global_batch=None) -> Path:
    """A run directory as the trainer writes it; epoch e's accuracy is accs[e]."""
    run_dir = root / name
    run_dir.mkdir(parents=True)
    config = {"run": {"name": f"{table or figure}/{model}_{method}", "table": table,
                      "figure": figure, "method": method, "label": label},
              "seed": seed, "scale": {"name": scale, "epochs_factor": 1},
              "model": {"name": model}, "dataset": {"name": dataset, "subset": 0.1},
              "compressor": {"name": compressor, "rank": rank},
              "schedule": {"name": "static", "low": rank, "high": 1},
              "trainer": {"epochs": len(accs)}, "dist": {"world_size": world_size}}
    (run_dir / "resolved.yaml").write_text(yaml.safe_dump(config))
    lines = []
    for epoch, value in enumerate(accs):
        floats_sent = floats * (epoch + 1)
        record = {"epoch": epoch, "lr": 0.1, "train_loss": 1.0, "test_loss": 1.0, metric: value,
                  "steps": steps, "batch_size": 128, "floats_sent": floats_sent,
                  "bytes_sent": floats_sent * bytes_per_float, "collectives": collectives,
                  "epoch_time_s": epoch_time, "compute_time_s": compute,
                  "comm_time_s": epoch_time - compute, "levels": {str(rank): layers},
                  "layer_levels": [rank] * layers,
                  "critical_layers": (critical[epoch] if critical else 0),
                  "global_batch": (global_batch[epoch] if global_batch else 256),
                  "detector": {"checked": True, "ratios": [None] * layers, "lr_rule": False,
                               "norms": [float(10 * (layer + 1) / (epoch + 1))
                                         for layer in range(layers)]}}
        lines.append(json.dumps(record))
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    summary = {"num_params": 1234, "world_size": world_size, "status": status,
               f"final_{metric}": accs[-1], "epochs_completed": len(accs)}
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
                                       collective_op("powersgd"), "1gbit", 2) for r in metrics)
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


def test_missing_tables_list_presets_and_commands(tmp_path):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        written = build_all(tmp_path / "no_runs_here", tmp_path / "out")
    assert any(issubclass(w.category, MissingFigureWarning) and "fig9/vgg19bn_rank4" in
               str(w.message) for w in caught)
    assert set(written) == {f"table{i}" for i in range(1, 7)}
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
    assert "## CIFAR-10, PowerSGD (scale cpu, runs on synthetic_cifar10)" in markdown
    assert "## CIFAR-10, PowerSGD (scale paper, runs on cifar10)" in markdown
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
    assert produced == paths and len(paths) == 18    # 6 tables x 3 formats, no .tmp leftovers


def _figure_runs(root: Path):
    critical = (3, 3, 0, 0, 3)
    for method in ("high_inside", "high_outside", "accordion"):
        write_run(root, f"fig2/{method}", table=None, figure="fig2", method=method,
                  accs=(30.0, 50.0, 60.0, 65.0, 70.0), critical=critical)
    write_run(root, "fig10/accordion", table=None, figure="fig10", method="accordion",
              compressor="none", accs=(30.0, 50.0, 60.0, 65.0, 70.0), critical=critical,
              global_batch=(512, 512, 16384, 16384, 512))


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
    # flags logged at the end of epochs 0, 1 and 4 hold for epochs 1-2 and 5
    assert [tuple(p.get_x() + w for w in (0, p.get_width())) for p in trace.patches] == [
        (0.5, 2.5), (4.5, 5.5)]
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
