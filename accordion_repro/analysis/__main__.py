"""`python -m accordion_repro.analysis`: every table and figure from results/runs."""

from __future__ import annotations

import argparse
import sys
import warnings

from accordion_repro.costmodel import NETWORKS
from accordion_repro.errors import ConfigError


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m accordion_repro.analysis",
        description="Collect run directories and write Tables 1-6 and Figures 2, 9, 10.")
    parser.add_argument("--runs", default="results/runs",
                        help="folder searched recursively for run directories (default: %(default)s)")
    parser.add_argument("--out", default="results",
                        help="tables go to OUT/tables, figures to OUT/figures (default: %(default)s)")
    parser.add_argument("--net", default="10gbit", choices=sorted(NETWORKS),
                        help="network of the predicted-time column (default: %(default)s)")
    parser.add_argument("--workers", type=int, default=None,
                        help="workers for the predicted time (default: each run's world size)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    from accordion_repro.analysis.build import build_all

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            written = build_all(args.runs, args.out, net=args.net, workers=args.workers)
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 2
    for warning in caught:
        print(f"warning: {warning.message}", file=sys.stderr)
    for name, paths in written.items():
        print(f"{name}: " + ", ".join(str(path) for path in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
