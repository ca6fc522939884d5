"""make bench-ddp-network: a whole DDP training step across a shaped link, torch's hooks and
ours, against the bound the link sets.

Needs root, iproute2 and tc. Per link (--bandwidth) it builds two private network namespaces
joined by a tc-shaped veth pair (benchmarks/netbench/netns.py), calibrates the link with raw
gloo collectives (benchmarks/netbench/bench.py), and per model width (--width) runs
benchmarks/ddp_step.py's arms as rank 0 and rank 1, one per namespace: the README's own-code path
(a DistributedDataParallel ResNet-18 with our hook, or torch's), batch 32 per rank, one thread
per rank, arms and their compute twins (the same arm on a process group of one) interleaved in
every round, medians over --steps after --warmup. Writes results/bench/ddp_network.csv (one row
per link, width and arm, with its bound: benchmarks/netbench/ddp_report.py, and the machine's
load average while it ran), ddp_network.md and
ddp_network_raw.json; rewritten after every link, so an interrupted run keeps what it measured.

`--breakdown ARM` times the phases of one arm's step on each link and width instead
(benchmarks/ddp_phases.py; -> ddp_network_breakdown.csv). `--table` measures nothing: it prints
the README's table from the CSV and rewrites ddp_network.md (no root needed). Everything it
creates is removed on exit, on Ctrl-C/SIGTERM, and (after a SIGKILL) at the next start.
See docs/network_bench.md.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import statistics
import sys
import threading
from pathlib import Path

from accordion_repro.errors import ConfigError
from accordion_repro.utils import atomic_write_text
from accordion_repro.run_layout import PROJECT_ROOT as REPO
from .ddp_phases import table as phase_table
from .ddp_step import TORCH_START_ITER
from .harness import quantile_rows
from .netbench.bench import calibrate, link_calibration, link_pair
from .netbench.ddp_report import markdown, read_csv, readme_table, rows_for, write_csv
from .netbench.netns import (LinkSpec, cleanup_leftovers, missing_requirement,
                                       parse_bandwidth, parse_duration, teardown_on_signals)
from .netbench.ranks import python_argv, run_reported, run_two_ranks
from .netbench.report import csv_text


NAME = "bench-ddp-network"


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bandwidth", nargs="+", default=["100mbit", "1gbit", "10gbit"],
                   help="link rates, e.g. 100mbit 1gbit 2.5e9 (bit/s)")
    p.add_argument("--latency", default="0", help="one-way delay per direction (netem), e.g. 0.5ms")
    p.add_argument("--width", type=float, nargs="+", default=[1.0, 0.25],
                   help="ResNet-18 channel multipliers (1.0: full width; 0.25: the CPU study's)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per arm")
    p.add_argument("--warmup", type=int, default=3, help="untimed steps per arm first")
    p.add_argument("--topk", type=float, nargs="+", default=[0.1, 0.01],
                   help="kept fractions of our Top-K arms")
    p.add_argument("--only", nargs="+", default=[""], metavar="TEXT",
                   help="run only arms whose name contains one of these")
    p.add_argument("--breakdown", metavar="ARM", default=None,
                   help="time the phases of one arm's step instead, e.g. 'ours async r2'")
    p.add_argument("--timeout", type=float, default=5400, help="seconds per link and width")
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench" / "ddp_network.csv")
    p.add_argument("--table", action="store_true",
                   help="measure nothing: print the README table from --out, rewrite its .md")
    return p.parse_args(argv)


def _paths(out: Path) -> dict[str, Path]:
    stem = out.with_suffix("")
    return {"md": out.with_suffix(".md"), "raw": Path(f"{stem}_raw.json"),
            "breakdown": Path(f"{stem}_breakdown.csv"), "work": out.parent / "tmp" / stem.name}


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    out = args.out.resolve()
    paths = _paths(out)
    if args.table:
        if not out.exists():
            print(f"{NAME}: no {out}: run the benchmark first", file=sys.stderr)
            return 2
        raw = json.loads(paths["raw"].read_text()) if paths["raw"].exists() else {}
        rows = read_csv(out)
        atomic_write_text(paths["md"], markdown(rows, raw.get("command", "")))
        print(readme_table(rows))
        return 0
    reason = missing_requirement()
    if reason:
        print(f"{NAME}: {reason}", file=sys.stderr)
        return 2
    try:
        if args.steps < 2:
            raise ConfigError("steps", f"must be >= 2 (quartiles), got {args.steps}")
        if args.warmup < TORCH_START_ITER:
            raise ConfigError("warmup", f"must be >= {TORCH_START_ITER}: torch's hook "
                              f"compresses from its step {TORCH_START_ITER} on")
        latency = parse_duration(args.latency, key="latency")
        links = [LinkSpec(parse_bandwidth(b, key="bandwidth"), latency) for b in args.bandwidth]
    except ConfigError as err:
        print(f"{NAME}: {err}", file=sys.stderr)
        return 2
    command = " ".join(["python scripts/bench_ddp_network.py", *map(shlex.quote, argv)])
    return run_reported(NAME, lambda: measure(args, links, paths, out, command))[0]


def _rank_argv(args, width: float, raw: Path) -> list[str]:
    argv = python_argv(f"{__package__}.ddp_step", "--env", "--raw", str(raw),
                       "--width", f"{width:g}", "--steps", str(args.steps),
                       "--warmup", str(args.warmup), "--only", *args.only,
                       "--topk", *(f"{k:g}" for k in args.topk))
    return argv + (["--breakdown", args.breakdown] if args.breakdown else ["--compute"])


def _median_load_while(run, every_s: float = 5.0) -> float:
    """run(), sampling the machine's 1-minute load average every `every_s` seconds meanwhile;
    the median sample. The benchmark's own two ranks (one thread each) count in it: on an
    otherwise idle machine it reads about 2. Every row records it, because every number is a
    time and this machine may be shared."""
    samples, done = [os.getloadavg()[0]], threading.Event()

    def sample():
        while not done.wait(every_s):
            samples.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        run()
    finally:
        done.set()
        sampler.join()
    samples.append(os.getloadavg()[0])
    return statistics.median(samples)


def _kept_breakdowns(path: Path, new: list[dict]) -> list[dict]:
    """The rows of earlier breakdowns that this one does not replace (another link, width or
    arm), so that one CSV collects every arm broken down."""
    if not path.exists():
        return []
    key = lambda row: (row["link"], float(row["width"]), row["arm"])  # noqa: E731
    replaced = {key(row) for row in new}
    with open(path, newline="") as f:
        return [row for row in csv.DictReader(f) if key(row) not in replaced]


def measure(args, links, paths: dict[str, Path], out: Path, command: str) -> None:
    """Every link, every width; the outputs rewritten after each link."""
    log = lambda line: print(f"{NAME}: {line}", flush=True)  # noqa: E731
    removed = cleanup_leftovers()
    if removed:
        log(f"removed leftovers of an earlier run: {' '.join(removed)}")
    raw: dict = {"command": command, "links": []}
    rows, phases = [], []
    with teardown_on_signals():
        for link in links:
            pair, shaping = link_pair(link, "ddp")
            try:
                if shaping.note:
                    log(shaping.note)
                work = paths["work"] / f"{int(link.bandwidth_bps)}bps"
                entry = {"label": shaping.label, "bandwidth_bps": link.bandwidth_bps,
                         "latency_s": link.latency_s, "latency_applied": shaping.latency_applied,
                         "widths": {}}
                if not args.breakdown:  # the bound needs the link's collective rates
                    entry["calibration"] = calibrate(pair, work / "calibration")
                    calibration = link_calibration(shaping, entry["calibration"])
                    log(f"[{calibration.label}] all-reduce at "
                        f"{calibration.rate(calibration.bulk):.2f} of line rate")
                for width in args.width:
                    record_path = work / f"width{width:g}" / "raw.json"
                    load = _median_load_while(lambda: run_two_ranks(
                        pair, _rank_argv(args, width, record_path),
                        log_dir=record_path.parent, timeout_s=args.timeout))
                    record = json.loads(record_path.read_text())
                    record["load_1min"] = load
                    entry["widths"][f"{width:g}"] = record
                    if args.breakdown:
                        phases.append({"link": shaping.label, "width": width, "arm": args.breakdown,
                                       **record["breakdown"][args.breakdown]})
                        log(f"[{shaping.label}, width {width:g}]\n"
                            + phase_table(record["breakdown"]))
                        continue
                    compute = {n: 1e3 * statistics.median(v) for n, v in record["compute"].items()}
                    new = rows_for(calibration, width, quantile_rows(record["samples"]),
                                   compute, record["traffic"], load)
                    rows += new
                    for row in new:
                        log(f"[{calibration.label}, width {width:g}] {row['arm']}: "
                            f"{row['median_ms']:.0f} ms, bound {row['bound_ms']:.0f} ms, "
                            f"load {load:.1f}")
                raw["links"].append(entry)
            finally:
                pair.teardown()
            if args.breakdown:
                kept = _kept_breakdowns(paths["breakdown"], phases)
                atomic_write_text(paths["breakdown"], csv_text(kept + phases, list(phases[0])))
                continue
            atomic_write_text(paths["raw"], json.dumps(raw, indent=1) + "\n")
            write_csv(rows, out)
            atomic_write_text(paths["md"], markdown(rows, command))
    if rows:
        print(readme_table(rows))
        log(f"wrote {out}, {paths['md']}, {paths['raw']}")
    else:
        log(f"wrote {paths['breakdown']}")

