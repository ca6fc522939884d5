"""Run the CPU-scale reproduction on real data, one run after another, and time each run.

The set (issue 8): Table 1's ResNet-18 cells, Table 3's CIFAR-10 ResNet-18 Top-K cells and
its WikiText-2 LSTM cells, Table 5's ResNet-18 batch-size cells, and Figure 2's two runs plus
the Accordion run whose norm trace it draws, each at `scale=cpu` on the real data in
../shared/data (CIFAR-10: the 4,000 lossless + 10,000 JPEG training images and the full test
set, through `dataset=npz`; WikiText-2: the token files), for every seed asked.

Each run is the ordinary CLI command (printed before it starts), so any row can be rerun by
hand. Finished runs are skipped, an interrupted one resumes from its checkpoint, and
checkpoints are deleted once a run completes (results/ keeps resolved.yaml, metrics.jsonl and
summary.json). Wall times go to <runs>/timings.csv.

    python scripts/reproduce_cpu.py [--seeds 42 43] [--data ../shared/data] [--dry-run] [--only PATTERN]
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CIFAR_PRESETS = [
    "table1/resnet18_powersgd_dense", "table1/resnet18_powersgd_static_low",
    "table1/resnet18_powersgd_static_high", "table1/resnet18_powersgd_accordion",
    "table3/resnet18_topk_static_low", "table3/resnet18_topk_static_high",
    "table3/resnet18_topk_accordion",
    "table5/resnet18_batch_static_low", "table5/resnet18_batch_static_high",
    "table5/resnet18_batch_accordion",
    "fig2/resnet18_high_inside", "fig2/resnet18_high_outside",
]
TRACE_PRESET = "fig2/resnet18_accordion"  # Figure 2(a)'s norm trace: the first seed only
LSTM_PRESETS = ["table3/lstm_topk_static_low", "table3/lstm_topk_static_high", "table3/lstm_topk_accordion"]


def run_dir(runs: Path, preset: str, seed: int) -> Path:
    return runs / preset / f"seed{seed}"


def command(preset: str, seed: int, data: Path, out: Path, extra: list[str]) -> list[str]:
    dataset = [] if preset.startswith("table3/lstm") else ["dataset=npz"]
    return [sys.executable, "-m", "accordion_repro.train", f"experiment={preset}", "scale=cpu",
            *dataset, f"paths.data_dir={data}", f"seed={seed}", "logger.wandb.mode=disabled",
            "trainer.progress=never", f"hydra.run.dir={out}", *extra]


def completed(path: Path) -> bool:
    summary = path / "summary.json"
    return summary.exists() and json.loads(summary.read_text()).get("status") == "completed"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data")
    parser.add_argument("--runs", type=Path, default=REPO / "results" / "runs" / "cpu")
    parser.add_argument("--only", default="*", help="fnmatch pattern on the preset name")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("extra", nargs="*", help="further overrides for every run")
    args = parser.parse_args()
    if not args.dry_run and not (args.data / "cifar10-sample").exists():
        print(f"error: the real sample data is not at {args.data} (cifar10-sample/, cifar10-jpeg/, "
              "wikitext-2/); pass --data", file=sys.stderr)
        return 2
    presets = [p for p in CIFAR_PRESETS + LSTM_PRESETS if fnmatch.fnmatch(p, args.only)]
    timings = args.runs / "timings.csv"
    rows = list(csv.DictReader(timings.open())) if timings.exists() else []
    start_all = time.perf_counter()
    for seed in args.seeds:
        trace = [TRACE_PRESET] if seed == args.seeds[0] and fnmatch.fnmatch(TRACE_PRESET, args.only) else []
        order = [p for p in presets if p in CIFAR_PRESETS] + trace + [p for p in presets if p in LSTM_PRESETS]
        for preset in order:
            out = run_dir(args.runs, preset, seed)
            argv = command(preset, seed, args.data.resolve(), out, args.extra)
            if completed(out):
                print(f"done already: {out}")
                continue
            print("$ " + " ".join(argv), flush=True)
            if args.dry_run:
                continue
            start = time.perf_counter()
            result = subprocess.run(argv, cwd=REPO)
            elapsed = time.perf_counter() - start
            if result.returncode != 0:
                print(f"error: {preset} seed {seed} failed (exit {result.returncode}); rerun to resume",
                      file=sys.stderr)
                return result.returncode
            shutil.rmtree(out / "checkpoints", ignore_errors=True)
            shutil.rmtree(out / ".hydra", ignore_errors=True)
            log = out / "train.log"  # Hydra's job log, empty: the trainer prints to stdout
            if log.exists() and log.stat().st_size == 0:
                log.unlink()
            rows = [r for r in rows if not (r["preset"] == preset and int(r["seed"]) == seed)]
            rows.append({"preset": preset, "seed": seed, "wall_s": f"{elapsed:.1f}"})
            timings.parent.mkdir(parents=True, exist_ok=True)
            with timings.open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=["preset", "seed", "wall_s"])
                writer.writeheader()
                writer.writerows(rows)
            print(f"{preset} seed {seed}: {elapsed / 60:.1f} min", flush=True)
    if not args.dry_run:
        print(f"total: {(time.perf_counter() - start_all) / 60:.1f} min this invocation; "
              f"{sum(float(r['wall_s']) for r in rows) / 60:.1f} min over all timed runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
