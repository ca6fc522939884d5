"""`python -m accordion_repro.compare_runs A B`: do two run directories hold the same metrics?

A resumed run must log what the same run uninterrupted logs, epoch by epoch, to the last bit;
only wall-clock fields (`*_time_s`) may differ. This is the check `make kick-the-tires` runs on a
stopped-and-resumed run against a straight one, and one a user can run on their own pair. Exit 0
when they agree; 1, naming the first epoch and key that differ, when not.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from accordion_repro.run_layout import METRICS


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / METRICS).read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("_time_s")}
            for line in lines if line.strip()]


def first_difference(a: Path, b: Path) -> str | None:
    """None where the two runs' metrics agree (timings aside), else what differs first."""
    left, right = _records(a), _records(b)
    for epoch, (x, y) in enumerate(zip(left, right)):
        for key in sorted(x.keys() | y.keys()):
            if x.get(key) != y.get(key):
                return f"epoch {epoch}: {key} is {x.get(key)!r} in {a}, {y.get(key)!r} in {b}"
    if len(left) != len(right):
        return f"{a} logged {len(left)} epochs, {b} {len(right)}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m accordion_repro.compare_runs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs=2, type=Path, metavar="RUN_DIR")
    args = parser.parse_args(argv)
    for run_dir in args.runs:
        if not (run_dir / METRICS).is_file():
            print(f"error: {run_dir} holds no {METRICS}", file=sys.stderr)
            return 2
    difference = first_difference(*args.runs)
    if difference:
        print(f"different: {difference}")
        return 1
    print(f"identical metrics over {len(_records(args.runs[0]))} epochs (wall-clock times aside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
