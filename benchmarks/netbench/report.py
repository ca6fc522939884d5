"""results/bench/network.csv (whole runs), network_steps.csv (step times), network.md (what a
reader looks at, rebuilt from the same rows) and network_speedup.png (speedup over static low
against link bandwidth, measured points and the cost model's curve)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Sequence

from accordion_repro.costmodel import Network
from .bench import predicted_step
from .driver import BenchmarkResult, step_why
from .study import STATIC_LOW, Family, signature
from .wholerun import whole_runs
from accordion_repro.utils import atomic_write_text

TOLERANCE = 0.15  # the cost model's target on every row

RUN_COLUMNS = ("link", "family", "method", "label", "schedule", "epochs", "steps", "time_s", "model_s",
               "model_error", "floats", "bytes", "speedup_vs_static_low", "speedup_vs_dense", "run_dir",
               "why")
STEP_COLUMNS = ("link", "preset", "level", "step_s", "compute_s", "comm_s", "bytes_per_step",
                "study_bytes_per_step", "collectives", "allgather_bytes", "allgathers", "steps",
                "model_s", "model_error")


def csv_text(rows: Sequence[dict], columns: Sequence[str]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: ("" if row.get(k) is None else row.get(k)) for k in columns} for row in rows)
    return buffer.getvalue()


def run_records(result: BenchmarkResult) -> list[dict]:
    return [{**r.__dict__, "model_error": r.model_error} for r in result.rows]


def step_records(result: BenchmarkResult) -> list[dict]:
    return [{"link": s.link, "preset": s.preset, "level": s.level, **s.step.__dict__,
             "bytes_per_step": s.step.bytes_sent, "study_bytes_per_step": s.study_bytes_per_step,
             "model_s": s.model_s, "model_error": s.model_error} for s in result.steps]


def _x(value) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _flag(error: float) -> str:
    return f"{error:+.0%}" + (" **>15%**" if abs(error) > TOLERANCE else "")


def off_rows(result: BenchmarkResult) -> list[str]:
    """One line per row beyond the tolerance, with the term it comes from."""
    lines = [f"{s.link} step of {s.preset}: model {s.model_error:+.0%}; {step_why(s)}."
             for s in result.steps if abs(s.model_error) > TOLERANCE]
    for r in result.rows:
        if abs(r.model_error) > TOLERANCE:
            lines.append(f"{r.link} {r.label} (whole run): {r.why}.")
    return lines


def markdown(result: BenchmarkResult) -> str:
    lines = ["# Network benchmark: whole runs of the CPU study across a shaped link", "",
             f"Command: `{result.command}` (this file is rebuilt from results/bench/network_raw.json by "
             "`python scripts/bench_network.py --rebuild`)", ""]
    if result.fast:
        lines.append(f"- unshaped veth (the cost model's compute-only reference): all-reduce "
                     f"{result.fast.bandwidth_bps / 1e9:.1f} Gbit/s, one-float all-reduce "
                     f"{result.fast.tiny.median_s * 1e3:.2f} ms.")
    for cal in result.calibrations:
        lines.append(
            f"- {cal.label}: mean of 12 calls: 8 MB all-reduce {cal.bulk.mean_s * 1e3:.1f} ms "
            f"({cal.rate(cal.bulk):.2f} of line rate); all-gather of 8 MB per rank "
            f"{cal.gather.mean_s * 1e3:.1f} ms ({cal.rate(cal.gather):.2f}), of 0.5 MB "
            f"{cal.gather_small.mean_s * 1e3:.1f} ms ({cal.rate(cal.gather_small):.2f}); one-float "
            f"all-reduce {cal.tiny.median_s * 1e3:.2f} ms (median), so a latency of "
            f"{cal.latency_s * 1e3:.3f} ms per ring step.")
    lines += [f"- {note}" for note in result.notes]
    lines += ["", "## Whole runs", "",
              "Training time of each committed run (evaluation excluded) = its logged schedule x "
              "the step time of each configuration on the link. Floats and bytes: per worker, "
              "as the run logged them.", "",
              "| Link | Run | per epoch | time (min) | model (min) | model error | Mfloats | MB "
              "| vs static low | vs dense |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in result.rows:
        lines.append(f"| {r.link} | {r.label} | {r.schedule} | {r.time_s / 60:.1f} | {r.model_s / 60:.1f} "
                     f"| {_flag(r.model_error)} | {r.floats / 1e6:,.0f} | {r.bytes / 1e6:,.0f} "
                     f"| {_x(r.speedup_vs_static_low)} | {_x(r.speedup_vs_dense)} |")
    lines += ["", "## Step times", "",
              "The static run's preset and scale on synthetic images, rank 0: median over 3 "
              "short epochs (after a warm-up epoch) of the mean step. 'model': the same step on the unshaped pair, less the unshaped "
              "link's share, plus this link's all-reduce and all-gather time for the step's "
              "collectives (accordion_repro/costmodel.py step_comm_time). 'study B/step': what the "
              "study's run logged per step; it must equal the benchmark's.", "",
              "| Link | Config | level | step ms | compute ms | comm ms | B/step | study B/step "
              "| model ms | model error |",
              "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for s in step_records(result):
        lines.append(f"| {s['link']} | {s['preset']} | {s['level']} | {s['step_s'] * 1e3:.0f} "
                     f"| {s['compute_s'] * 1e3:.0f} | {s['comm_s'] * 1e3:.0f} | {s['bytes_per_step']:,.0f} "
                     f"| {s['study_bytes_per_step']:,.0f} | {s['model_s'] * 1e3:.0f} | {_flag(s['model_error'])} |")
    if result.checks:
        lines += ["", "## End to end: the combination against a measured run", "",
                  "Each family's Accordion preset run whole through the link (synthetic images, "
                  "5 short epochs, a decision every epoch); epochs 1-4 timed as the trainer "
                  "logged them against the same epochs' schedule x the step times above.", "",
                  "| Link | Run | per epoch | measured s | combined s | error |",
                  "|---|---|---|---:|---:|---:|"]
        for c in result.checks:
            lines.append(f"| {c.link} | {c.preset} | {c.schedule} | {c.measured_s:.1f} "
                         f"| {c.combined_s:.1f} | {c.error:+.1%} |")
    off = off_rows(result)
    lines += ["", "## Rows where the model is off by more than 15%", ""]
    lines += [f"- {line}" for line in off] or ["- none"]
    return "\n".join(lines) + "\n"


def _interpolated(networks: Sequence[Network], bandwidth: float) -> Network:
    """A link between the measured ones: rates and latency interpolated in log bandwidth."""
    ordered = sorted(networks, key=lambda n: n.bandwidth_bps)
    logs = [math.log(n.bandwidth_bps) for n in ordered]
    x = min(max(math.log(bandwidth), logs[0]), logs[-1])
    i = max(0, min(len(ordered) - 2, sum(1 for v in logs if v <= x) - 1))
    lo, hi = ordered[i], ordered[min(i + 1, len(ordered) - 1)]
    w = 0.0 if logs[min(i + 1, len(logs) - 1)] == logs[i] else (x - logs[i]) / (logs[i + 1] - logs[i])
    mix = lambda a, b: a + w * (b - a)  # noqa: E731
    return Network(bandwidth, mix(lo.latency_s, hi.latency_s), mix(lo.allreduce_rate, hi.allreduce_rate),
                   mix(lo.allgather_rate, hi.allgather_rate))


def model_curve(result: BenchmarkResult, families: Sequence[Family], bandwidths: Sequence[float]) -> dict:
    """(family, method) -> speedup over static low predicted at each bandwidth."""
    curves: dict = {}
    for bandwidth in bandwidths:
        for family in families:
            modelled = {}
            for run in family.static_runs:
                fast = result.fast_steps[run.preset]
                net = _interpolated([c.network(fast.gathered_per_call()) for c in result.calibrations],
                                    bandwidth)
                modelled[signature(run.epochs[0])] = predicted_step(fast, result.fast, net)
            for row in whole_runs("", family, modelled, modelled):
                curves.setdefault((family.name, row.method, row.label), []).append(row.speedup_vs_static_low)
    return curves


def plot(result: BenchmarkResult, families: Sequence[Family], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    measured_bw = sorted({c.bandwidth_bps for c in result.calibrations})
    bandwidths = list(np.geomspace(measured_bw[0] / 2, measured_bw[-1] * 2, 48))
    curves = model_curve(result, families, bandwidths)
    link_bandwidth = {c.label: c.bandwidth_bps for c in reversed(result.calibrations)}
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    drawn = 0
    styles = {"powersgd": "-", "topk": "--", "batch": ":"}
    for (family, method, label), values in curves.items():
        if method in (STATIC_LOW, "dense"):
            continue
        color = f"C{drawn % 10}"
        drawn += 1
        ax.plot(np.array(bandwidths) / 1e9, values, color=color, lw=1.4, ls=styles[family],
                label=f"{label} ({family})")
        points = [(link_bandwidth[r.link] / 1e9, r.speedup_vs_static_low) for r in result.rows
                  if r.family == family and r.method == method]
        if points:
            ax.plot(*zip(*points), "o", color=color)
    ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xlabel("link bandwidth (Gbit/s), 2 workers")
    ax.set_ylabel("whole-run speedup over static low compression")
    ax.set_title("CPU study runs (ResNet-18 w0.25, whole CIFAR-10, 12 epochs) on a shaped link\n"
                 "dots: measured step times x logged schedule; lines: cost model", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


def write(result: BenchmarkResult, families: Sequence[Family], out_dir: Path) -> str:
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "network.csv", csv_text(run_records(result), RUN_COLUMNS))
    atomic_write_text(out_dir / "network_steps.csv", csv_text(step_records(result), STEP_COLUMNS))
    text = markdown(result)
    atomic_write_text(out_dir / "network.md", text)
    if result.fast and result.calibrations:
        plot(result, families, out_dir / "network_speedup.png")
    return text


