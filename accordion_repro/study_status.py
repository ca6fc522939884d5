"""`make study-status`: where a study's queue stands, without touching it.

    python -m accordion_repro.study_status [--study cpu_fp32] [--seeds ...] [--runs DIR]

Every run of the queue in order, done (with its wall time), running (epochs so far), stopped
part-way (it resumes from its checkpoint) or queued, and an ETA: each run still to come is
expected to take the median wall time of the finished runs of its preset, else of the study.
"""

from __future__ import annotations

import csv
import json
import statistics
import time
from pathlib import Path

import yaml

from accordion_repro import reproduce_cpu as queue
from accordion_repro.run_layout import METRICS, RESOLVED, SUMMARY, TIMINGS


def _timings(runs: Path) -> dict[tuple[str, int], float]:
    path = runs / TIMINGS
    if not path.exists():
        return {}
    return {(r["preset"], int(r["seed"])): float(r["wall_s"]) for r in csv.DictReader(path.open())}


def _progress(out: Path) -> tuple[int, int | None]:
    """(epochs logged, epochs planned) of a run directory."""
    metrics = out / METRICS
    done = len(metrics.read_text().splitlines()) if metrics.exists() else 0
    resolved = out / RESOLVED
    total = (yaml.safe_load(resolved.read_text()).get("trainer", {}).get("epochs")
             if resolved.exists() else None)
    return done, total


def print_status(study: str, seeds: list[int], runs: Path, patterns: list[str]) -> int:
    order = queue.run_order(study, seeds, patterns, runs)
    walls = _timings(runs)
    live = queue.queue_holder(runs)
    by_preset: dict[str, list[float]] = {}
    for (preset, _), wall in walls.items():
        by_preset.setdefault(preset, []).append(wall)
    typical = statistics.median(walls.values()) if walls else None
    counts = {"done": 0, "running": 0, "stopped": 0, "queued": 0}
    remaining = 0.0
    unknown = 0
    print(f"study {study} in {runs} (queue {'running, pid ' + str(live) if live else 'not running'})")
    for preset, seed in order:
        out = queue.run_dir(runs, preset, seed)
        expected = (statistics.median(by_preset[preset]) if preset in by_preset else typical)
        if queue.completed(out):
            state, note = "done", f"{walls[(preset, seed)] / 60:5.1f} min" \
                if (preset, seed) in walls else "(no timing)"
        else:
            summary = out / SUMMARY
            status = json.loads(summary.read_text()).get("status") if summary.exists() else None
            done, total = _progress(out)
            if status is None:
                state, note, left = "queued", "", 1.0
            else:
                state = "running" if status == "running" and live else "stopped"
                note, left = f"epoch {done}/{total or '?'}", 1 - done / (total or done or 1)
            if expected is None:
                unknown += 1
            else:
                remaining += expected * left
        counts[state] += 1
        print(f"  {state:8s} {preset} seed {seed}  {note}")
    if study == "cpu_fp32" and not set(queue.FP32_MORE_SEEDS) <= set(seeds):
        extended = {p for p, s in order if s in queue.FP32_MORE_SEEDS}
        print("  seeds " + " ".join(map(str, queue.FP32_MORE_SEEDS)) + ": "
              + (f"{len(extended)} arms of undecided contrasts" if extended else
                 "decided once seeds " + " ".join(map(str, seeds)) + " of every headline "
                 "contrast are done (none added yet)"))
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    if remaining or unknown:
        eta = time.strftime("%Y-%m-%d %H:%M %Z", time.localtime(time.time() + remaining))
        unknown_note = f" (+{unknown} runs with no timing yet)" if unknown else ""
        print(f"{summary}; about {remaining / 3600:.1f} h of runs left{unknown_note}, "
              f"ETA {eta} if the queue runs without a break")
    else:
        print(f"{summary}; nothing left")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=sorted(queue.STUDIES), default="cpu_fp32")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="default: the study's own (as reproduce_cpu.py takes them)")
    parser.add_argument("--runs", type=Path, default=None,
                        help="the runs folder (default results/runs/<study>)")
    parser.add_argument("--only", nargs="+", default=["*"], metavar="PATTERN")
    args = parser.parse_args(argv)
    seeds = args.seeds or (queue.FP32_SEEDS if args.study == "cpu_fp32" else [42, 43])
    runs = args.runs or queue.REPO / "results" / "runs" / queue.STUDIES[args.study]["runs"]
    return print_status(args.study, seeds, runs, args.only)


if __name__ == "__main__":
    raise SystemExit(main())
