"""The pilots that size a CPU study's scale: one real epoch of each arm, timed end to end.

A study's scale is chosen by a rule written down before its runs (conf/scale/cpu_fp32.yaml):
one run of its slowest arm at most 30 minutes on an idle 2-core AVX2 machine. This measures
what the rule needs, with the study's own command lines (accordion_repro.reproduce_cpu.command)
and its own instruction-set cap: each pilot is the arm's CLI run for one epoch on all the data,
with the full evaluation, and its wall time is everything a run pays per epoch (start-up
included, so E x the pilot's wall over-states an E-epoch run by E - 1 start-ups). Pilots of one
round run back to back, every arm once per round, so a machine shared with other work slows
every arm alike; the median over rounds is reported.

Besides the pilots, the step a reader can compare across machines: one training step of
ResNet-18 (width 0.25, batch 64, fp32, one thread) under the same cap, the figure issue 55
quotes from an AVX2 EPYC (0.47 s), so a pilot's wall time can be scaled to another machine.

Writes results/bench/study_pilots.csv (one row per width, arm and option).

    python scripts/bench_study_pilot.py [--widths 0.25 0.125] [--rounds 1] [--arms ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accordion_repro import reproduce_cpu
from accordion_repro.engine.numerics import cpu_model
from .harness import write_csv

STUDY = "cpu_fp32"
ARMS = {  # pilot name -> (preset, extra overrides): the study's kinds of step
    "rank2_detect": (reproduce_cpu.FIG2_REFERENCE, ["schedule.detect=true"]),
    "rank1": ("table1/resnet18_powersgd_static_high", []),
    "topk_low": ("table3/resnet18_topk_static_low", []),
    "topk_high": ("table3/resnet18_topk_static_high", []),
}
OPTIONS = {"fp32": [], "fp32_channels_last": ["trainer.channels_last=true"]}


def pilot(arm: str, width: float, option: str, data: Path) -> dict:
    """One epoch of `arm` at `width`, its CLI's wall time and what its metrics say."""
    preset, extra = ARMS[arm]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        argv = reproduce_cpu.command(
            preset, 42, data, out,
            [*extra, *OPTIONS[option], f"model.width={width}", "trainer.epochs=1",
             "trainer.checkpoint=false", "optim.warmup_epochs=0"],
            STUDY)
        env = {**os.environ, **reproduce_cpu.STUDIES[STUDY]["env"]}
        start = time.perf_counter()
        subprocess.run(argv, cwd=reproduce_cpu.REPO, env=env, check=True,
                       stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - start
        record = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    return {"wall_s": wall, "train_s": record["epoch_time_s"], "steps": record["steps"]}


def reference_step(width: float = 0.25, repeats: int = 5) -> float:
    """Median seconds of one fp32 training step (batch 64, one thread) under the study's cap,
    in a process of its own (the cap is read when torch loads)."""
    code = (
        "import statistics, time, torch, torch.nn.functional as F\n"
        "from accordion_repro.models import build_model\n"
        "torch.set_num_threads(1); torch.manual_seed(0)\n"
        f"m = build_model('resnet18', num_classes=10, width={width})\n"
        "o = torch.optim.SGD(m.parameters(), lr=0.01, momentum=0.9)\n"
        "x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))\n"
        "times = []\n"
        f"for _ in range({repeats} + 2):\n"
        "    t = time.perf_counter(); o.zero_grad(); F.cross_entropy(m(x), y).backward(); o.step()\n"
        "    times.append(time.perf_counter() - t)\n"
        "print(statistics.median(times[2:]))\n")
    env = {**os.environ, **reproduce_cpu.STUDIES[STUDY]["env"], "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, check=True, text=True,
                          capture_output=True)
    return float(done.stdout.split()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[0.25, 0.125])
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--options", nargs="+", default=["fp32"], choices=list(OPTIONS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data", type=Path,
                        default=Path(os.environ.get("ACCORDION_DATA", reproduce_cpu.REPO / "data")))
    parser.add_argument("--out", type=Path,
                        default=reproduce_cpu.REPO / "results" / "bench" / "study_pilots.csv")
    args = parser.parse_args(argv)
    cap = reproduce_cpu.STUDIES[STUDY]["env"]
    step = reference_step()
    print(f"reference step (ResNet-18 0.25, batch 64, fp32, one thread): {step:.3f} s")
    samples: dict[tuple, list[dict]] = {}
    for _ in range(args.rounds):
        for width in args.widths:
            for arm in args.arms:
                for option in args.options:
                    got = pilot(arm, width, option, args.data.resolve())
                    print(f"width {width} {arm} {option}: {got['wall_s']:.1f} s "
                          f"({got['steps']} steps in {got['train_s']:.1f} s)", flush=True)
                    samples.setdefault((width, arm, option), []).append(got)
    rows = []
    for (width, arm, option), got in samples.items():
        wall = statistics.median(g["wall_s"] for g in got)
        train = statistics.median(g["train_s"] for g in got)
        rows.append({"study": STUDY, "width": width, "arm": arm, "option": option,
                     "epoch_wall_s": round(wall, 1), "train_s": round(train, 1),
                     "steps": got[0]["steps"], "s_per_step": round(train / got[0]["steps"], 4),
                     "rounds": len(got), "reference_step_s": round(step, 4),
                     "cpu": cpu_model(), "isa_cap": " ".join(f"{k}={v}" for k, v in cap.items()),
                     "threads_per_rank": 1})
    write_csv(rows, args.out)
    return 0
