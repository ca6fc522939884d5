"""The benchmark loop: per link a fresh shaped namespace pair, a calibration, then every case.

Results are rewritten after every case, so an interrupted benchmark keeps what it measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from accordion_repro.netbench.bench import add_speedups, calibrate, case_row, costmodel_predictor, run_case
from accordion_repro.netbench.cases import BenchCase, BenchScale
from accordion_repro.netbench.netns import LinkSpec, NamespacePair, cleanup_leftovers, teardown_on_signals
from accordion_repro.netbench.ranks import RanksFailed
from accordion_repro.netbench.report import markdown_table, write_csv, write_markdown


@dataclass
class BenchmarkResult:
    rows: list[dict] = field(default_factory=list)
    calibrations: list = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def write(self, out_dir: Path) -> str:
        add_speedups(self.rows)
        text = markdown_table(self.rows, self.calibrations, notes=[*self.notes, *self.failed])
        write_csv(self.rows, out_dir / "network.csv")
        write_markdown(text, out_dir / "network.md")
        return text


def run_benchmark(links: Sequence[LinkSpec], cases: Sequence[BenchCase], scale: BenchScale, *,
                  out_dir: Path, timeout_s: float, notes: Sequence[str] = (),
                  log: Callable[[str], None] = print) -> BenchmarkResult:
    """Raises KeyboardInterrupt on SIGINT/SIGTERM/SIGHUP after everything is torn down."""
    result = BenchmarkResult(notes=list(notes))
    predictor = costmodel_predictor()
    if predictor is None:
        result.notes.append("accordion_repro.analysis.costmodel not importable: no predictions")
    removed = cleanup_leftovers()
    if removed:
        log(f"removed leftovers of an earlier run: {' '.join(removed)}")
    work = out_dir / "tmp" / "network"
    with teardown_on_signals():
        for link in links:
            with NamespacePair("bench") as pair:
                shaping = pair.shape(link)
                if shaping.note:
                    log(shaping.note)
                    result.notes.append(f"{link.label}: {shaping.note}")
                link_dir = work / f"{int(link.bandwidth_bps)}bps"
                cal = calibrate(pair, shaping, link_dir / "calibration")
                result.calibrations.append(cal)
                log(f"[{shaping.label}] link delivers {cal.measured_bandwidth_bps / 1e6:.1f} Mbit/s, "
                    f"one-float all-reduce {cal.tiny.median_s * 1e3:.2f} ms")
                for case in cases:
                    start = time.monotonic()
                    try:
                        epochs = run_case(pair, case, scale, link_dir / case.name,
                                          timeout_s=timeout_s)
                    except (RanksFailed, FileNotFoundError, ValueError) as err:
                        # one broken case must not cost the rest of the table
                        reason = _last_error_line(str(err))
                        log(f"[{shaping.label}] {case.label}: FAILED: {reason}")
                        result.failed.append(f"{shaping.label}: {case.name} failed: {reason}")
                        result.write(out_dir)
                        continue
                    result.rows.append(case_row(case, epochs, cal, predictor))
                    log(f"[{shaping.label}] {case.label}: {result.rows[-1]['epoch_time_s']:.2f} "
                        f"s/epoch (run {time.monotonic() - start:.0f} s)")
                    result.write(out_dir)
    return result


def _last_error_line(message: str) -> str:
    """The rank log's exception line says more than the traceback around it."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln.split(":")[0]]
    return (errors or lines or ["unknown error"])[-1]
