"""make bench-network: training time across a shaped link, held against the cost model.

Needs root, iproute2 and tc. Builds two private network namespaces joined by a veth pair per
link (only 10.77.0.1 <-> 10.77.0.2, nothing else reachable), shapes both directions, runs rank 0
and rank 1 of the trainer one per namespace over gloo, and writes results/bench/network.{csv,md}.
Everything it creates is removed on exit, on Ctrl-C/SIGTERM, and (after a SIGKILL) at the next
start. See docs/network_bench.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from accordion_repro.errors import ConfigError
from accordion_repro.netbench import LinkSpec, NetbenchUnavailable, missing_requirement
from accordion_repro.netbench.cases import BenchScale, batch_cases, compression_cases
from accordion_repro.netbench.driver import run_benchmark
from accordion_repro.netbench.ranks import RanksFailed
from accordion_repro.netbench.units import parse_bandwidth, parse_duration

REPO = Path(__file__).resolve().parents[1]


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bandwidth", nargs="+", default=["100mbit", "1gbit"],
                   help="link rates, e.g. 100mbit 1gbit 2.5e9 (bit/s)")
    p.add_argument("--latency", default="0.5ms", help="one-way delay per direction (netem)")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--steps-per-epoch", type=int, default=2)
    p.add_argument("--batch-per-worker", type=int, default=16)
    p.add_argument("--batch-sizes", type=int, nargs=2, default=[16, 128],
                   metavar=("SMALL", "LARGE"),
                   help="global batch sizes of the batch family (paper: 512 4096)")
    p.add_argument("--batch-epoch-samples", type=int, default=128)
    p.add_argument("--cases", nargs="*", default=None,
                   help="only these case names (e.g. dense powersgd_accordion batch_small)")
    p.add_argument("--no-batch", action="store_true", help="skip the batch-size family")
    p.add_argument("--timeout", type=float, default=300, help="seconds per training run")
    p.add_argument("--out", type=Path, default=REPO / "results" / "bench")
    p.add_argument("--override", nargs="*", default=[], help="extra trainer overrides")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    reason = missing_requirement()
    if reason:
        print(f"bench-network: {reason}", file=sys.stderr)
        return 2
    try:
        latency = parse_duration(args.latency, key="latency")
        links = [LinkSpec(parse_bandwidth(b, key="bandwidth"), latency) for b in args.bandwidth]
        scale = BenchScale(epochs=args.epochs, steps_per_epoch=args.steps_per_epoch,
                           batch_per_worker=args.batch_per_worker,
                           batch_small=args.batch_sizes[0], batch_large=args.batch_sizes[1],
                           batch_epoch_samples=args.batch_epoch_samples,
                           extra_overrides=tuple(args.override))
    except ConfigError as err:
        print(f"bench-network: {err}", file=sys.stderr)
        return 2

    notes = []
    has_batch_schedule = (REPO / "conf" / "schedule" / "batch_accordion.yaml").exists()
    cases = compression_cases()
    if not args.no_batch:
        cases += batch_cases(scale, with_accordion=has_batch_schedule)
        if not has_batch_schedule:
            notes.append("batch-size Accordion skipped: conf/schedule/batch_accordion.yaml absent")
    if args.cases:
        unknown = set(args.cases) - {c.name for c in cases}
        if unknown:
            print(f"bench-network: unknown case(s) {sorted(unknown)}", file=sys.stderr)
            return 2
        cases = [c for c in cases if c.name in set(args.cases)]

    log = lambda line: print(f"bench-network: {line}", flush=True)  # noqa: E731
    try:
        result = run_benchmark(links, cases, scale, out_dir=args.out, timeout_s=args.timeout,
                               notes=notes, log=log)
    except (NetbenchUnavailable, RanksFailed, FileNotFoundError) as err:
        print(f"bench-network: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as err:
        print(f"bench-network: interrupted ({err or 'SIGINT'}); everything it made is removed",
              file=sys.stderr)
        return 130
    print(result.write(args.out))
    return 1 if result.failed else 0


if __name__ == "__main__":
    sys.exit(main())
