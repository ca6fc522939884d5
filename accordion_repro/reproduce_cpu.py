"""Run a CPU-scale reproduction on real data, one run after another, and time each run.

Two studies (`--study`):
- `cpu` (the small one): Table 1's ResNet-18 cells, Table 3's CIFAR-10 ResNet-18 Top-K cells
  and its WikiText-2 LSTM cells, Table 5's ResNet-18 batch-size cells, and Figure 2's two runs
  plus the Accordion run whose norm trace it draws, each at `scale=cpu` on the real data in
  the data folder (docs/data.md; CIFAR-10: the 4,000 lossless + 10,000 JPEG training images and the full test
  set, through `dataset=npz`; WikiText-2: the token files), for every seed asked.
- `cpu_full` (the whole-CIFAR study, `make reproduce-cpu-full`): `scale=cpu_full` on all 50,000
  + 10,000 CIFAR-10 images (`dataset=cifar10_jpeg`): Table 1 and Table 3 ResNet-18 cells and
  Figure 2 (b) for every seed, then Table 5, Figure 10 and Figure 9 (VGG-19bn on CIFAR-10 as a
  CIFAR-100 stand-in) as the budget allows. Figure 2 (b) puts rank 1 into the same number of
  epochs in both arms (FIG2_WINDOWS), inside or outside the critical regimes, so the two
  differ in where the high compression goes, not how much of it there is.

- `cpu_fp32` (the central-claim study on any CPU, `make study`): `scale=cpu_fp32`, fp32 on the
  whole CIFAR-10 under an AVX2 instruction-set cap (AVX2_CAP), so that an AVX2 machine and an
  AVX512 one compute the same bits and no run depends on a CPU feature. Its queue (FP32_ORDER):
  rank 2 (the detect run whose flags make the Figure 2 (b) plan), rank 1, the inside arm, the
  earliest, latest and random control arms, Accordion 2<->1, Accordion without the LR-decay
  rule, the LR-decay rule alone, each for seeds 42-44; then seeds 45 and 46 of every headline
  contrast whose 95 % interval still spans zero; then Table 3's Top-K cells and the successors.
  `make study-status` (accordion_repro/study_status.py) prints done / running / queued with
  wall times and an ETA.

Each run is the ordinary CLI command (printed before it starts), so any row can be rerun by
hand; a study with an instruction-set cap prints it as the command's environment. Finished runs are skipped, an interrupted one resumes from its checkpoint, and
checkpoints are deleted once a run completes (results/ keeps resolved.yaml, metrics.jsonl and
summary.json). Wall times go to <runs>/timings.csv, a resumed run's with every attempt's.

    python scripts/reproduce_cpu.py [--study cpu|cpu_full] [--seeds 42 43] [--data DIR]
                                    [--dry-run] [--only PATTERN ...]
"""

from __future__ import annotations

import argparse
import csv
import fnmatch
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from accordion_repro.run_layout import (CHECKPOINTS, CONF_DIR, METRICS, PROJECT_ROOT, SUMMARY,
                                         TIMINGS, study_run_dir)

REPO = PROJECT_ROOT
STOPPED = 128 + signal.SIGTERM  # the runner's exit status when told to stop (as the trainer's)

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

# The whole-CIFAR study, in the order it runs: the cells that answer the paper's question for
# every seed first, then the rest (one seed, as the budget allows). Figure 2(a)'s trace is the
# Table 1 Accordion run's detector log (same config), so it is not run twice.
FULL_CORE = CIFAR_PRESETS[:7] + ["fig2/resnet18_high_inside", "fig2/resnet18_high_outside"]
# Table 5's and Figure 10's ResNet-18 B_low cell is Table 1's dense run (analysis/layout.py TWINS),
# so it is not run again.
FULL_EXTRA = [
    "table5/resnet18_batch_accordion", "table5/resnet18_batch_static_high",
    "fig10/resnet18_static_high", "fig10/resnet18_accordion",
    "fig9/vgg19bn_rank4", "fig9/vgg19bn_rank2", "fig9/vgg19bn_rank1",
    "fig9/vgg19bn_accordion_4_1", "fig9/vgg19bn_accordion_4_2",
]
# scale=cpu_full has 12 epochs with LR decays at 6 and 10. The critical regimes as Figure 2
# places them (the first 20 of 300 epochs and 10 after each decay) are epochs 0-1, 6 and 10;
# the other arm puts rank 1 into as many epochs outside them, the two before each decay's
# critical epoch (4-5 and 8-9). `inside` is the level inside the windows in both arms.
FIG2_WINDOWS = {
    "fig2/resnet18_high_inside": "[[0,2],[6,7],[10,11]]",
    "fig2/resnet18_high_outside": "[[4,6],[8,10]]",
}
# The eta sweep at scale=cpu_full (README: at 12 epochs eta = 0.5 rarely flags a layer critical,
# so PowerSGD Accordion spends most epochs at rank 1): Table 1's Accordion cell with a lower
# detector threshold, run for the first two seeds. Each is its own run name (no table), so the
# tables keep the paper's eta = 0.5 and the sweep sits beside them in results/runs/cpu_full.
ETA_SWEEP = {
    f"eta_sweep/resnet18_powersgd_accordion_eta{eta}": (
        "table1/resnet18_powersgd_accordion",
        [f"schedule.eta={eta}", f"run.name=eta_sweep/resnet18_powersgd_accordion_eta{eta}",
         "run.table=null", f"run.label='Accordion 2<->1 (eta {eta})'"])
    for eta in ("0.2", "0.3")
}
# The paired precision check (issue 22: a faster option is used at a new scale only if it keeps
# the final accuracy within the seed spread): Table 1's dense and rank-1 cells at scale=cpu_full,
# seed 42, in bf16 autocast with channels_last, against the fp32 runs of the same seed.
PRECISION_CHECK = {
    f"precision_check/{cell}_bf16_channels_last": (
        f"table1/{cell}",
        ["trainer.precision=bf16", "trainer.channels_last=true",
         f"run.name=precision_check/{cell}_bf16_channels_last", "run.table=null",
         f"run.label='{label} (bf16, channels_last)'"])
    for cell, label in (("resnet18_powersgd_dense", "Dense"),
                        ("resnet18_powersgd_static_high", "Rank 1"))
}
# The detector apart from the LR-decay rule (issue 36), Table 1's Accordion cell at scale=cpu_long:
# - no_lr_rule: the norm test alone (schedule.lr_decay_rule=false, eta 0.5);
# - eta0.1: an eta at which the norm test fires on this schedule. The rule, fixed before running:
#   the largest multiple of 0.05 at which, in every seed's rank-2 detect run, the whole-model
#   norm ratio flags the first epoch at each new LR (epochs 15 and 25). Those ratios were
#   0.221/0.145/0.150 and 0.150/0.158/0.176 (seeds 42/43/44), so eta = 0.10; per layer it
#   flags 23-26 % of the (layer, epoch) pairs of those runs, against under 1 % at eta 0.5;
# - lr_rule_only: rank 2 in the epochs the first check and the LR-decay rule hold critical
#   (0-1, 15, 25 at this scale's detector interval of 1 epoch), rank 1 elsewhere, no norm test.
#   No committed run is this schedule: Accordion at eta 0.5 also kept 2-9 layer-epochs of 630 at
#   rank 2 where the norm test fired, so the difference between the two is the norm test's share.
#   Its windows are the scale's fig2_windows (lr_rule_windows), [[0,2],[15,16],[25,26]] there.
ABLATION_LABELS = {"no_lr_rule": "Accordion 2<->1, no LR-decay rule",
                   "eta0.1": "Accordion 2<->1 (eta 0.1)",
                   "lr_rule_only": "LR-decay rule only (rank 2 in the first check and after "
                                   "each decay)"}
LR_RULE_ONLY = "ablation/resnet18_powersgd_lr_rule_only"
ABLATION = {
    f"ablation/resnet18_powersgd_{name}": (
        "table1/resnet18_powersgd_accordion" if name != "lr_rule_only"
        else "fig2/resnet18_high_outside",
        [*{"no_lr_rule": ["schedule.lr_decay_rule=false"], "eta0.1": ["schedule.eta=0.1"],
           "lr_rule_only": ["schedule.inside=2", "schedule.outside=1", "run.figure=null",
                            "run.method=lr_rule_only"]}[name],
         f"run.name=ablation/resnet18_powersgd_{name}", "run.table=null",
         f"run.label='{label}'"])
    for name, label in ABLATION_LABELS.items()
}
VARIANTS = {**ETA_SWEEP, **PRECISION_CHECK, **ABLATION}  # run name -> (preset, overrides)

# The central-claim study (scale=cpu_long, 30 epochs whose LR phases plateau): Table 1's
# ResNet-18 cells and Figure 2 (b)'s two arms for every seed, then Table 3's Top-K cells.
# The rank-2 run watches its own critical regimes (schedule.detect=true); the two arms put
# rank 1 into exactly the epochs it held critical, or into as many it did not
# (analysis/regime_plan.py), so both send the same floats.
LONG_CORE = CIFAR_PRESETS[:4] + ["fig2/resnet18_high_inside", "fig2/resnet18_high_outside"]
LONG_EXTRA = CIFAR_PRESETS[4:7]
# Then Figure 2 (b)'s control arms (the earliest and random non-critical epochs, as many as
# the inside arm's) and the detector ablation, seed by seed.
LONG_CONTROLS = ["fig2/resnet18_high_earliest", "fig2/resnet18_high_random", *ABLATION]

# Accordion's successors (analysis/layout.py SUCCESSORS), queued after the study's own runs for
# every seed: L-GreCo (r0 = 2, ranks 1..4, alpha 1), L-GreCo + Accordion 2<->1, ACP-SGD rank 2
# and the phase rule tuned to Accordion's average floats; compared with LONG_CORE's Accordion
# and rank-2 runs of the same seeds ("Accordion and its successors", results/tables/successors.md).
LONG_SUCCESSORS = ["successors/resnet18_lgreco", "successors/resnet18_lgreco_accordion",
                   "successors/resnet18_acp_powersgd", "successors/resnet18_acp_accordion",
                   "successors/resnet18_phase_rule"]
FIG2_REFERENCE = "table1/resnet18_powersgd_static_low"
FIG2_ARMS = {"fig2/resnet18_high_inside": "inside", "fig2/resnet18_high_outside": "outside",
             "fig2/resnet18_high_earliest": "earliest", "fig2/resnet18_high_random": "random"}
# What holds torch (ATen), MKL and oneDNN to AVX2 on a CPU that has more: the fp32 study runs so,
# and an AVX512 machine then computes what an AVX2 one does (the golden AVX2 metrics made on a
# real AVX2 machine were reproduced so, bit for bit: tests/test_golden_metrics.py).
AVX2_CAP = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
            "ONEDNN_MAX_CPU_ISA": "AVX2"}
STUDIES = {
    "cpu": {"scale": "cpu", "data_check": "cifar10-sample", "runs": "cpu", "env": {}},
    "cpu_full": {"scale": "cpu_full", "data_check": "cifar10-jpeg-full", "runs": "cpu_full",
                 "env": {}},
    "cpu_long": {"scale": "cpu_long", "data_check": "cifar10-jpeg-full", "runs": "cpu_long",
                 "env": {}},
    "cpu_fp32": {"scale": "cpu_fp32", "data_check": "cifar10-jpeg-full", "runs": "cpu_fp32",
                 "env": AVX2_CAP},
}
# The fp32 study's queue (issue 55), arm by arm, each arm for every seed before the next: the
# rank-2 detect run first (its flags make the plan of the Figure 2 (b) arms of its seed).
FP32_CENTRAL = [FIG2_REFERENCE, "table1/resnet18_powersgd_static_high",
                "fig2/resnet18_high_inside", "fig2/resnet18_high_earliest",
                "fig2/resnet18_high_outside", "fig2/resnet18_high_random",
                "table1/resnet18_powersgd_accordion", "ablation/resnet18_powersgd_no_lr_rule",
                "ablation/resnet18_powersgd_lr_rule_only"]
FP32_SEEDS, FP32_MORE_SEEDS = [42, 43, 44], [45, 46]
# The headline contrasts (analysis/paired.py HEADLINE), by the arms each needs: when one's 95 %
# interval over the first seeds spans zero, its arms run for FP32_MORE_SEEDS too.
FP32_TOPK = CIFAR_PRESETS[4:7]
# schedule=auto at Accordion 2<->1's whole-run floats joins them once its whole-run budget exists
# (issue 59, item 2); the phase rule's table is tuned at cpu_long's width and wants retuning here.
FP32_SUCCESSORS = ["successors/resnet18_lgreco_accordion", "successors/resnet18_acp_powersgd",
                   "successors/resnet18_acp_accordion", "successors/resnet18_phase_rule"]
# Accordion over transport precision (issue 58) after the central-claim arms and the successors,
# with the dense runs its comparison pairs against (results/tables/precision.md).
FP32_PRECISION = ["table1/resnet18_powersgd_dense", "precision/resnet18_accordion_fp32_fp8",
                  "precision/resnet18_accordion_bf16_fp8"]


PLANNED = ("cpu_long", "cpu_fp32")  # the studies whose Figure 2 (b) arms follow a detect run


def run_dir(runs: Path, preset: str, seed: int) -> Path:
    return study_run_dir(runs, preset, seed)


def scale_file(study: str) -> dict:
    """The study's conf/scale/<scale>.yaml, as written."""
    return yaml.safe_load((CONF_DIR / "scale" / f"{STUDIES[study]['scale']}.yaml").read_text())


def lr_rule_windows(study: str) -> str:
    """The LR-decay rule alone's rank-2 epochs at a scale: its fig2_windows (the first detector
    interval and the epoch after each decay), as a schedule.windows override value."""
    windows = scale_file(study)["scale"]["fig2_windows"]
    return "[" + ",".join(f"[{a},{b}]" for a, b in windows) + "]"


def fig2_plan(runs: Path, seed: int):
    """Figure 2 (b)'s data-driven arms for one seed, from its rank-2 detect run; the plan is
    kept beside the runs (<runs>/fig2/plan_seed<seed>.json). None until that run has finished."""
    from accordion_repro.analysis.regime_plan import plan_from_run, write_plan

    reference = run_dir(runs, FIG2_REFERENCE, seed)
    if not completed(reference):
        return None
    plan = plan_from_run(reference)
    write_plan(plan, runs / "fig2" / f"plan_seed{seed}.json", relative_to=runs)
    return plan


def command(preset: str, seed: int, data: Path, out: Path, extra: list[str],
            study: str = "cpu", runs: Path | None = None) -> list[str]:
    if preset.startswith("table3/lstm"):
        dataset = []
    elif study in ("cpu_full", *PLANNED):
        dataset = ["dataset=cifar10_jpeg"]
    else:
        dataset = ["dataset=npz"]
    experiment, variant = VARIANTS.get(preset, (preset, []))
    schedule = []  # the schedule's overrides this study gives this cell
    if study == "cpu_full" and preset in FIG2_WINDOWS:
        schedule = [f"schedule.windows={FIG2_WINDOWS[preset]}", "schedule.inside=1",
                   "schedule.outside=2"]
    if study in PLANNED and preset == FIG2_REFERENCE:
        schedule = ["schedule.detect=true"]
    if preset == LR_RULE_ONLY:
        schedule = [f"schedule.windows={lr_rule_windows(study)}"]
    if study in PLANNED and preset in FIG2_ARMS:
        plan = fig2_plan(runs, seed)
        if plan is None:
            raise PlanNotReady(f"{preset} seed {seed} needs {FIG2_REFERENCE} seed {seed} first")
        schedule = [*plan.overrides(FIG2_ARMS[preset]), "schedule.inside=1", "schedule.outside=2"]
    return [sys.executable, "-m", "accordion_repro.train", f"experiment={experiment}",
            f"scale={STUDIES[study]['scale']}", *dataset, f"paths.data_dir={data}", f"seed={seed}",
            "logger.wandb.mode=disabled", "trainer.progress=never", f"hydra.run.dir={out}",
            *schedule, *variant, *extra]


class PlanNotReady(RuntimeError):
    """A Figure 2 (b) arm whose reference run has not finished."""


def run_order(study: str, seeds: list[int], patterns: list[str],
              runs: Path | None = None) -> list[tuple[str, int]]:
    """(preset, seed) pairs in the order they run: the study's order, or, with several
    patterns, the runs each pattern picks, pattern by pattern (each run once). The fp32
    study's order depends on its finished runs (`runs`): the extra seeds of an undecided
    contrast join it once the first seeds have decided nothing."""
    if study == "cpu_fp32":
        order = fp32_order(seeds, runs)
    elif study == "cpu_long":
        order = [(p, s) for s in seeds for p in LONG_CORE]
        order += [(p, s) for s in seeds for p in LONG_EXTRA]
        order += [(p, s) for s in seeds for p in LONG_CONTROLS]
        order += [(p, s) for s in seeds for p in LONG_SUCCESSORS]
    elif study == "cpu_full":
        order = [(p, s) for s in seeds[:2] for p in FULL_CORE]
        order += [(p, seeds[0]) for p in FULL_EXTRA]
        order += [(p, s) for s in seeds[:2] for p in ETA_SWEEP]
        order += [(p, seeds[0]) for p in PRECISION_CHECK]
        order += [(p, s) for s in seeds[2:] for p in FULL_CORE]
        order += [(p, s) for s in seeds[1:2] for p in FULL_EXTRA]
    else:
        order = []
        for seed in seeds:
            trace = [TRACE_PRESET] if seed == seeds[0] else []
            order += [(p, seed) for p in CIFAR_PRESETS + trace + LSTM_PRESETS]
    picked = []
    for pattern in patterns:
        picked += [(p, s) for p, s in order if fnmatch.fnmatch(p, pattern) and (p, s) not in picked]
    return picked


def fp32_order(seeds: list[int], runs: Path | None) -> list[tuple[str, int]]:
    """The fp32 study's queue: the central arms for the first seeds, arm by arm; the extra seeds
    of the undecided headline contrasts; then Table 3's Top-K cells, the successors and the
    precision arms."""
    order = [(p, s) for p in FP32_CENTRAL for s in seeds]
    more = [s for s in FP32_MORE_SEEDS if s not in seeds]
    extend = undecided_arms(runs, seeds) if more and runs is not None else set()
    order += [(p, s) for p in FP32_CENTRAL if p in extend for s in more]
    order += [(p, s) for p in FP32_TOPK for s in seeds]
    order += [(p, s) for p in FP32_SUCCESSORS + FP32_PRECISION for s in seeds]
    return order


# The presets of the methods the headline contrasts compare (analysis/paired.py HEADLINE).
METHOD_PRESETS = {"high_outside": "fig2/resnet18_high_outside",
                  "high_inside": "fig2/resnet18_high_inside",
                  "high_earliest": "fig2/resnet18_high_earliest",
                  "high_random": "fig2/resnet18_high_random",
                  "accordion": "table1/resnet18_powersgd_accordion",
                  "static_low": FIG2_REFERENCE}


def final_metric(path: Path) -> float:
    return json.loads((path / METRICS).read_text().splitlines()[-1])["test_acc"]


def undecided_arms(runs: Path, seeds: list[int]) -> set[str]:
    """The presets that run again for more seeds: those of every headline contrast whose 95 %
    interval over `seeds` spans zero (with the rank-2 detect run, whose plan the Figure 2 (b)
    arms of a seed need). Empty until every run the contrasts read has finished."""
    from accordion_repro.analysis.paired import HEADLINE
    from accordion_repro.analysis.stats import paired_stats

    needed = {METHOD_PRESETS[m] for pair in HEADLINE for m in pair}
    if not all(completed(run_dir(runs, p, s)) for p in needed for s in seeds):
        return set()
    arms = set()
    for minuend, subtrahend in HEADLINE:
        a, b = METHOD_PRESETS[minuend], METHOD_PRESETS[subtrahend]
        stats = paired_stats([final_metric(run_dir(runs, a, s)) - final_metric(run_dir(runs, b, s))
                              for s in seeds])
        if stats.ci_low is None or stats.ci_low <= 0 <= stats.ci_high:
            arms |= {a, b, FIG2_REFERENCE}
    return arms


def completed(path: Path) -> bool:
    summary = path / SUMMARY
    return summary.exists() and json.loads(summary.read_text()).get("status") == "completed"


def study_env(study: str) -> dict[str, str]:
    """The environment a study's runs get: this one, with the study's instruction-set cap."""
    return {**os.environ, **STUDIES[study]["env"]}


def bf16_refusal(study: str, extra: list[str]) -> str | None:
    """Why this study's runs must not start here, if they are bf16 and this CPU (under the
    study's cap) has no native bf16: emulated bf16 is 8-12x slower than fp32, and an fp32 run
    in its place would be another configuration. None where nothing stands in the way."""
    precision = scale_file(study).get("trainer", {}).get("precision", "fp32")
    for override in extra:
        if override.startswith("trainer.precision="):
            precision = override.split("=", 1)[1]
    if precision != "bf16":
        return None
    probe = subprocess.run(
        [sys.executable, "-c", "from accordion_repro.engine.precision import "
         "cpu_bf16_is_emulated as e; print(int(e()))"],
        env=study_env(study), capture_output=True, text=True, cwd=REPO)
    if probe.stdout.strip() != "1":
        return None
    return (f"the {study} study runs in bf16 and this CPU has no native bf16 (oneDNN reports "
            "none): emulated, a run would take 8-12x as long, and an fp32 run is a different "
            "configuration; run it on a CPU with AVX512-BF16 or AMX, or run --study cpu_fp32")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--study", choices=sorted(STUDIES), default="cpu")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="default: 42 43 44 for cpu_fp32 (then 45 46 where undecided), "
                             "else 42 43")
    parser.add_argument("--data", type=Path,
                        default=Path(os.environ.get("ACCORDION_DATA", REPO / "data")),
                        help="the data folder (docs/data.md); default $ACCORDION_DATA or data/")
    parser.add_argument("--runs", type=Path, default=None,
                        help="where the run directories go (default results/runs/<study>)")
    parser.add_argument("--only", nargs="+", default=["*"], metavar="PATTERN",
                        help="fnmatch patterns on the preset name; several run in the order given")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--commit", action="store_true",
                        help="git-commit each finished run directory (no checkpoints) as it lands")
    parser.add_argument("extra", nargs="*", help="further overrides for every run")
    args = parser.parse_args()
    study = STUDIES[args.study]
    seeds = args.seeds or (FP32_SEEDS if args.study == "cpu_fp32" else [42, 43])
    runs = args.runs or REPO / "results" / "runs" / study["runs"]
    if not args.dry_run and not (args.data / study["data_check"]).exists():
        print(f"error: the real data is not at {args.data / study['data_check']} (docs/data.md "
              f"says where it comes from and how to build it); pass --data", file=sys.stderr)
        return 2
    if not args.dry_run and (why := bf16_refusal(args.study, args.extra)):
        print(f"error: {why}", file=sys.stderr)
        return 2
    if args.dry_run:
        for preset, seed in run_order(args.study, seeds, args.only, runs):
            try:
                argv = command(preset, seed, args.data.resolve(), run_dir(runs, preset, seed),
                               args.extra, args.study, runs)
            except PlanNotReady as why:
                print(f"later: {why}")
                continue
            print("$ " + _shown(argv, study["env"]))
        return 0
    with queue_lock(runs):
        return _run_queue(args, seeds, runs)


def _shown(argv: list[str], env: dict[str, str]) -> str:
    return " ".join([*(f"{k}={v}" for k, v in env.items()), *argv])


def _run_queue(args, seeds: list[int], runs: Path) -> int:
    """Run what the queue holds, one run at a time, until nothing runnable is left. The order
    is computed afresh after each run, as the fp32 study's extension depends on its results."""
    study = STUDIES[args.study]
    start_all = time.perf_counter()
    attempted: set[tuple[str, int]] = set()
    while True:
        pending = []
        for preset, seed in run_order(args.study, seeds, args.only, runs):
            out = run_dir(runs, preset, seed)
            if completed(out) or (preset, seed) in attempted:
                continue
            try:
                argv = command(preset, seed, args.data.resolve(), out, args.extra, args.study,
                               runs)
            except PlanNotReady as why:
                print(f"later: {why}")
                continue
            pending.append((preset, seed, out, argv))
            break
        if not pending:
            break
        preset, seed, out, argv = pending[0]
        attempted.add((preset, seed))
        print("$ " + _shown(argv, study["env"]), flush=True)
        start = time.perf_counter()
        returncode, stopped = run_trainer(argv, study_env(args.study))
        elapsed = add_wall_time(runs, preset, seed, time.perf_counter() - start,
                                finished=returncode == 0)
        if returncode != 0:
            what = (f"stopped after {elapsed / 60:.1f} min in all" if stopped
                    else f"failed (exit {returncode})")
            print(f"{'stopped' if stopped else 'error'}: {preset} seed {seed} {what}; rerun the "
                  "same command to resume", file=sys.stderr)
            return STOPPED if stopped else returncode
        shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
        shutil.rmtree(out / ".hydra", ignore_errors=True)
        log = out / "train.log"  # Hydra's job log, empty: the trainer prints to stdout
        if log.exists() and log.stat().st_size == 0:
            log.unlink()
        print(f"{preset} seed {seed}: {elapsed / 60:.1f} min", flush=True)
        if args.commit:
            commit_run(runs, out, f"{args.study}: {preset} seed {seed} ({elapsed / 60:.1f} min)")
        if stopped:
            return STOPPED
    timings = runs / TIMINGS
    rows = list(csv.DictReader(timings.open())) if timings.exists() else []
    print(f"total: {(time.perf_counter() - start_all) / 60:.1f} min this invocation; "
          f"{sum(float(r['wall_s']) for r in rows) / 60:.1f} min over all timed runs")
    return 0


class queue_lock:
    """One queue per runs folder: <runs>/queue.pid holds the runner's pid while it runs. A
    second runner on the same folder is refused in one line naming the first's pid; a file
    whose process is gone (a killed machine) is taken over."""

    def __init__(self, runs: Path):
        self.path = runs / "queue.pid"

    def __enter__(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        holder = queue_holder(self.path.parent)
        if holder is not None and holder != os.getpid():
            raise SystemExit(f"error: a queue already runs on {self.path.parent} (pid {holder}); "
                             "stop it (kill -TERM, it resumes) or wait for it")
        self.path.write_text(f"{os.getpid()}\n")
        return self

    def __exit__(self, *exc):
        if queue_holder(self.path.parent) == os.getpid():
            self.path.unlink(missing_ok=True)


def queue_holder(runs: Path) -> int | None:
    """The pid of the live runner of this runs folder, if any."""
    try:
        pid = int((runs / "queue.pid").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return pid


def commit_run(runs: Path, out: Path, message: str) -> None:
    """Commit one finished run directory, the study's timings and plans, and the tables and
    figures rebuilt with it (`make figures`: the committed tables always hold every committed
    run), nothing else: `git commit --only` leaves whatever else is staged alone. A busy index
    (another git command at the same moment) is retried; a commit that still fails is
    reported, and the queue goes on."""
    import warnings

    from accordion_repro.analysis import build_all

    results = REPO / "results"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # missing cells and unfinished runs are expected
        try:
            build_all(results / "runs", results, net="10gbit")
        except Exception as exc:  # the run is committed all the same; the tables say why not
            print(f"warning: make figures failed ({type(exc).__name__}: {exc})", file=sys.stderr)
    paths = [str(p.relative_to(REPO)) for p in (out, runs / TIMINGS, runs / "fig2",
                                                 results / "tables", results / "figures")
             if p.exists()]
    for attempt in range(10):
        added = subprocess.run(["git", "add", "--", *paths], cwd=REPO, capture_output=True,
                               text=True)
        done = added.returncode == 0 and subprocess.run(
            ["git", "commit", "--quiet", "--only", "-m", message, "--", *paths], cwd=REPO,
            capture_output=True, text=True).returncode == 0
        if done:
            return
        time.sleep(3 + attempt)
    print(f"warning: could not commit {out} (git busy or not a repository); commit it by hand",
          file=sys.stderr)


def run_trainer(argv: list[str], env: dict[str, str] | None = None) -> tuple[int, bool]:
    """Run one training command: (its exit code, whether this runner was told to stop).

    A SIGTERM or SIGINT to the runner is passed on to the trainer, which stops cleanly at its
    next step (resumable); the runner then still records the attempt's seconds. Were the runner
    to die alone, the trainer would train on unwatched and the attempt's time would be lost.
    """
    from accordion_repro.launch import STOP_SIGNALS

    child = subprocess.Popen(argv, cwd=REPO, env=env)
    stopped = []

    def forward(signum, frame):
        stopped.append(signum)
        child.send_signal(signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in STOP_SIGNALS}
    try:
        return child.wait(), bool(stopped)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def add_wall_time(runs: Path, preset: str, seed: int, seconds: float, *, finished: bool) -> float:
    """Add one attempt's wall time to its run's; the run's total so far.

    An interrupted attempt's seconds wait in <runs>/timings_partial.json (not a result) until
    the attempt that finishes the run: its row of <runs>/timings.csv is then the whole run's
    wall time, every attempt included, not only the last one's.
    """
    partial_file, key = runs / "timings_partial.json", f"{preset} seed {seed}"
    partial = json.loads(partial_file.read_text()) if partial_file.exists() else {}
    total = partial.pop(key, 0.0) + seconds
    if not finished:
        partial[key] = total
    runs.mkdir(parents=True, exist_ok=True)
    if partial:
        partial_file.write_text(json.dumps(partial, indent=1, sort_keys=True) + "\n")
    else:
        partial_file.unlink(missing_ok=True)
    if finished:
        timings = runs / TIMINGS
        rows = list(csv.DictReader(timings.open())) if timings.exists() else []
        rows = [r for r in rows if not (r["preset"] == preset and int(r["seed"]) == seed)]
        rows.append({"preset": preset, "seed": seed, "wall_s": f"{total:.1f}"})
        with timings.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=["preset", "seed", "wall_s"])
            writer.writeheader()
            writer.writerows(rows)
    return total


if __name__ == "__main__":
    sys.exit(main())
