"""Every table and figure rebuilt from run directories that the real trainer wrote (scale=cpu).

The analysis must work on what the trainer really writes, not on a hand-made fixture: this
module trains a handful of tiny presets on the synthetic CIFAR-10 stand-in, builds everything,
and checks Table 1's numbers against the runs' own metrics.jsonl.
"""

from __future__ import annotations

import csv
import io
import statistics
import warnings
from pathlib import Path

import pytest

import yaml

from accordion_repro.analysis import build_all
from accordion_repro.analysis.collect import collect_runs
from conftest import read_metrics, train

TINY = ["scale=cpu", "dataset=synthetic_cifar10", "dataset.train_size=64", "dataset.test_size=32",
        "dist.nproc_per_node=1", "trainer.epochs=3", "trainer.max_steps_per_epoch=2",
        "trainer.max_eval_steps=1", "trainer.batch_size=16", "scale.width.resnet18=0.125",
        "trainer.checkpoint=false"]
TABLE1 = {"dense": [42, 43], "static_low": [42, 43], "static_high": [42], "accordion": [42]}
FIGURES = ["fig2/resnet18_high_inside", "fig2/resnet18_high_outside", "fig2/resnet18_accordion",
           "fig10/resnet18_static_low", "fig10/resnet18_accordion"]
OTHER = ["table5/resnet18_batch_accordion"]   # a batch-size cell: its label comes from the run


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("runs")
    made: dict = {}
    for method, seeds in TABLE1.items():
        for seed in seeds:
            preset = f"table1/resnet18_powersgd_{method}"
            made.setdefault(method, []).append(
                train([f"experiment={preset}", f"seed={seed}", *TINY], root / preset / f"seed{seed}"))
    for preset in FIGURES + OTHER:
        windows = ["schedule.windows=[[0,1]]"] if "high_" in preset else []  # 3 epochs: one window
        train([f"experiment={preset}", *TINY, *windows], root / preset / "seed42")
    return {"root": root, "table1": made}


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(path.read_text())))


@pytest.mark.slow
def test_every_table_and_figure_is_built_from_trainer_runs(runs, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        written = build_all(runs["root"], tmp_path / "out", net="10gbit")
    for n in range(1, 7):
        for ext in ("md", "tex", "csv"):
            assert (tmp_path / "out" / "tables" / f"table{n}.{ext}").exists()
    for fig in ("fig2", "fig9", "fig10"):
        if fig in written:
            for path in written[fig]:
                assert path.exists() and path.stat().st_size > 0
    for fig in ("fig2", "fig10"):  # these have runs, so they must be drawn
        assert {p.suffix for p in written[fig]} == {".png", ".pdf"}
    assert any(key.startswith("table1") and "tradeoff" in key for key in written)
    # A table without runs names the presets to run instead of failing.
    assert "table5/densenet_batch_accordion" in (tmp_path / "out/tables/table5.md").read_text()
    # The runs used a reduced ResNet-18, and the table says so.
    assert "Reduced models: resnet18 (width=0.125)" in (tmp_path / "out/tables/table1.md").read_text().splitlines()[0]


@pytest.mark.slow
def test_table1_numbers_equal_the_runs_metrics(runs, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        build_all(runs["root"], tmp_path / "out", net="10gbit", figures=False)
    rows = {r["method"]: r for r in _rows(tmp_path / "out/tables/table1.csv") if r["model"] == "resnet18"}

    def totals(run_dirs):
        finals = [read_metrics(d)[-1]["test_acc"] for d in run_dirs]
        floats = [sum(m["floats_sent"] for m in read_metrics(d)) / 1e6 for d in run_dirs]
        times = [sum(m["epoch_time_s"] for m in read_metrics(d)) for d in run_dirs]
        return finals, statistics.mean(floats), statistics.mean(times)

    _, low_floats, low_time = totals(runs["table1"]["static_low"])
    for method, run_dirs in runs["table1"].items():
        finals, floats, time_s = totals(run_dirs)
        row = rows[method]
        assert row["scale"] == "cpu" and row["runs_dataset"] == "synthetic_cifar10"
        assert int(row["seeds"]) == len(run_dirs)
        assert float(row["mean"]) == pytest.approx(statistics.mean(finals), abs=1e-6)
        if len(finals) > 1:
            assert float(row["std"]) == pytest.approx(statistics.stdev(finals), abs=1e-6)
        assert float(row["floats_m"]) == pytest.approx(floats, abs=1e-6)
        assert float(row["saved_vs_static_low"]) == pytest.approx(low_floats / floats, abs=1e-6)
        assert float(row["speedup_vs_static_low"]) == pytest.approx(low_time / time_s, abs=1e-6)
    assert float(rows["static_low"]["official_final"]) == 94.49  # the official log's rank-2 run
    # rank 1 sends fewer floats than rank 2, and the dense baseline many more
    assert float(rows["static_high"]["floats_m"]) < float(rows["static_low"]["floats_m"]) < float(rows["dense"]["floats_m"])


def _schedule(run_dir: Path) -> dict:
    return yaml.safe_load((run_dir / "resolved.yaml").read_text())["schedule"]


@pytest.mark.slow
def test_figures_and_batch_labels_follow_what_the_trainer_logged(runs, tmp_path):
    from accordion_repro.analysis import figures

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        frame = collect_runs(runs["root"]).frame
        build_all(runs["root"], tmp_path / "out", net="10gbit", figures=False)

    # Figure 2(a): the Accordion run's trace; epoch 0 always starts at low compression, so it is
    # shaded; the LR decays are where the logged LR drops.
    fig2 = figures.figure2(frame[frame["run.figure"] == "fig2"])
    trace = fig2.axes[0]
    accordion = runs["root"] / "fig2/resnet18_accordion/seed42"
    metrics = read_metrics(accordion)
    assert metrics[0]["levels"] == {str(_schedule(accordion)["low"]): sum(metrics[0]["levels"].values())}
    spans = [(p.get_x(), p.get_x() + p.get_width()) for p in trace.patches if p.get_gid() == "critical"]
    assert spans and spans[0][0] == -0.5
    drops = [m["epoch"] - 0.5 for previous, m in zip(metrics, metrics[1:]) if m["lr"] < previous["lr"]]
    assert drops                      # the 3-epoch run decays its LR once
    assert [line.get_xdata()[0] for line in trace.lines if line.get_gid() == "lr_decay"] == drops
    assert "shaded: epochs run critical" in trace.get_legend().get_texts()[0].get_text()

    # Figure 10: curves and title give the batch sizes run, not the paper's 512 / 16,384.
    low_run, acc_run = (runs["root"] / f"fig10/resnet18_{m}/seed42" for m in ("static_low", "accordion"))
    low_batch = {m["global_batch"] for m in read_metrics(low_run)}
    assert len(low_batch) == 1
    schedule = _schedule(acc_run)
    expected = [f"B {low_batch.pop()} (n=1)", f"Accordion {schedule['low']}<->{schedule['high']} (n=1)"]
    fig10 = figures.figure10(frame[frame["run.figure"] == "fig10"])
    legend = [text.get_text() for text in fig10.axes[0].get_legend().get_texts()]
    assert legend[:2] == expected
    title = " ".join(fig10.get_suptitle().split())
    assert "vs the paper's 512 / 16,384" in title and "scale cpu" in title
    assert "reduced models: resnet18 (width=0.125)" in title

    # Table 5: the run's row names its batch sizes and keeps the paper's beside them.
    table5 = runs["root"] / "table5/resnet18_batch_accordion/seed42"
    schedule = _schedule(table5)
    assert {m["global_batch"] for m in read_metrics(table5)} <= {schedule["low"], schedule["high"]}
    row = next(r for r in _rows(tmp_path / "out/tables/table5.csv")
               if r["model"] == "resnet18" and r["method"] == "accordion")
    assert row["label"] == (f"Accordion {schedule['low']}<->{schedule['high']} "
                            "(paper: Accordion 512<->4096)")
