"""make bench-ddp-network: a DDP step per arm across a shaped link against the link's bound.

The rows' arithmetic and the tables are checked anywhere; the benchmark itself runs tiny (one
1 Gbit/s link, ResNet-18 at width 0.125, two timed steps of torch's powerSGD_hook and our hook
at rank 1) where root, iproute2 and tc are available, and is skipped with the reason elsewhere.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from accordion_repro.benchmarks import ddp_network
from accordion_repro.benchmarks.netbench.bench import link_calibration
from accordion_repro.benchmarks.netbench.ddp_report import (COLUMNS, comm_seconds, read_csv, readme_table,
                                            rows_for, write_csv)
from accordion_repro.benchmarks.netbench.netns import LinkSpec, ShapingReport, missing_requirement
from accordion_repro.benchmarks.netbench.report import csv_text
from conftest import REPO

MISSING = missing_requirement()
SCRIPT = REPO / "scripts" / "bench_ddp_network.py"


def probe(nbytes: int, seconds: float) -> dict:
    return {"numel": nbytes // 4, "bytes": nbytes, "times_s": [seconds] * 3}


def calibration():
    """A 1 Gbit/s link whose all-reduce runs at 0.8 of line rate, all-gather at 0.5."""
    return link_calibration(ShapingReport(LinkSpec(1e9), latency_applied=False), {
        "bulk": probe(8_000_000, 0.080), "gather": probe(8_000_000, 0.128),
        "gather_small": probe(500_000, 0.008), "tiny": probe(4, 0.0002)})


def quantiles(name: str, median_ms: float) -> dict:
    return {"config": name, "median_ms": median_ms, "p25_ms": median_ms - 1,
            "p75_ms": median_ms + 1, "iqr_ms": 2.0, "n": 2}


def traffic(nbytes: float, collectives: float, gathered: float = 0.0) -> dict:
    return {"bytes": nbytes, "collectives": collectives, "allgather_bytes": gathered,
            "allgathers": 1.0 if gathered else 0.0}


def test_rows_hold_each_arm_against_compute_plus_the_links_time_for_its_bytes(tmp_path):
    cal = calibration()
    measured = [quantiles("torch DDP dense", 500.0), quantiles("torch powerSGD_hook r2", 300.0),
                quantiles("ours async r2", 150.0), quantiles("ours sync r2", 200.0),
                quantiles("ours async topk 0.1", 250.0)]
    compute = {"torch DDP dense": 100.0, "torch powerSGD_hook r2": 250.0, "ours async r2": 120.0,
               "ours sync r2": 120.0, "ours async topk 0.1": 130.0}
    sent = {"torch DDP dense": traffic(40e6, 3), "torch powerSGD_hook r2": traffic(3e5, 3),
            "ours async r2": traffic(3e5, 10), "ours sync r2": traffic(3e5, 10),
            "ours async topk 0.1": traffic(8e6, 4, gathered=7.9e6)}
    rows = {r["arm"]: r for r in rows_for(cal, 0.25, measured, compute, sent)}
    dense = rows["torch DDP dense"]
    # 40 MB at 0.8 of 1 Gbit/s is 400 ms, plus a latency of 0.1 ms per ring step
    assert dense["comm_ms"] == pytest.approx(400.0 + 3 * 2 * 0.1)
    assert dense["bound_ms"] == dense["comm_ms"] and dense["bound_serial_ms"] == 100 + dense["comm_ms"]
    assert dense["measured_over_bound"] == pytest.approx(500 / dense["comm_ms"])
    ours = rows["ours async r2"]
    assert ours["bound_ms"] == 120.0 == ours["compute_ms"] > ours["comm_ms"] > 0
    assert ours["ours_over_torch"] == pytest.approx(0.5)
    assert ours["async_over_sync"] == pytest.approx(0.75)
    assert rows["ours sync r2"]["ours_over_torch"] == pytest.approx(200 / 300)
    assert rows["ours sync r2"]["async_over_sync"] is None
    topk = rows["ours async topk 0.1"]
    assert topk["ours_over_torch"] is None and topk["over_dense"] == pytest.approx(0.5)
    assert topk["comm_ms"] > 1e3 * comm_seconds(traffic(8e6, 4), cal)  # all-gathers are slower
    assert dense["over_dense"] is None and dense["ours_over_torch"] is None

    path = tmp_path / "ddp_network.csv"
    write_csv(list(rows.values()), path)
    back = read_csv(path)
    assert [r["arm"] for r in back] == list(rows) and list(back[0]) == list(COLUMNS)
    assert back[2]["ours_over_torch"] == pytest.approx(0.5) and back[0]["ours_over_torch"] is None
    table = readme_table(back)
    assert "| ours async r2 | 150 | 1.25 | 0.50 |" in table
    assert "| torch DDP dense | 500 |" in table


def test_acp_rows_are_held_against_torchs_hook_at_their_rank_and_carry_the_load():
    measured = [quantiles("torch powerSGD_hook r2", 300.0), quantiles("ours async acp r2", 120.0),
                quantiles("ours sync acp r2", 160.0), quantiles("ours async r2", 150.0)]
    compute = {q["config"]: 100.0 for q in measured}
    sent = {q["config"]: traffic(2e5, 3) for q in measured}
    rows = {r["arm"]: r for r in rows_for(calibration(), 1.0, measured, compute, sent, 3.5)}
    acp = rows["ours async acp r2"]
    assert acp["ours_over_torch"] == pytest.approx(120 / 300)
    assert acp["async_over_sync"] == pytest.approx(120 / 160)  # its own sync arm, not PowerSGD's
    assert rows["ours async r2"]["async_over_sync"] is None  # no "ours sync r2" measured
    assert {r["load_1min"] for r in rows.values()} == {3.5}


@pytest.mark.parametrize("csv_name", ["ddp_network.csv", "ddp_network_topk.csv"])
def test_readme_tables_are_built_from_the_committed_csv(csv_name):
    """docs/performance.md's tables are what `--table` prints from the committed measurements."""
    table = readme_table(read_csv(REPO / "results" / "bench" / csv_name)).strip()
    assert table in (REPO / "docs" / "performance.md").read_text()


def _clocked_gather_worker(rank):
    import torch

    from accordion_repro.comm.collectives import Communicator
    from accordion_repro.comm.stats import CommStats
    from accordion_repro.benchmarks.ddp_phases import _Clock, _clocked_collectives

    clock, comm = _Clock(), Communicator()
    comm.gloo_segment = 7
    with _clocked_collectives(clock):
        gathered = comm.all_gather(torch.arange(20.0) + 100 * rank, CommStats())
    return gathered, [record[2] for record in clock.collectives]


@pytest.mark.slow
@pytest.mark.distributed
def test_the_breakdown_clocks_every_segment_of_an_all_gather(tmp_path):
    from test_comm_distributed import run_workers

    (gathered, sent), _ = run_workers(_clocked_gather_worker, tmp_path)
    assert gathered.tolist() == [[float(i) for i in range(20)], [100.0 + i for i in range(20)]]
    assert sent == [28.0, 28.0, 24.0]  # 7, 7 and 6 float32 entries


def test_script_stops_at_once_with_one_line_when_requirements_are_missing(monkeypatch, capsys):
    monkeypatch.setattr(ddp_network, "missing_requirement", lambda: "needs `tc` on PATH")
    assert ddp_network.main([]) == 2
    assert capsys.readouterr().err.strip() == "bench-ddp-network: needs `tc` on PATH"


def test_a_breakdown_keeps_the_other_arms_and_replaces_its_own(tmp_path):
    path = tmp_path / "ddp_network_breakdown.csv"
    row = lambda arm, width, step: {"link": "100 Mbit/s, 0 ms", "width": width, "arm": arm,  # noqa: E731
                                    "step": step}
    assert ddp_network._kept_breakdowns(path, [row("ours async r2", 1.0, 5)]) == []
    path.write_text(csv_text([row("ours async r2", 1, 9), row("ours async r2", 0.25, 3),
                              row("ours sync r2", 1, 7)], ["link", "width", "arm", "step"]))
    kept = ddp_network._kept_breakdowns(path, [row("ours async r2", 1.0, 5)])
    assert [(r["width"], r["arm"]) for r in kept] == [("0.25", "ours async r2"),
                                                     ("1", "ours sync r2")]


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=f"bench-ddp-network: {MISSING}")
def test_tiny_benchmark_across_a_shaped_link_writes_one_row_per_arm(tmp_path):
    out = tmp_path / "ddp_network.csv"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--bandwidth", "1gbit", "--width", "0.125",
                           "--steps", "2", "--warmup", "2", "--only", "r1", "--out", str(out)],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = read_csv(out)
    assert list(rows[0]) == list(COLUMNS)
    assert [r["arm"] for r in rows] == ["torch powerSGD_hook r1", "ours async r1", "ours sync r1",
                                        "ours async acp r1", "ours sync acp r1"]
    for r in rows:
        assert r["link"] == "1 Gbit/s, 0 ms" and r["width"] == 0.125 and r["n"] == 2
        for key in ("median_ms", "compute_ms", "comm_bytes_per_rank", "collectives", "comm_ms"):
            assert r[key] > 0, (r["arm"], key)
        assert r["p25_ms"] <= r["median_ms"] <= r["p75_ms"]
        assert r["bound_ms"] == pytest.approx(max(r["compute_ms"], r["comm_ms"]))
        assert r["bound_serial_ms"] == pytest.approx(r["compute_ms"] + r["comm_ms"])
        assert r["measured_over_bound"] == pytest.approx(r["median_ms"] / r["bound_ms"])
        assert r["load_1min"] > 0
    torch_row, ours_async, ours_sync, acp_async, acp_sync = rows
    assert torch_row["ours_over_torch"] is None
    for ours in (ours_async, ours_sync, acp_async, acp_sync):
        assert ours["ours_over_torch"] == pytest.approx(ours["median_ms"] / torch_row["median_ms"])
    assert ours_async["async_over_sync"] == pytest.approx(
        ours_async["median_ms"] / ours_sync["median_ms"])
    # ACP-SGD: one factor per bucket (P's or Q's, half of PowerSGD's bytes over two steps), so
    # one collective fewer per bucket than our PowerSGD (P with the dense tensors, then Q).
    assert acp_async["collectives"] < ours_async["collectives"]
    assert acp_async["comm_bytes_per_rank"] < ours_async["comm_bytes_per_rank"]
    # At rank 1 both hooks compress the same layers: what they count, each its own way, agrees
    # but for our 16-byte level check and the padding that starts each of our P and Q blocks on
    # 64 bytes (comm/powersgd.py PACKING: exact resume across DDP's bucket regrouping),
    # under 64 bytes per block of ResNet-18's 21 compressed layers.
    padding = ours_async["comm_bytes_per_rank"] - torch_row["comm_bytes_per_rank"] - 16
    assert 0 <= padding < 64 * 2 * 21
    assert (tmp_path / "ddp_network.md").exists() and (tmp_path / "ddp_network_raw.json").exists()
    table = subprocess.run([sys.executable, str(SCRIPT), "--table", "--out", str(out)],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert "| ours async r1 |" in table
