"""Run training cases across the shaped link and turn their metrics into benchmark rows.

A link is first calibrated with two raw gloo all-reduces (a bulk one for the bandwidth the
link really delivers, a one-float one for its per-collective latency); then each case runs as
rank 0 and rank 1 of the real trainer, one per namespace, and rank 0's metrics.jsonl is read
back. The cost model predicts each epoch from the same run's measured compute time and logged
traffic, so its error isolates the communication part of the model.
"""

from __future__ import annotations

import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from accordion_repro.netbench.allreduce_probe import AllreduceMeasurement, measure_shaped_allreduce
from accordion_repro.netbench.cases import (
    DENSE,
    STATIC_LOW,
    WORKERS,
    BenchCase,
    BenchScale,
    run_overrides,
)
from accordion_repro.netbench.netns import LinkSpec, NamespacePair, ShapingReport
from accordion_repro.netbench.ranks import run_two_ranks

BULK_NUMEL = 2_000_000  # 8 MB: long enough at 1 Gbit/s (64 ms) to swamp per-call overheads

# (epoch record, compressor name, link calibration) -> predicted epoch seconds
EpochPredictor = Callable[[dict, str, "LinkCalibration"], float]


@dataclass(frozen=True)
class LinkCalibration:
    shaping: ShapingReport
    bulk: AllreduceMeasurement
    tiny: AllreduceMeasurement
    gather: AllreduceMeasurement  # the Top-K reducer's collective, same bytes per rank as bulk

    @property
    def link(self) -> LinkSpec:
        return self.shaping.link

    @property
    def measured_bandwidth_bps(self) -> float:
        return self.bulk.effective_bandwidth_bps()

    @property
    def base_latency_s(self) -> float:
        """A two-worker ring all-reduce pays two latencies: half a one-float all-reduce."""
        return self.tiny.median_s / 2

    @property
    def model_latency_s(self) -> float:
        """What the cost model is told: the delay we added plus what the stack costs anyway."""
        return self.shaping.effective_latency_s + self.base_latency_s


def calibrate(pair: NamespacePair, shaping: ShapingReport, work_dir: Path) -> LinkCalibration:
    bulk = measure_shaped_allreduce(pair, numel=BULK_NUMEL, repeats=3, work_dir=work_dir / "bulk")
    tiny = measure_shaped_allreduce(pair, numel=1, repeats=20, work_dir=work_dir / "tiny")
    gather = measure_shaped_allreduce(pair, numel=BULK_NUMEL, repeats=3, op="allgather",
                                      work_dir=work_dir / "gather")
    return LinkCalibration(shaping=shaping, bulk=bulk, tiny=tiny, gather=gather)


def costmodel_predictor() -> EpochPredictor | None:
    """The suite's cost model when it is installed; None keeps the comparison columns empty."""
    try:
        from accordion_repro.analysis import costmodel
    except ImportError:
        return None

    def predict(epoch: dict, compressor: str, calibration: LinkCalibration) -> float:
        steps = max(int(epoch["steps"]), 1)
        network = costmodel.Network(bandwidth_bps=calibration.link.bandwidth_bps,
                                    latency_s=calibration.model_latency_s)
        return costmodel.predict_epoch_time(
            epoch["compute_time_s"] / steps, steps, epoch["bytes_sent"] / steps,
            epoch["collectives"] / steps, costmodel.collective_op(compressor), network, WORKERS)

    return predict


def trainer_argv(overrides: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "accordion_repro.train", *overrides]


def run_case(pair: NamespacePair, case: BenchCase, scale: BenchScale, run_dir: Path, *,
             timeout_s: float) -> list[dict]:
    """Train one case across the link; return rank 0's per-epoch metrics."""
    if run_dir.exists():
        shutil.rmtree(run_dir)  # never resume a previous attempt's checkpoint
    run_dir.mkdir(parents=True)
    argv = trainer_argv(run_overrides(case, scale, str(run_dir)))
    run_two_ranks(pair, argv, log_dir=run_dir / "logs", timeout_s=timeout_s)
    return read_epochs(run_dir / "metrics.jsonl")


def read_epochs(path: Path) -> list[dict]:
    if not path.exists():
        raise FileNotFoundError(f"the trainer wrote no {path}")
    epochs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not epochs:
        raise ValueError(f"{path} holds no epoch")
    return epochs


def case_row(case: BenchCase, epochs: list[dict], calibration: LinkCalibration,
             predictor: EpochPredictor | None) -> dict:
    """One table row: per-epoch means of what rank 0 measured, and the model's prediction."""
    n = len(epochs)

    def mean(key: str) -> float:
        return sum(float(e[key]) for e in epochs) / n

    row = {
        "link": calibration.shaping.label,
        "bandwidth_bps": calibration.link.bandwidth_bps,
        "latency_s": calibration.link.latency_s,
        "latency_applied": calibration.shaping.latency_applied,
        "measured_link_bps": round(calibration.measured_bandwidth_bps),
        "model_latency_s": calibration.model_latency_s,
        "case": case.name, "family": case.family, "method": case.method, "label": case.label,
        "epochs": n,
        "steps_per_epoch": mean("steps"),
        "epoch_time_s": mean("epoch_time_s"),
        "compute_time_s": mean("compute_time_s"),
        "comm_time_s": mean("comm_time_s"),
        "floats_sent_per_epoch": mean("floats_sent"),
        "bytes_sent_per_epoch": mean("bytes_sent"),
        "floats_sent_total": sum(int(e["floats_sent"]) for e in epochs),
        "bytes_sent_total": sum(int(e["bytes_sent"]) for e in epochs),
        "schedule_trace": schedule_trace(epochs),
        "predicted_epoch_time_s": None,
        "prediction_error": None,
    }
    if predictor is not None:
        predicted = sum(predictor(e, case.compressor, calibration) for e in epochs) / n
        row["predicted_epoch_time_s"] = predicted
        row["prediction_error"] = predicted / row["epoch_time_s"] - 1.0
    return row


def schedule_trace(epochs: list[dict]) -> str:
    """What each epoch ran at, e.g. '2 2 1' (levels) or '16 16 128' (global batch)."""
    def one(epoch: dict) -> str:
        levels = epoch.get("levels")
        if levels and set(levels) != {"none"}:
            return "+".join(k if len(levels) == 1 else f"{k}x{v}" for k, v in levels.items())
        return str(epoch.get("global_batch", "-"))

    return " ".join(one(e) for e in epochs)


def add_speedups(rows: list[dict]) -> None:
    """Speedup over the family's static-low run and over dense, on the same link.

    The batch-size family's small-batch run is uncompressed, so it is that family's dense
    baseline too (the dense row of the compressor families uses a different batch per step).
    """
    def epoch_time(link: str, family: str, method: str) -> float | None:
        return next((r["epoch_time_s"] for r in rows if r["link"] == link
                     and r["family"] == family and r["method"] == method), None)

    for row in rows:
        low = epoch_time(row["link"], row["family"], STATIC_LOW)
        if row["family"] == "batch":
            dense = low
        else:
            dense = epoch_time(row["link"], "dense", DENSE)
        row["speedup_vs_static_low"] = low / row["epoch_time_s"] if low else None
        row["speedup_vs_dense"] = dense / row["epoch_time_s"] if dense else None
