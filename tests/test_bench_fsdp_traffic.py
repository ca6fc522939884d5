"""benchmarks/fsdp_traffic.py (scripts/bench_fsdp_traffic.py): the veth counter it reads and
the rows it writes (bytes, the step against compute + wire bytes / rate). Nothing here is
timed; the benchmark itself is run by hand (it needs root and minutes; docs/fsdp.md)."""

from __future__ import annotations

import csv
import io

import pytest

from accordion_repro.benchmarks import fsdp_traffic as bench
from accordion_repro.benchmarks.netbench.bench import link_calibration
from accordion_repro.benchmarks.netbench.netns import LinkSpec, ShapingReport
from accordion_repro.benchmarks.netbench.report import csv_text

PROC_NET_DEV = """\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:     120       2    0    0    0     0          0         0      120       2    0    0    0     0       0          0
accbench0: 9000000    7000    0    0    0     0          0         0  8018510    6100    0    0    0     0       0          0
"""


def test_tx_bytes_is_the_transmit_column_of_the_named_device():
    assert bench.tx_bytes_from(PROC_NET_DEV, "accbench0") == 8018510
    assert bench.tx_bytes_from(PROC_NET_DEV, "lo") == 120
    with pytest.raises(ValueError, match="accbench1"):
        bench.tx_bytes_from(PROC_NET_DEV, "accbench1")


def record(fsdp_wire: float, acc_wire: float, fsdp_s: list[float], acc_s: list[float]) -> dict:
    """Both arms all-gather 1 MB in 4 calls, which take half of each step."""
    gathers = {"allgather_bytes": 1_000_000, "allgathers": 4,
               "largest_allgather": [400_000, [0.05, 0.04, 0.08]]}
    return {"world": 2, "widths": {"1": {
        bench.FSDP: {"samples": fsdp_s, "bytes": 4000, "fsdp_bytes": 4000, "uncompressed_layers": 0,
                     "wire_bytes": fsdp_wire, "error_memory_bytes": None, **gathers,
                     "allgather_s": [t / 2 for t in fsdp_s]},
        f"{bench.ACCORDION} r2": {"samples": acc_s, "bytes": 100, "fsdp_bytes": 4000,
                                  "uncompressed_layers": 0, "wire_bytes": acc_wire,
                                  "error_memory_bytes": 3000, **gathers,
                                  "allgather_s": [t / 2 for t in acc_s]}}}}


def probe(nbytes: int, seconds: float) -> dict:
    return {"numel": nbytes // 4, "bytes": nbytes, "times_s": [seconds] * 3}


def calibration():
    """A 100 Mbit/s link whose all-reduce ran at 0.8 of line rate, all-gather at 0.5."""
    return link_calibration(ShapingReport(LinkSpec(1e8), latency_applied=False), {
        "bulk": probe(8_000_000, 0.8), "gather": probe(8_000_000, 1.28),
        "gather_small": probe(500_000, 0.08), "tiny": probe(4, 0.002)})


def test_rows_hold_the_step_against_compute_plus_wire_bytes_over_the_rate():
    shaped = record(2_500_000, 1_250_000, [0.40, 0.30, 0.50], [0.20, 0.25, 0.15])
    unshaped = record(9, 9, [0.10, 0.12, 0.08], [0.05, 0.06, 0.04])
    rows = bench.rows_from(shaped, shaped=shaped, compute=unshaped, link="100 Mbit/s, 0 ms",
                           bandwidth_bps=1e8, calibration=calibration(), load=(1.5, 2.5), cpus=2)
    fsdp, acc = rows
    assert (fsdp["method"], fsdp["powersgd_rank"], fsdp["fewer_bytes_x"]) == (bench.FSDP, None, 1.0)
    assert (acc["method"], acc["powersgd_rank"], acc["fewer_bytes_x"]) == (bench.ACCORDION, 2, 40.0)
    # 2.5 MB at 100 Mbit/s is 200 ms; compute is the unshaped launch's median (100 ms)
    assert (fsdp["compute_ms"], fsdp["link_ms"], fsdp["bound_ms"]) == (100.0, 200.0, 300.0)
    assert fsdp["step_median_ms"] == 400.0 and fsdp["step_over_bound"] == pytest.approx(4 / 3, abs=1e-3)
    assert (acc["compute_ms"], acc["link_ms"], acc["bound_ms"]) == (50.0, 100.0, 150.0)
    assert acc["step_over_bound"] == pytest.approx(200 / 150, abs=1e-3)
    assert acc["fewer_wire_bytes_x"] == 2.0 and acc["steps_timed"] == 3
    assert (acc["load_avg_1m_start"], acc["load_avg_1m_end"], acc["cpus"]) == (1.5, 2.5, 2)
    assert (acc["allgather_bytes_per_rank_step"], acc["allgathers_per_step"]) == (1_000_000, 4)
    # at gloo's rates: 1 MB of all-gathers at 0.5 (160 ms), the other 0.25 MB at 0.8 (25 ms)
    assert (acc["allreduce_rate"], acc["allgather_rate"]) == (0.8, 0.5)
    assert acc["gloo_bound_ms"] == pytest.approx(50 + 160 + 25, abs=0.1)
    assert acc["step_over_gloo_bound"] == pytest.approx(200 / 235, abs=1e-3)
    # half of the median step, 100 ms, for 1 MB: 0.8 of line rate; the other half is left
    assert (acc["allgather_ms"], acc["allgather_rate_in_step"]) == (100.0, 0.8)
    assert (acc["step_less_allgather_ms"], acc["compute_less_allgather_ms"]) == (100.0, 25.0)
    # its largest call, 0.4 MB, in a median 50 ms: 0.64 of line rate
    assert (acc["largest_allgather_bytes"], acc["largest_allgather_rate"]) == (400_000, 0.64)
    written = list(csv.DictReader(io.StringIO(csv_text(rows, bench.COLUMNS))))
    assert list(written[0]) == list(bench.COLUMNS)
    assert written[0]["powersgd_rank"] == "" and written[1]["error_memory_bytes_per_rank"] == "3000"


def test_rows_without_a_link_hold_bytes_only():
    rows = bench.rows_from(record(0, 0, [1.0, 1.0], [1.0, 1.0]))
    assert [r["fewer_bytes_x"] for r in rows] == [1.0, 40.0]
    assert not any(key in row for row in rows for key in ("step_median_ms", "bound_ms"))


def test_steps_below_two_are_refused_before_any_rank_starts():
    with pytest.raises(SystemExit):
        bench.parse_args(["--steps", "1"])
