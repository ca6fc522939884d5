"""results/bench/ddp_network.csv: a whole DDP step per link, model width and arm, held against
the bound the link sets; and the tables built from that file alone (no root needed).

The bound of a row: the same arm's step on a process group of one (its compute: forward,
backward, compression, optimizer, measured in the same interleaved rounds) and the time the
link takes for what one rank hands to the network per step (bytes and collectives, all-gathers
apart) at the rates gloo's collectives reached on that link (bench.py's calibration, through
the cost model's step_comm_time). Overlapped: max(compute, communication); serial: their sum.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Sequence

from accordion_repro.costmodel import step_comm_time
from accordion_repro.utils import atomic_write_text
from .bench import WORKERS, LinkCalibration
from .report import csv_text

TORCH_HOOK, DENSE = "torch powerSGD_hook", "torch DDP dense"
COLUMNS = ("link", "bandwidth_bps", "width", "arm", "median_ms", "p25_ms", "p75_ms", "iqr_ms",
           "n", "compute_ms", "comm_bytes_per_rank", "collectives", "allgather_bytes",
           "allgathers", "comm_ms", "bound_ms", "bound_serial_ms", "measured_over_bound",
           "ours_over_torch", "async_over_sync", "over_dense", "load_1min")
TEXT = ("link", "arm")


def comm_seconds(traffic: dict, calibration: LinkCalibration) -> float:
    """The link's time for one step's collectives (one rank's bytes, all-gathers apart)."""
    gathers = traffic["allgathers"]
    per_gather = traffic["allgather_bytes"] / gathers if gathers else 0.0
    return step_comm_time(traffic["bytes"], traffic["collectives"], traffic["allgather_bytes"],
                          gathers, calibration.network(per_gather), WORKERS)


def _ratio(num: dict | None, den: dict | None) -> float | None:
    return num["median_ms"] / den["median_ms"] if num and den else None


def rows_for(calibration: LinkCalibration, width: float, measured: Sequence[dict],
             compute_ms: dict[str, float], traffic: dict[str, dict],
             load_1min: float | None = None) -> list[dict]:
    """One row per arm on one link at one width. `measured`: quantile rows of the arms' steps
    (config, median_ms, p25_ms, p75_ms, iqr_ms, n); `compute_ms`: each arm's median on a group
    of one; `traffic`: what one rank handed to the network per step (ddp_step.DdpArm.traffic);
    `load_1min`: the machine's load while they ran (every row of the link and width).

    ours_over_torch holds each of our arms, ACP-SGD's included, against torch's powerSGD_hook
    at the same rank; async_over_sync against our synchronous arm of the same setting."""
    by_arm = {row["config"]: row for row in measured}
    rows = []
    for arm, row in by_arm.items():
        sent = traffic[arm]
        comm_ms = 1e3 * comm_seconds(sent, calibration)
        compute = compute_ms[arm]
        bound = max(compute, comm_ms)
        out = {"link": calibration.label, "bandwidth_bps": calibration.bandwidth_bps,
               "width": width, "arm": arm,
               **{k: row[k] for k in ("median_ms", "p25_ms", "p75_ms", "iqr_ms", "n")},
               "compute_ms": compute, "comm_bytes_per_rank": sent["bytes"],
               "collectives": sent["collectives"], "allgather_bytes": sent["allgather_bytes"],
               "allgathers": sent["allgathers"], "comm_ms": comm_ms, "bound_ms": bound,
               "bound_serial_ms": compute + comm_ms,
               "measured_over_bound": row["median_ms"] / bound, "ours_over_torch": None,
               "async_over_sync": None, "over_dense": None, "load_1min": load_1min}
        if arm.startswith("ours "):
            setting = arm.split(" ", 2)[2]  # "r2", "acp r2" or "topk 0.1"
            rank = setting.removeprefix("acp ")
            out["ours_over_torch"] = _ratio(row, by_arm.get(f"{TORCH_HOOK} {rank}"))
            if arm.startswith("ours async "):
                out["async_over_sync"] = _ratio(row, by_arm.get(f"ours sync {setting}"))
        if arm != DENSE:
            out["over_dense"] = _ratio(row, by_arm.get(DENSE))
        rows.append(out)
    return rows


def write_csv(rows: Sequence[dict], path: Path) -> None:
    atomic_write_text(path, csv_text(rows, COLUMNS))


def read_csv(path: Path) -> list[dict]:
    """The rows as written: numbers as floats, empty cells as None."""
    with open(path, newline="") as f:
        return [{k: (v if k in TEXT else float(v) if v != "" else None) for k, v in row.items()}
                for row in csv.DictReader(f)]


def _num(value, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def readme_table(rows: Sequence[dict]) -> str:
    """Per model width, one line per arm and per link its median step (ms), the step over its
    overlapped bound ("x bound"), and for ours the step over torch's powerSGD_hook at the same
    rank ("/ torch"; the column is left out of a table that has no torch arm)."""
    links = sorted({(r["bandwidth_bps"], r["link"]) for r in rows})
    out = []
    for width in sorted({r["width"] for r in rows}, reverse=True):
        cell = {(r["arm"], r["link"]): r for r in rows if r["width"] == width}
        arms = list(dict.fromkeys(r["arm"] for r in rows if r["width"] == width))
        columns = [("median_ms", ".0f"), ("measured_over_bound", ".2f")]
        headers = ["x bound"]
        if any(r["ours_over_torch"] is not None for r in cell.values()):
            columns.append(("ours_over_torch", ".2f"))
            headers.append("/ torch")
        out += [f"ResNet-18 at width {width:g}, batch 32 per rank, 2 ranks:", "",
                "| arm | " + " | ".join(" | ".join([label, *headers]) for _, label in links)
                + " |",
                "| --- |" + " ---: |" * (len(columns) * len(links))]
        for arm in arms:
            cells = []
            for _, label in links:
                r = cell.get((arm, label))
                cells += [""] * len(columns) if r is None else [
                    _num(r[key], fmt) for key, fmt in columns]
            out.append(f"| {arm} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


def markdown(rows: Sequence[dict], command: str = "") -> str:
    """results/bench/ddp_network.md: the README's table, then every column of every row."""
    lines = ["# A whole DDP step across a shaped link, against the link's bound", ""]
    if command:
        lines += [f"Command: `{command}`; rebuilt from the CSV by "
                  "`python scripts/bench_ddp_network.py --table`.", ""]
    lines += [readme_table(rows), "## Every row", "",
              "| link | width | arm | median ms | p25 | p75 | compute ms | B/rank/step "
              "| collectives | comm ms | bound ms | serial bound ms | x bound | / torch "
              "| async / sync | / dense | load (blank: not recorded) |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['link']} | {r['width']:g} | {r['arm']} | {r['median_ms']:.1f} "
            f"| {r['p25_ms']:.1f} | {r['p75_ms']:.1f} | {r['compute_ms']:.1f} "
            f"| {r['comm_bytes_per_rank']:,.0f} | {r['collectives']:g} | {r['comm_ms']:.1f} "
            f"| {r['bound_ms']:.1f} | {r['bound_serial_ms']:.1f} "
            f"| {r['measured_over_bound']:.2f} | {_num(r['ours_over_torch'], '.2f')} "
            f"| {_num(r['async_over_sync'], '.2f')} | {_num(r['over_dense'], '.2f')} "
            f"| {_num(r.get('load_1min'), '.1f')} |")
    return "\n".join(lines) + "\n"
