"""make bench-network: whole-run training time of the CPU study's runs across a shaped link.

Needs root, iproute2 and tc. Builds two private network namespaces joined by a veth pair per
link (only 10.77.0.1 <-> 10.77.0.2, nothing else reachable), shapes both directions, times one
step of each static configuration of the study (rank 0 and rank 1 of the real trainer, one per
namespace, over gloo), combines those step times with each committed run's logged schedule
into the time of the whole run, holds the cost model against it, and writes
results/bench/network{.csv,.md,_steps.csv,_speedup.png} and the raw measurements they are
built from (network_raw.json; `--rebuild` rebuilds the rest from it, no root needed).
Everything it creates is removed on exit, on Ctrl-C/SIGTERM, and (after a SIGKILL) at the next
start. See docs/network_bench.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path

from accordion_repro.errors import ConfigError
from accordion_repro.utils import atomic_write_text
from accordion_repro.run_layout import PROJECT_ROOT as REPO
from .netbench.driver import assemble, measure
from .netbench.netns import LinkSpec, missing_requirement, parse_bandwidth, parse_duration
from .netbench.ranks import run_reported
from .netbench.report import off_rows, write
from .netbench.study import study_families



def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bandwidth", nargs="+", default=["100mbit", "1gbit", "10gbit"],
                   help="link rates, e.g. 100mbit 1gbit 2.5e9 (bit/s)")
    p.add_argument("--latency", default="0", help="one-way delay per direction (netem), e.g. 0.5ms")
    p.add_argument("--runs", type=Path, default=REPO / "results" / "runs" / "cpu_full",
                   help="the study whose runs give the schedules (default: the whole-CIFAR study)")
    p.add_argument("--schedule-from", type=Path, nargs="*", default=[], metavar="RUN_DIR",
                   help="an Accordion run directory to use instead of its family's in --runs")
    p.add_argument("--steps", type=int, default=8,
                   help="timed steps per epoch at global batch 128 (fewer at larger batches)")
    p.add_argument("--no-check", action="store_true", help="skip the end-to-end runs")
    p.add_argument("--timeout", type=float, default=300, help="seconds per training run")
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench")
    p.add_argument("--rebuild", action="store_true",
                   help="measure nothing: rebuild the tables and plot from <out>/network_raw.json")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    out, runs = args.out.resolve(), args.runs.resolve()
    schedule_from = [p.resolve() for p in args.schedule_from]
    os.chdir(REPO)  # run directories are named relative to the repository in every output
    raw_file = out / "network_raw.json"
    try:
        families = study_families(Path(os.path.relpath(runs, REPO)),
                                  [Path(os.path.relpath(p, REPO)) for p in schedule_from])
        if args.rebuild:
            if not raw_file.exists():
                raise ConfigError("rebuild", f"no {raw_file}: run the benchmark first")
            return report(json.loads(raw_file.read_text()), families, out)
        reason = missing_requirement()
        if reason:
            print(f"bench-network: {reason}", file=sys.stderr)
            return 2
        if args.steps < 2:
            raise ConfigError("steps", f"must be >= 2, got {args.steps}")
        latency = parse_duration(args.latency, key="latency")
        links = [LinkSpec(parse_bandwidth(b, key="bandwidth"), latency) for b in args.bandwidth]
    except ConfigError as err:
        print(f"bench-network: {err}", file=sys.stderr)
        return 2

    command = " ".join(["python scripts/bench_network.py", *map(shlex.quote, argv if argv is not None else sys.argv[1:])])
    log = lambda line: print(f"bench-network: {line}", flush=True)  # noqa: E731

    def save(raw: dict) -> None:
        atomic_write_text(raw_file, json.dumps(raw, indent=1) + "\n")
        write(assemble(raw, families), families, out)

    code, raw = run_reported("bench-network", lambda: measure(
        links, families, steps=args.steps, out_dir=out, timeout_s=args.timeout,
        check=not args.no_check, command=command, save=save, log=log))
    return code or report(raw, families, out)


def report(raw: dict, families, out: Path) -> int:
    result = assemble(raw, families)
    print(write(result, families, out))
    for line in off_rows(result):
        print(f"bench-network: model off by more than 15%: {line}", file=sys.stderr)
    return 0

