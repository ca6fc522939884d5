"""'Accordion and its successors' (analysis/comparison.py) on small fixture runs: t intervals,
paired differences by seed, missing cells, the trade-off figure, and no runs at all."""

from __future__ import annotations

import csv
import io
import warnings

import pytest

from accordion_repro.analysis.build import build_all
from accordion_repro.analysis.collect import collect_runs
from accordion_repro.analysis.comparison import comparison_runs, t_interval, tradeoff_figure
from accordion_repro.analysis.layout import SUCCESSORS, run_command
from accordion_repro.analysis.summarize import summarize_runs
from test_analysis import write_run

FINALS = {  # (table, method): finals of seeds 42, 43, 44 (None: no run of that seed)
    ("table1", "accordion"): (85.0, 85.2, 84.8),
    ("table1", "static_low"): (85.1, 85.0, 85.3),
    ("successors", "lgreco"): (85.3, 85.1, 85.2),
    ("successors", "acp_powersgd"): (84.0, 84.5, None),
}


def successor_runs(root, scale="cpu_long"):
    for (table, method), finals in FINALS.items():
        for seed, final in zip((42, 43, 44), finals):
            if final is None:
                continue
            write_run(root, f"{scale}/{table}/{method}/seed{seed}", table=table, method=method,
                      seed=seed, scale=scale, accs=(40.0, final), floats=100_000 * (seed - 41),
                      compressor="acp_powersgd" if method == "acp_powersgd" else "powersgd",
                      numerics={"precision": "bf16"})


def build(runs, out, figures=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_all(runs, out, figures=figures)


def test_intervals_are_analysis_stats_t_intervals():
    """One t implementation (analysis/stats.py, tests/test_stats.py checks its quantiles)."""
    mean, std, half = t_interval([85.0, 85.2, 84.8])
    assert (mean, std) == (pytest.approx(85.0), pytest.approx(0.2))
    assert half == pytest.approx(4.3027 * 0.2 / 3 ** 0.5, rel=1e-4)
    assert t_interval([1.5]) == (1.5, None, None)
    with pytest.raises(ValueError, match="no differences"):
        t_interval([])


def test_successors_table_states_cis_floats_and_paired_differences_by_seed(tmp_path):
    successor_runs(tmp_path / "runs")
    # Table 1 at another scale, without any successor: that scale gets no block
    write_run(tmp_path / "runs", "cpu/accordion", method="accordion", seed=42, scale="cpu")
    md, csv_path = build(tmp_path / "runs", tmp_path / "out")["successors"]
    text = md.read_text()
    assert "## scale cpu_long (bf16 autocast; CPU not recorded)" in text and "## scale cpu\n" not in text
    # floats: seed s logs 100,000 (s - 41) x (1 + 2) over its two epochs -> mean 0.6M
    assert "| Accordion 2<->1 | 3 | 85.00 ± 0.20 | [84.50, 85.50] | 0.6 | 4 |" in text
    assert "| ACP-SGD rank 2 | 2 | 84.25 ± 0.35 | [81.07, 87.43] | 0.5 | 4 |" in text
    assert "| Phase rule (Accordion's floats) | 0 | – | – | – | – |" in text
    assert "| L-GreCo r0=2 (ranks 1..4, alpha 1) − Accordion 2<->1 | +0.30 | -0.10 | +0.40 " \
           "| +0.20 ± 0.26 | [-0.46, +0.86] |" in text
    assert "| Accordion 2<->1 − Rank 2 | -0.10 | +0.20 | -0.50 |" in text
    assert "| ACP-SGD rank 2 − Rank 2 | -1.10 | -0.50 | – | -0.80 ± 0.42 |" in text
    assert "Rank 2 − Accordion" not in text  # each pair of references once
    assert run_command("successors/resnet18_phase_rule", "cpu_long") in text
    rows = list(csv.DictReader(io.StringIO(csv_path.read_text())))
    assert {(r["name"], r["seed"]) for r in rows if r["kind"] == "run"} >= {
        ("ACP-SGD rank 2", "42"), ("ACP-SGD rank 2", "43")}
    lgreco = [round(float(r["value"]), 2) for r in rows if r["kind"] == "difference"
              and r["name"] == "L-GreCo r0=2 (ranks 1..4, alpha 1) − Accordion 2<->1"]
    assert lgreco == [0.3, -0.1, 0.4]
    first = {p: p.read_bytes() for p in (md, csv_path)}
    build(tmp_path / "runs", tmp_path / "out")
    assert {p: p.read_bytes() for p in (md, csv_path)} == first


def test_without_successor_runs_the_table_says_no_runs_yet_and_no_figure_is_drawn(tmp_path):
    write_run(tmp_path / "runs", "accordion", method="accordion", seed=42, scale="cpu_long")
    written = build(tmp_path / "runs", tmp_path / "out", figures=True)
    text = written["successors"][0].read_text()
    assert "No runs yet" in text and "## scale" not in text
    for preset in SUCCESSORS.own_presets:
        assert run_command(preset, "cpu_long") in text
    assert written["successors"][1].read_text() == "scale,kind,name,seed,value,floats\n"
    assert "successors_tradeoff" not in written
    assert not list((tmp_path / "out" / "figures").glob("successors*"))


def test_tradeoff_figure_puts_one_point_per_run_at_its_floats_and_accuracy(tmp_path):
    successor_runs(tmp_path / "runs")
    written = build(tmp_path / "runs", tmp_path / "out", figures=True)
    assert [p.suffix for p in written["successors_tradeoff"]] == [".png", ".pdf"]
    frame = collect_runs(tmp_path / "runs").frame
    runs = comparison_runs(SUCCESSORS, summarize_runs(frame))
    figure = tradeoff_figure(SUCCESSORS, runs, frame)
    axes = figure.axes[0]
    points = sorted((round(float(x), 6), round(float(y), 6))
                    for c in axes.collections for x, y in c.get_offsets())
    want = sorted((round(100_000 * (s - 41) * 3 / 1e6, 6), final) for finals in FINALS.values()
                  for s, final in zip((42, 43, 44), finals) if final is not None)
    assert points == want
    assert sum(len(c.get_offsets()) for c in axes.collections) == 11  # one per run
    assert "scale cpu_long" in figure._suptitle.get_text()
    assert [t.get_text() for t in axes.get_legend().get_texts()] == [
        "Accordion 2<->1", "Rank 2", "L-GreCo r0=2 (ranks 1..4, alpha 1)", "ACP-SGD rank 2"]
