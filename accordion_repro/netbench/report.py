"""results/bench/network.csv (every number) and network.md (the table a reader looks at)."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from accordion_repro.netbench.bench import LinkCalibration
from accordion_repro.utils import atomic_write_text

CSV_COLUMNS = (
    "link", "bandwidth_bps", "latency_s", "latency_applied", "measured_link_bps",
    "model_latency_s", "case", "family", "method", "label", "schedule_trace", "epochs", "steps_per_epoch",
    "epoch_time_s", "compute_time_s", "comm_time_s", "floats_sent_per_epoch",
    "bytes_sent_per_epoch", "floats_sent_total", "bytes_sent_total", "speedup_vs_static_low",
    "speedup_vs_dense", "predicted_epoch_time_s", "prediction_error",
)


def write_csv(rows: Sequence[dict], path: Path) -> None:
    import io

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows({k: ("" if row.get(k) is None else row.get(k)) for k in CSV_COLUMNS}
                     for row in rows)
    atomic_write_text(path, buffer.getvalue())


def _fmt(value, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def markdown_table(rows: Sequence[dict], calibrations: Sequence[LinkCalibration], *,
                   notes: Sequence[str] = ()) -> str:
    lines = ["# Network benchmark: two ranks across a shaped veth link", ""]
    for cal in calibrations:
        applied = (f"{cal.link.latency_s * 1e3:g} ms added" if cal.shaping.latency_applied
                   else f"{cal.link.latency_s * 1e3:g} ms requested, NOT added (no netem)")
        lines.append(
            f"- {cal.shaping.label}: bulk all-reduce {cal.bulk.bytes / 1e6:.0f} MB in "
            f"{cal.bulk.median_s * 1e3:.1f} ms = {cal.measured_bandwidth_bps / 1e6:.1f} Mbit/s "
            f"effective; all-gather of the same size {cal.gather.median_s * 1e3:.1f} ms; "
            f"one-float all-reduce {cal.tiny.median_s * 1e3:.2f} ms; latency "
            f"{applied}; cost model told {cal.model_latency_s * 1e3:.3f} ms per message.")
    lines += [f"- {note}" for note in notes]
    lines += [
        "",
        "| Link | Run | per epoch | s/epoch | compute s | comm s | MB sent | Mfloats sent | vs static low "
        "| vs dense | model s/epoch | model error |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['link']} | {r['label']} | {r['schedule_trace']} | {r['epoch_time_s']:.2f} | {r['compute_time_s']:.2f} "
            f"| {r['comm_time_s']:.2f} | {r['bytes_sent_per_epoch'] / 1e6:.1f} "
            f"| {r['floats_sent_per_epoch'] / 1e6:.2f} "
            f"| {_fmt(r.get('speedup_vs_static_low'), '.2f', 'x')} "
            f"| {_fmt(r.get('speedup_vs_dense'), '.2f', 'x')} "
            f"| {_fmt(r.get('predicted_epoch_time_s'), '.2f')} "
            f"| {_fmt(r.get('prediction_error'), '+.0%')} |")
    lines += ["", "'per epoch': the level (PowerSGD rank / Top-K ratio) or global batch each "
              "epoch ran at. Times, bytes and floats per epoch, means over the run's epochs, rank 0 (sent = this worker's "
              "collectives). Model: accordion_repro.analysis.costmodel.predict_epoch_time with the "
              "run's own compute time per step and logged traffic, nominal bandwidth.", ""]
    return "\n".join(lines)


def write_markdown(text: str, path: Path) -> None:
    atomic_write_text(path, text)
