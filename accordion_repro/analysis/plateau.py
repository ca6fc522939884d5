"""How flat a run's accuracy is at the end of each LR phase: the test a scale must pass before
its runs can speak to the paper's claim.

Accordion's mechanism assumes that, away from the critical regimes, training is in a quiet
phase: the accuracy has plateaued before each LR decay, as it has at 300 epochs. For each LR
phase (the epochs between two decays, lr_phases in regime_plan.py) this reports the last third
of its epochs (at least two), the accuracy at its first and last epoch, the range within it, and the
change a least-squares line through it predicts over those epochs (the trend, less sensitive
to one noisy epoch than the end-to-end difference). A phase counts as flat when the trend's
change is within `--tolerance` points (0.5 by default).

    python -m accordion_repro.analysis.plateau RUN_DIR [RUN_DIR ...] [--tolerance 0.5]
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .collect import RunDirectoryError, read_metrics
from .regime_plan import lr_phases


@dataclass(frozen=True)
class PhaseEnd:
    phase: int
    epochs: tuple[int, int]      # first and last epoch of the phase's last third
    first_acc: float
    last_acc: float
    spread: float                # max - min within the last third
    trend: float                 # least-squares slope x (number of epochs - 1)

    def flat(self, tolerance: float) -> bool:
        return abs(self.trend) <= tolerance


def phase_ends(records: list[dict], metric: str = "test_acc") -> list[PhaseEnd]:
    """One PhaseEnd per LR phase of a run's metrics.jsonl records (a phase of a single epoch
    has no trend and is left out)."""
    phases = lr_phases(records)
    ends = []
    for phase in sorted(set(phases)):
        epochs = [r["epoch"] for r, p in zip(records, phases) if p == phase]
        if len(epochs) < 2:
            continue
        tail = epochs[-max(2, math.ceil(len(epochs) / 3)):]
        acc = np.array([records[e][metric] for e in tail], dtype=float)
        slope = np.polyfit(np.arange(len(tail)), acc, 1)[0]
        ends.append(PhaseEnd(phase, (tail[0], tail[-1]), float(acc[0]), float(acc[-1]),
                             float(acc.max() - acc.min()), float(slope * (len(tail) - 1))))
    return ends


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dirs", nargs="+", type=Path)
    parser.add_argument("--tolerance", type=float, default=0.5,
                        help="a phase is flat when its last third's trend changes by at most "
                             "this many points (default 0.5)")
    args = parser.parse_args(argv)
    for run_dir in args.run_dirs:
        try:
            ends = phase_ends(read_metrics(run_dir))
        except (RunDirectoryError, KeyError) as error:
            print(f"error: {run_dir}: {error}", file=sys.stderr)
            return 2
        print(run_dir)
        for end in ends:
            verdict = "flat" if end.flat(args.tolerance) else "not flat"
            print(f"  phase {end.phase}: epochs {end.epochs[0]}-{end.epochs[1]}  "
                  f"{end.first_acc:.2f} -> {end.last_acc:.2f} %  range {end.spread:.2f}  "
                  f"trend {end.trend:+.2f} points  ({verdict} within {args.tolerance:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
