"""The CLI audit: bad inputs refused in one line, killed runs resumed to identical metrics.

Issue 56's audit ran 157 bad inputs and 30 kills against the CLI with real processes, but its
inputs were never committed, so its totals could not be rerun. This is a committed battery of
our own, modelled on the issue's description (not those 157 inputs), that anyone can rerun:

- BAD_INPUTS: command lines the CLI must refuse (exit 2, stderr exactly one non-empty line
  `error: <the offending key>: ...`, nothing left in the run directory but Hydra's empty job log
  and an empty `.hydra/`, docs/run_directory.md), in every config group: unknown names and keys,
  out-of-range values, wrong types, missing data, an unwritable run directory, plugins that do
  not import, combinations a strategy cannot run; and a few that look odd but are valid, each
  with the doc line that says so (a quote from docs/*.md), which must train.
- KILLS: 2-rank tiny runs killed at a moment (start-up, mid-epoch, between epochs, after the
  last epoch) by a signal (SIGTERM or SIGINT to the launcher, SIGKILL to the launcher alone, to
  rank 0, to rank 1, to the whole process group), under ddp and fsdp, schedule=accordion, auto,
  lgreco and compressor=topk. Every process of the job must be gone within 5 s of the kill (of
  the launcher's exit where the launcher lives on to end its job); the same command is rerun to
  completion (taking over a stale lock with a note) and its metrics.jsonl compared with an
  uninterrupted run of the same config (accordion_repro.compare_runs.first_difference: every
  value to the last digit, wall-clock times aside). Moments are reached by waiting for what the
  run shows (its ranks, a metrics line), never by a bare sleep; a mid-epoch kill waits half the
  epoch the previous line timed.

Writes results/bench/cli_audit.csv (one row per case) and prints the totals.

    python scripts/bench_cli_audit.py [--only bad|kills] [--cases ID ...] [--keep]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from accordion_repro.compare_runs import first_difference
from accordion_repro.run_layout import (CHECKPOINTS, LOCK, METRICS, PROJECT_ROOT, RESOLVED,
                                        SUMMARY)
from .harness import write_csv

REPO = PROJECT_ROOT
CLI = [sys.executable, "-m", "accordion_repro.train"]
QUIET = ["logger.wandb.mode=disabled", "trainer.progress=never"]
# a bad input is tried on a valid one-step run, so a value wrongly accepted costs seconds
BASE = ["model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10",
        "dataset.train_size=64", "dataset.test_size=16", *QUIET, "trainer.batch_size=8",
        "trainer.eval_batch_size=16", "trainer.epochs=1", "trainer.max_steps_per_epoch=1",
        "trainer.max_eval_steps=1"]
# a killed run: 2 ranks, 4 epochs of 128 steps (a few seconds each on 2 cores)
TINY = ["model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10",
        "dataset.train_size=2048", "dataset.test_size=16", *QUIET, "trainer.batch_size=8",
        "trainer.eval_batch_size=16", "trainer.max_steps_per_epoch=128",
        "trainer.max_eval_steps=1", "dist.nproc_per_node=2", "compressor=powersgd",
        "schedule=accordion", "schedule.interval=1", "trainer.epochs=4"]
EPOCHS = 4
# what a refused job may leave in its run directory: Hydra's job log (empty) and .hydra/, whose
# pending-<pid> folder the CLI removes (docs/run_directory.md, "One config per run")
LEFT_BY_A_REFUSAL = {"train.log", ".hydra"}
NOT_WRITTEN_BY_A_REFUSAL = (METRICS, CHECKPOINTS, SUMMARY, RESOLVED, LOCK)


@dataclasses.dataclass(frozen=True)
class BadInput:
    """A command line the CLI refuses naming `key`, or (with `doc`) accepts by design."""
    id: str
    overrides: str  # on top of BASE; {empty} is an empty folder, {file} a file that is no .npz
    key: str = ""
    doc: str = ""  # accepted by design: a line of docs/*.md (a quote) that says so

    kind = "bad input"

    @property
    def expected(self) -> str:
        return "accepted by design" if self.doc else "refused"


@dataclasses.dataclass(frozen=True)
class Kill:
    """A 2-rank run of CONFIGS[config] killed by `signal` sent to `target` at `moment`."""
    id: str
    config: str
    target: str  # launcher, rank0, rank1, group
    signal: str  # SIGTERM, SIGINT, SIGKILL; SIGTERMx2: two SIGTERMs 0.5 s apart
    moment: str  # startup, ranks_up, mid, between, last

    kind = "kill"
    expected = "resumed identically"

    @property
    def overrides(self) -> str:
        return " ".join(CONFIGS[self.config])


def _bad(spec: str) -> list[BadInput]:
    """One BadInput per line: `id | overrides | key`."""
    cases = []
    for line in spec.strip().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            id_, overrides, key = (part.strip() for part in line.split("|"))
            cases.append(BadInput(id_, overrides, key))
    return cases


PSGD = "compressor=powersgd"
ACC = "compressor=powersgd schedule=accordion"
TOPK_ACC = "compressor=topk schedule=accordion schedule.low=0.5 schedule.high=0.1"
AUTO = "compressor=powersgd schedule=auto"
LGRECO = "compressor=powersgd schedule=lgreco"
BATCH = "schedule=batch_accordion"
JOINT = "compressor=powersgd schedule=joint"
WINDOWS = "compressor=powersgd schedule=regime_windows"
PHASE = "compressor=powersgd schedule=phase_rule trainer.epochs=4"  # boundaries inside the run
STATIC_DETECT = "compressor=powersgd schedule=static schedule.detect=true"
LSTM = ("model=lstm model.num_layers=1 model.hidden_size=16 model.embedding_size=16 "
        "optim=lstm dataset=synthetic_text dataset.vocab_size=50 dataset.train_tokens=4000 "
        "dataset.eval_tokens=400 dataset.bptt=10")

REFUSED = _bad(f"""
# unknown names: a config group's option, or a settings class's name
model-unknown            | model=resnet99                                  | model
model-typo               | model=resnet-18                                 | model
dataset-unknown          | dataset=imagenet                                | dataset
dataset-typo             | dataset=cifar_10                                | dataset
compressor-unknown       | compressor=qsgd                                 | compressor
compressor-typo          | compressor=power_sgd                            | compressor
schedule-unknown         | schedule=adaptive                               | schedule
schedule-typo            | schedule=accordian                              | schedule
optim-unknown            | optim=adam                                      | optim
experiment-unknown       | experiment=table7/resnet18_powersgd_accordion   | experiment
experiment-typo          | experiment=table1/resnet18_powersgd_acordion    | experiment
scale-unknown            | scale=huge                                      | scale
trainer-group-unknown    | trainer=fast                                    | trainer
dist-group-unknown       | dist=mpi                                        | dist
logger-group-unknown     | logger=tensorboard                              | logger
paths-group-unknown      | paths=cluster                                   | paths
model-name               | model.name=resnet99                             | model.name
dataset-name             | dataset.name=imagenet                           | dataset.name
optim-name               | optim.name=adam                                 | optim.name
compressor-name          | {PSGD} compressor.name=qsgd                     | compressor.name
schedule-name            | schedule.name=adaptive                          | schedule.name
# unknown keys, with and without + and ++
trainer-epoch-plus       | +trainer.epoch=5                                | trainer.epoch
trainer-epoch-plusplus   | ++trainer.epoch=5                               | trainer.epoch
trainer-epoch-bare       | trainer.epoch=5                                 | trainer.epoch
optim-key                | +optim.learning_rate=0.1                        | optim.learning_rate
optim-key-bare           | optim.learning_rate=0.1                         | optim.learning_rate
dist-key                 | +dist.nprocs=2                                  | dist.nprocs
model-key                | +model.depth=18                                 | model.depth
model-key-of-another     | model.hidden_size=16                            | model.hidden_size
dataset-key              | +dataset.agument=false                          | dataset.agument
dataset-root-under-npz   | dataset=npz dataset.root=/elsewhere             | dataset.root
dataset-key-of-another   | dataset.vocab_size=50                           | dataset.vocab_size
compressor-key           | {PSGD} +compressor.rnk=2                        | compressor.rnk
compressor-rank-of-none  | compressor=none compressor.rank=2               | compressor.rank
compressor-ratio-psgd    | {PSGD} compressor.ratio=0.1                     | compressor.ratio
schedule-key             | {ACC} +schedule.etaa=0.3                        | schedule.etaa
schedule-low-of-static   | {PSGD} schedule.low=2                           | schedule.low
schedule-interval-lgreco | {LGRECO} schedule.interval=1                    | schedule.interval
logger-key               | +logger.wandb.name=x                            | logger.wandb.name
logger-key-top           | +logger.tensorboard=true                        | logger.tensorboard
run-key                  | +run.nme=x                                      | run.nme
paths-key                | +paths.tmp_dir=/tmp                             | paths.tmp_dir
scale-key                | +scale.speed=2                                  | scale.speed
top-key                  | +no_such_key=5                                  | no_such_key
top-key-bare             | no_such_key=5                                   | no_such_key
top-seed-typo            | +sead=3                                         | sead
# out-of-range values: the compressor
psgd-rank-0              | {PSGD} compressor.rank=0                        | compressor.rank
psgd-rank-negative       | {PSGD} compressor.rank=-1                       | compressor.rank
psgd-rank-null           | {PSGD} compressor.rank=null                     | compressor.rank
acp-rank-0               | compressor=acp_powersgd compressor.rank=0       | compressor.rank
topk-ratio-0             | compressor=topk compressor.ratio=0              | compressor.ratio
topk-ratio-above-1       | compressor=topk compressor.ratio=1.5            | compressor.ratio
topk-ratio-negative      | compressor=topk compressor.ratio=-0.1           | compressor.ratio
psgd-rank-under-accordion| {ACC} compressor.rank=4                         | compressor.rank
topk-ratio-under-windows | compressor=topk schedule=regime_windows schedule.inside=0.5 schedule.outside=0.1 compressor.ratio=0.5 | compressor.ratio
# the detector's options
accordion-eta-0          | {ACC} schedule.eta=0                            | schedule.eta
accordion-eta-negative   | {ACC} schedule.eta=-0.5                         | schedule.eta
accordion-interval-0     | {ACC} schedule.interval=0                       | schedule.interval
accordion-interval-neg   | {ACC} schedule.interval=-2                      | schedule.interval
accordion-statistic      | {ACC} schedule.statistic=median                 | schedule.statistic
accordion-lr-decay-rule  | {ACC} schedule.lr_decay_rule=maybe              | schedule.lr_decay_rule
accordion-low-0          | {ACC} schedule.low=0                            | schedule.low
accordion-high-0         | {ACC} schedule.high=0                           | schedule.high
accordion-high-negative  | {ACC} schedule.high=-1                          | schedule.high
accordion-low-fraction   | {ACC} schedule.low=0.5                          | schedule.low
topk-accordion-low-above1| {TOPK_ACC} schedule.low=1.5                     | schedule.low
topk-accordion-high-0    | {TOPK_ACC} schedule.high=0                      | schedule.high
static-detect-maybe      | {PSGD} schedule.detect=maybe                    | schedule.detect
static-detect-eta-0      | {STATIC_DETECT} schedule.eta=0                  | schedule.eta
static-detect-interval-0 | {STATIC_DETECT} schedule.interval=0             | schedule.interval
# batch schedules: B_high < B_low and friends
batch-high-below-low     | {BATCH} schedule.low=64 schedule.high=32        | schedule.high
batch-low-0              | {BATCH} schedule.low=0 schedule.high=64         | schedule.low
batch-low-negative       | {BATCH} schedule.low=-16 schedule.high=64       | schedule.low
batch-decision           | {BATCH} schedule.low=16 schedule.high=64 schedule.decision=vote | schedule.decision
batch-lr-scaling         | {BATCH} schedule.low=16 schedule.high=64 schedule.lr_scaling=cube | schedule.lr_scaling
batch-mode               | {BATCH} schedule.low=16 schedule.high=64 schedule.mode=random | schedule.mode
batch-switch-negative    | {BATCH} schedule.low=16 schedule.high=64 schedule.mode=fixed_epoch schedule.switch_epoch=-1 | schedule.switch_epoch
batch-eta-0              | {BATCH} schedule.low=16 schedule.high=64 schedule.eta=0 | schedule.eta
joint-batch-high-below   | {JOINT} schedule.batch_low=64 schedule.batch_high=32 | schedule.batch_high
joint-low-0              | {JOINT} schedule.low=0 schedule.batch_low=16 schedule.batch_high=64 | schedule.low
# regime windows
windows-reversed         | {WINDOWS} schedule.windows=[[2,1]]              | schedule.windows
windows-negative         | {WINDOWS} schedule.windows=[[-1,1]]             | schedule.windows
windows-one-end          | {WINDOWS} schedule.windows=[[0]]                | schedule.windows
windows-not-a-list       | {WINDOWS} schedule.windows=5                    | schedule.windows
windows-beyond-run       | {WINDOWS} schedule.windows=[[5,9]]              | schedule.windows
windows-unparsed         | {WINDOWS} schedule.windows=[[0,1]               | schedule.windows
windows-inside-0         | {WINDOWS} schedule.windows=[[0,1]] schedule.inside=0 | schedule.inside
windows-outside-negative | {WINDOWS} schedule.windows=[[0,1]] schedule.outside=-1 | schedule.outside
# phase rule
phase-boundary-after-run | {PHASE} schedule.boundaries=[5] schedule.splits=[] schedule.levels=[[2],[1]] trainer.epochs=3 | schedule.boundaries[0]
phase-boundaries-down    | {PHASE} schedule.boundaries=[0.7,0.3] schedule.splits=[] schedule.levels=[[2],[1],[1]] | schedule.boundaries
phase-levels-rows        | {PHASE} schedule.boundaries=[0.5] schedule.splits=[] schedule.levels=[[2]] | schedule.levels
phase-levels-columns     | {PHASE} schedule.boundaries=[0.5] schedule.splits=[10000] schedule.levels=[[2],[1]] | schedule.levels
phase-level-0            | {PHASE} schedule.boundaries=[0.5] schedule.splits=[] schedule.levels=[[0],[1]] | schedule.levels
phase-splits-down        | {PHASE} schedule.boundaries=[0.5] schedule.splits=[1000,10] schedule.levels=[[2,2,2],[1,1,1]] | schedule.splits
phase-boundary-negative  | {PHASE} schedule.boundaries=[-1] schedule.splits=[] schedule.levels=[[2],[1]] | schedule.boundaries
# schedule=auto
auto-budget-tiny         | {AUTO} schedule.budget=1e-9                     | schedule.budget
auto-budget-0            | {AUTO} schedule.budget=0                        | schedule.budget
auto-budget-above-1      | {AUTO} schedule.budget=1.5                      | schedule.budget
auto-step-time-tiny      | {AUTO} schedule.step_time=1e-9 schedule.link_bps=1e8 dist.nproc_per_node=2 | schedule.step_time
auto-step-time-no-link   | {AUTO} schedule.step_time=0.1                   | schedule.link_bps
auto-link-negative       | {AUTO} schedule.step_time=0.1 schedule.link_bps=-1 | schedule.link_bps
auto-latency-negative    | {AUTO} schedule.step_time=0.1 schedule.link_bps=1e8 schedule.latency_s=-1 | schedule.latency_s
auto-error-low-0         | {AUTO} schedule.error_low=0                     | schedule.error_low
auto-error-low-above-1   | {AUTO} schedule.error_low=1.5                   | schedule.error_low
auto-error-high-below    | {AUTO} schedule.error_low=0.5 schedule.error_high=0.3 | schedule.error_high
auto-max-rank-0          | {AUTO} schedule.max_rank=0                      | schedule.max_rank
auto-low-share-above-1   | {AUTO} schedule.low_share=1.5                   | schedule.low_share
auto-noise-z-negative    | {AUTO} schedule.noise_z=-1                      | schedule.noise_z
auto-eta-0               | {AUTO} schedule.eta=0                           | schedule.eta
auto-bins-0              | {AUTO} schedule.bins=0                          | schedule.bins
auto-min-fraction-0      | compressor=topk schedule=auto schedule.min_fraction=0 | schedule.min_fraction
# L-GreCo
lgreco-alpha-tiny        | {LGRECO} schedule.alpha=0.001                   | schedule.alpha
lgreco-alpha-0           | {LGRECO} schedule.alpha=0                       | schedule.alpha
lgreco-r0-0              | {LGRECO} schedule.r0=0                          | schedule.r0
lgreco-gamma-0           | {LGRECO} schedule.gamma=0                       | schedule.gamma
lgreco-beta-below-1      | {LGRECO} schedule.beta=0.5                      | schedule.beta
lgreco-bins-0            | {LGRECO} schedule.bins=0                        | schedule.bins
lgreco-no-plan           | {LGRECO} schedule.no_plan=maybe                 | schedule.no_plan
lgreco-topk              | compressor=topk schedule=lgreco                 | schedule
lgreco-accordion-alpha-0 | compressor=powersgd schedule=lgreco_accordion schedule.alpha=0 | schedule.alpha
# the trainer
epochs-0                 | trainer.epochs=0                                | trainer.epochs
epochs-negative          | trainer.epochs=-3                               | trainer.epochs
epochs-string            | trainer.epochs=three                            | trainer.epochs
epochs-float             | trainer.epochs=2.5                              | trainer.epochs
epochs-list              | trainer.epochs=[3]                              | trainer.epochs
batch-0                  | trainer.batch_size=0                            | trainer.batch_size
batch-negative           | trainer.batch_size=-8                           | trainer.batch_size
batch-float              | trainer.batch_size=8.5                          | trainer.batch_size
eval-batch-0             | trainer.eval_batch_size=0                       | trainer.eval_batch_size
max-steps-0              | trainer.max_steps_per_epoch=0                   | trainer.max_steps_per_epoch
max-steps-negative       | trainer.max_steps_per_epoch=-1                  | trainer.max_steps_per_epoch
max-eval-steps-0         | trainer.max_eval_steps=0                        | trainer.max_eval_steps
max-micro-batch-0        | trainer.max_micro_batch=0                       | trainer.max_micro_batch
stop-after-negative      | trainer.stop_after_epoch=-1                     | trainer.stop_after_epoch
resume-maybe             | trainer.resume=maybe                            | trainer.resume
device-tpu               | trainer.device=tpu                              | trainer.device
progress-sometimes       | trainer.progress=sometimes                      | trainer.progress
nan-policy               | trainer.nan_policy=ignore                       | trainer.nan_policy
num-workers-negative     | trainer.num_workers=-1                          | trainer.num_workers
num-workers-string       | trainer.num_workers=many                        | trainer.num_workers
checkpoint-maybe         | trainer.checkpoint=maybe                        | trainer.checkpoint
precision-fp8            | trainer.precision=fp8                           | trainer.precision
allow-change-perhaps     | trainer.allow_config_change=perhaps             | trainer.allow_config_change
reshuffle-2              | trainer.reshuffle_each_epoch=2                  | trainer.reshuffle_each_epoch
channels-last-yes-no     | trainer.channels_last=sometimes                 | trainer.channels_last
# the optimiser
lr-0                     | optim.lr=0                                      | optim.lr
lr-negative              | optim.lr=-0.1                                   | optim.lr
lr-string                | optim.lr=fast                                   | optim.lr
lr-list                  | optim.lr=[0.1]                                  | optim.lr
momentum-1               | optim.momentum=1.0                              | optim.momentum
momentum-negative        | optim.momentum=-0.1                             | optim.momentum
weight-decay-negative    | optim.weight_decay=-1e-4                        | optim.weight_decay
warmup-negative          | optim.warmup_epochs=-1                          | optim.warmup_epochs
decay-factor-0           | optim.decay_factor=0                            | optim.decay_factor
decay-factor-negative    | optim.decay_factor=-0.1                         | optim.decay_factor
decay-at-after-run       | optim.decay_at=[10]                             | optim.decay_at
decay-at-negative        | optim.decay_at=[-1]                             | optim.decay_at
decay-at-string          | optim.decay_at=[soon]                           | optim.decay_at
reference-batch-0        | optim.reference_batch=0                         | optim.reference_batch
clip-0                   | optim.clip_grad_norm=0                          | optim.clip_grad_norm
clip-negative            | optim.clip_grad_norm=-1                         | optim.clip_grad_norm
clip-point               | optim.clip_point=global                         | optim.clip_point
nesterov-sometimes       | optim.nesterov=sometimes                        | optim.nesterov
off-by-one-maybe         | optim.official_off_by_one=maybe                 | optim.official_off_by_one
decay-compare-symbol     | optim.official_decay_compare=[">>"]             | optim.official_decay_compare
# the launcher
nproc-0                  | dist.nproc_per_node=0                           | dist.nproc_per_node
nproc-negative           | dist.nproc_per_node=-1                          | dist.nproc_per_node
nproc-string             | dist.nproc_per_node=two                         | dist.nproc_per_node
timeout-negative         | dist.timeout_s=-5                               | dist.timeout_s
timeout-0                | dist.timeout_s=0                                | dist.timeout_s
strategy-unknown         | dist.strategy=zero3                             | dist.strategy
backend-unknown          | dist.backend=mpi                                | dist.backend
launcher-unknown         | dist.launcher=mpi                               | dist.launcher
fsdp-one-rank            | dist.strategy=fsdp                              | dist.strategy
fsdp-fp16                | dist.strategy=fsdp dist.nproc_per_node=2 trainer.precision=fp16 | trainer.precision
# the model
width-0                  | model.width=0                                   | model.width
width-negative           | model.width=-1                                  | model.width
width-list               | model.width=[1]                                 | model.width
senet-stage4-0           | model=senet18 model.stage4_channels=0           | model.stage4_channels
lstm-layers-0            | {LSTM} model.num_layers=0                       | model.num_layers
lstm-dropout-above-1     | {LSTM} model.dropout=1.5                        | model.dropout
lstm-hidden-0            | {LSTM} model.hidden_size=0                      | model.hidden_size
lstm-tied-sizes          | {LSTM} model.embedding_size=8                   | model.tied
# the dataset
train-size-0             | dataset.train_size=0                            | dataset.train_size
test-size-0              | dataset.test_size=0                             | dataset.test_size
num-classes-0            | dataset.num_classes=0                           | dataset.num_classes
noise-negative           | dataset.noise=-1                                | dataset.noise
subset-0                 | dataset.subset=0                                | dataset.subset
subset-negative          | dataset.subset=-5                               | dataset.subset
subset-above-1-float     | dataset.subset=1.5                              | dataset.subset
subset-above-size        | dataset.subset=1000                             | dataset.subset
rotation-negative        | dataset.rotation_degrees=-5                     | dataset.rotation_degrees
pipeline-gpu             | dataset.pipeline=gpu                            | dataset.pipeline
augment-maybe            | dataset.augment=maybe                           | dataset.augment
mean-short               | dataset.mean=[0.5]                              | dataset.mean
std-zero                 | dataset.std=[0,0,0]                             | dataset.std
text-vocab-0             | {LSTM} dataset.vocab_size=0                     | dataset.vocab_size
text-bptt-0              | {LSTM} dataset.bptt=0                           | dataset.bptt
text-tokens-0            | {LSTM} dataset.train_tokens=0                   | dataset.train_tokens
# missing or bad data
npz-missing              | dataset=npz dataset.path=/nonexistent/x.npz     | /nonexistent/x.npz
npz-not-an-npz           | dataset=npz dataset.path={{file}}                 | {{file}}
cifar10-empty-dir        | dataset=cifar10 paths.data_dir={{empty}}          | {{empty}}
cifar100-empty-dir       | dataset=cifar100 paths.data_dir={{empty}}         | {{empty}}
cifar10-root-empty       | dataset=cifar10 dataset.root={{empty}}            | {{empty}}
wikitext2-empty-dir      | model=lstm optim=lstm dataset=wikitext2 paths.data_dir={{empty}} | {{empty}}
# the run directory, plugins, the command line, the logger, the seed
run-dir-unwritable       | hydra.run.dir=/dev/null/run                     | hydra.run.dir
runs-dir-unwritable      | paths.runs_dir=/dev/null/runs                   | paths.runs_dir
plugin-missing           | plugins=[no_such_plugin_module]                 | plugins
plugin-missing-bare      | plugins=no_such_plugin_module                   | plugins
plugin-submodule         | plugins=[accordion_repro.no_such_module]        | plugins
unparsed-decay-at        | optim.decay_at=[1,                              | optim.decay_at
unparsed-empty-value     | trainer.epochs=                                 | trainer.epochs
wandb-mode               | logger.wandb.mode=public                        | logger.wandb.mode
wandb-tags               | logger.wandb.tags=oops                          | logger.wandb.tags
wandb-project-empty      | logger.wandb.project=''                         | logger.wandb.project
seed-negative            | seed=-1 {PSGD}                                  | seed
seed-string              | seed=abc                                        | seed
seed-float               | seed=1.5                                        | seed
compressor-seed-negative | {PSGD} compressor.seed=-1                       | compressor.seed
# combinations no rank can run
accordion-no-compressor  | compressor=none schedule=accordion              | schedule
auto-no-compressor       | compressor=none schedule=auto                   | schedule
windows-no-compressor    | compressor=none schedule=regime_windows schedule.windows=[[0,1]] | schedule
lstm-images              | model=lstm optim=lstm                           | dataset
resnet-text              | dataset=synthetic_text dataset.vocab_size=50    | dataset
""")

ACCEPTED = [
    BadInput("topk-ratio-1", "compressor=topk compressor.ratio=1.0",
             doc="Top-K: the fraction of each layer's entries kept, in (0, 1]"),
    BadInput("momentum-0", "optim.momentum=0", doc="momentum, in [0, 1)"),
    BadInput("subset-whole-fraction", "dataset.subset=1.0",
             doc="null, a fraction in (0, 1] or a count of training images"),
    BadInput("auto-noise-z-0", f"{AUTO} schedule.noise_z=0",
             doc="eta is floored at noise_z x the measured noise of the norm ratio (0: no floor)"),
    BadInput("max-steps-null", "trainer.max_steps_per_epoch=null dataset.train_size=16",
             doc="cap on the training steps of an epoch (null: the whole epoch)"),
    BadInput("resume-never-on-empty", "trainer.resume=never",
             doc="auto: continue the run in the directory from its checkpoint; never: move it "
                 "aside and start afresh"),
    BadInput("decay-at-fraction", "optim.decay_at=[0.5]",
             doc="decay epochs, or fractions of the run (rounded to an epoch)"),
    BadInput("stop-after-last-epoch", "trainer.stop_after_epoch=5",
             doc="stop cleanly after this epoch, resumable (null: run every epoch)"),
]

BAD_INPUTS: list[BadInput] = [*REFUSED, *ACCEPTED]

CONFIGS = {
    "ddp-accordion": TINY,
    "fsdp-accordion": [*TINY, "dist.strategy=fsdp"],
    "ddp-auto": [o for o in TINY if o != "schedule=accordion"] + ["schedule=auto"],
    "ddp-lgreco": [o for o in TINY if o not in ("schedule=accordion", "schedule.interval=1")]
    + ["schedule=lgreco"],
    "ddp-topk": [o for o in TINY if o != "compressor=powersgd"]
    + ["compressor=topk", "schedule.low=0.5", "schedule.high=0.1"],
}

KILLS = [Kill(f"{config}-{target}-{sig.lower()}-{moment}", config, target, sig, moment)
         for config, target, sig, moment in [
    ("ddp-accordion", "launcher", "SIGTERM", "startup"),
    ("ddp-accordion", "launcher", "SIGTERM", "mid"),
    ("ddp-accordion", "launcher", "SIGTERM", "between"),
    ("ddp-accordion", "launcher", "SIGTERMx2", "mid"),
    ("ddp-accordion", "launcher", "SIGTERM", "last"),
    ("ddp-accordion", "launcher", "SIGINT", "startup"),
    ("ddp-accordion", "launcher", "SIGINT", "mid"),
    ("ddp-accordion", "launcher", "SIGKILL", "startup"),
    ("ddp-accordion", "launcher", "SIGKILL", "ranks_up"),
    ("ddp-accordion", "launcher", "SIGKILL", "mid"),
    ("ddp-accordion", "launcher", "SIGKILL", "between"),
    ("ddp-accordion", "rank0", "SIGKILL", "ranks_up"),
    ("ddp-accordion", "rank0", "SIGKILL", "mid"),
    ("ddp-accordion", "rank1", "SIGKILL", "mid"),
    ("ddp-accordion", "rank1", "SIGKILL", "between"),
    ("ddp-accordion", "group", "SIGKILL", "startup"),
    ("ddp-accordion", "group", "SIGKILL", "mid"),
    ("ddp-accordion", "group", "SIGKILL", "between"),
    ("fsdp-accordion", "launcher", "SIGTERM", "mid"),
    ("fsdp-accordion", "launcher", "SIGKILL", "mid"),
    ("fsdp-accordion", "rank1", "SIGKILL", "mid"),
    ("fsdp-accordion", "group", "SIGKILL", "between"),
    ("ddp-auto", "launcher", "SIGTERM", "mid"),
    ("ddp-auto", "rank0", "SIGKILL", "mid"),
    ("ddp-auto", "group", "SIGKILL", "between"),
    ("ddp-lgreco", "launcher", "SIGTERM", "mid"),
    ("ddp-lgreco", "launcher", "SIGKILL", "mid"),
    ("ddp-lgreco", "rank1", "SIGKILL", "between"),
    ("ddp-topk", "launcher", "SIGINT", "mid"),
    ("ddp-topk", "rank0", "SIGKILL", "between"),
    ("ddp-topk", "group", "SIGKILL", "mid"),
]]

ALL_CASES = [*BAD_INPUTS, *KILLS]


# ---- running one case -------------------------------------------------------------------------
def _merge(base: list[str], overrides: list[str]) -> list[str]:
    """`base` with each override replacing the base's value of its key; choosing another model
    or dataset drops the base's options of that group."""
    last = {o.lstrip("+~").partition("=")[0]: o for o in overrides}
    overrides = [o for o in overrides if last[o.lstrip("+~").partition("=")[0]] is o]
    keys = set(last)
    groups = {k for k in keys if k in ("model", "dataset")}
    kept = [o for o in base if o.lstrip("+~").partition("=")[0] not in keys
            and o.partition(".")[0] not in groups]
    return kept + overrides


def _fill(text: str, work: Path) -> str:
    return text.replace("{empty}", str(work / "empty")).replace("{file}", str(work / "not.npz"))


def _nonempty_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def run_bad_input(case: BadInput, work: Path) -> dict:
    (work / "empty").mkdir(parents=True, exist_ok=True)
    (work / "not.npz").write_text("not an npz archive\n")
    overrides = [_fill(o, work) for o in case.overrides.split()]
    run_dir = work / "run"
    if not any(o.startswith("hydra.run.dir=") for o in overrides):
        overrides.append(f"hydra.run.dir={run_dir}")
    argv = [*CLI, *_merge(BASE, overrides)]
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - start
    lines = _nonempty_lines(done.stderr)
    if case.doc:
        if done.returncode != 0:
            outcome = f"FAILED: exit {done.returncode}: {' / '.join(lines)[-300:]}"
        elif not (run_dir / METRICS).is_file():
            outcome = "FAILED: exit 0 but no metrics.jsonl"
        else:
            outcome = "accepted by design"
        detail = f"doc: {case.doc}"
    else:
        key = _fill(case.key, work)
        left = sorted(p.name for p in run_dir.iterdir()) if run_dir.is_dir() else []
        written = [name for name in NOT_WRITTEN_BY_A_REFUSAL if name in left]
        hydra = run_dir / ".hydra"
        extra = [n for n in left if n not in LEFT_BY_A_REFUSAL]
        if hydra.is_dir() and any(hydra.iterdir()):
            extra.append(".hydra/" + ",".join(sorted(p.name for p in hydra.iterdir())))
        problems = []
        if done.returncode != 2:
            problems.append(f"exit {done.returncode}")
        if len(lines) != 1:
            problems.append(f"{len(lines)} stderr lines")
        elif not lines[0].startswith("error: "):
            problems.append("the line does not start with 'error: '")
        elif key not in lines[0]:
            problems.append(f"the line does not name {key}")
        if written or extra:
            problems.append(f"left {sorted(set(written + extra))} in the run directory")
        outcome = "refused cleanly" if not problems else "FAILED: " + "; ".join(problems)
        detail = (lines[0] if len(lines) == 1 else " / ".join(lines[-3:]))[:400]
    return {"outcome": outcome, "detail": detail, "exit_code": done.returncode, "wall_s": wall}


def _children(pid: int) -> list[tuple[int, str]]:
    out = subprocess.run(["ps", "-ww", "-o", "pid=,args=", "--ppid", str(pid)],
                         capture_output=True, text=True).stdout
    return sorted((int(line.split(None, 1)[0]), line.split(None, 1)[1])
                  for line in out.splitlines() if line.strip())


def local_ranks(launcher: int) -> list[int]:
    """The launcher's local ranks by pid, so rank 0 first (tests/conftest.py local_ranks): the
    children of its forkserver on the CPU, its own spawned children otherwise."""
    ranks = []
    for pid, args in _children(launcher):
        if "forkserver import main" in args:
            ranks += [child for child, _ in _children(pid)]
        elif "spawn_main" in args:
            ranks.append(pid)
    return sorted(ranks)


def _descendants(pid: int) -> list[int]:
    children = [child for child, _ in _children(pid)]
    return children + [g for child in children for g in _descendants(child)]


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state not in ("Z", "X")


def _metrics_lines(run_dir: Path) -> int:
    try:
        return len([l for l in (run_dir / METRICS).read_text().splitlines() if l.strip()])
    except FileNotFoundError:
        return 0


def _status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / SUMMARY).read_text()).get("status")
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _wait(predicate, proc: subprocess.Popen, timeout: float, what: str):
    """Poll `predicate` until true; None when the process ended or the time ran out first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _run_to_end(config: str, run_dir: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *CONFIGS[config], f"hydra.run.dir={run_dir}"], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout,
                          start_new_session=True)


def reference(config: str, root: Path, cache: dict) -> Path:
    """The uninterrupted run of `config`, once per audit (under `root`/ref)."""
    if config not in cache:
        run_dir = root / "ref" / config
        done = _run_to_end(config, run_dir)
        if done.returncode != 0 or _metrics_lines(run_dir) != EPOCHS:
            raise RuntimeError(f"the reference run of {config} failed (exit {done.returncode}): "
                               f"{done.stderr[-500:]}")
        cache[config] = run_dir
    return cache[config]


def _reach(case: Kill, proc: subprocess.Popen, run_dir: Path) -> str:
    """Wait for the case's moment; what the run showed when it came (or why it never did)."""
    lock = run_dir / LOCK
    if case.moment == "startup":  # validated and locked, ranks starting: no epoch yet
        _wait(lambda: lock.exists() or len(local_ranks(proc.pid)) > 0, proc, 300, "the lock")
    elif case.moment == "ranks_up":  # both ranks forked, before the first epoch line
        _wait(lambda: len(local_ranks(proc.pid)) == 2, proc, 300, "2 ranks")
    elif case.moment == "mid":  # half-way through epoch 1, by epoch 0's own time
        if _wait(lambda: _metrics_lines(run_dir) >= 1, proc, 300, "epoch 0's line"):
            first = json.loads((run_dir / METRICS).read_text().splitlines()[0])
            deadline = time.monotonic() + first["epoch_time_s"] / 2
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.02)
    elif case.moment == "between":  # the moment epoch 1's line appears
        _wait(lambda: _metrics_lines(run_dir) >= 2, proc, 300, "epoch 1's line")
    elif case.moment == "last":  # the moment the last epoch's line appears
        _wait(lambda: _metrics_lines(run_dir) >= EPOCHS, proc, 600, "the last epoch's line")
    else:
        raise ValueError(case.moment)
    return f"metrics lines at the kill: {_metrics_lines(run_dir)}, status {_status(run_dir)}"


def _send(case: Kill, proc: subprocess.Popen) -> None:
    ranks = local_ranks(proc.pid)
    if case.target == "group":
        os.killpg(proc.pid, signal.SIGKILL)
    elif case.target == "launcher":
        sig = signal.Signals[case.signal.removesuffix("x2")]
        proc.send_signal(sig)
        if case.signal.endswith("x2"):
            time.sleep(0.5)
            if proc.poll() is None:
                proc.send_signal(sig)
    else:
        rank = int(case.target.removeprefix("rank"))
        if len(ranks) <= rank:
            raise RuntimeError(f"rank {rank} was not running (ranks {ranks})")
        os.kill(ranks[rank], signal.SIGKILL)


def run_kill(case: Kill, work: Path, refs: dict, root: Path) -> dict:
    ref = reference(case.config, root, refs)
    run_dir = work / "run"
    start = time.perf_counter()
    proc = subprocess.Popen([*CLI, *CONFIGS[case.config], f"hydra.run.dir={run_dir}"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    notes = []
    try:
        if case.target.startswith("rank") and case.moment == "startup":
            raise ValueError("a rank is killed once it runs: moment ranks_up or later")
        seen = _reach(case, proc, run_dir)
        job = _descendants(proc.pid)
        finished_first = proc.poll() is not None
        if not finished_first:
            _send(case, proc)
        killed_at = time.monotonic()
        out, err = proc.communicate(timeout=300)
        if case.target in ("launcher", "group") and case.signal == "SIGKILL":
            since = killed_at
        else:
            since = time.monotonic()  # the launcher ends its own job, then exits
        while any(_alive(pid) for pid in job) and time.monotonic() - since < 5:
            time.sleep(0.05)
        survivors = [pid for pid in job if _alive(pid)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    code = proc.returncode
    lines = _nonempty_lines(err)
    notes.append(f"{seen}; exit {code}")
    problems = []
    if survivors:
        problems.append(f"processes {survivors} of the job still ran 5 s later")
        for pid in survivors:  # leave nothing running behind the audit
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if case.signal in ("SIGTERM", "SIGINT", "SIGTERMx2") and not finished_first:
        sig = signal.Signals[case.signal.removesuffix("x2")]
        if code not in (128 + sig, 0):
            problems.append(f"exit {code}, not {128 + sig}")
        if code == 128 + sig and (len(lines) != 1 or not lines[0].startswith("stopped")):
            problems.append(f"{len(lines)} stderr lines after {sig.name}: {' / '.join(lines)[-300:]}")
    if case.target.startswith("rank") and code != 0 and len(lines) != 1:
        problems.append(f"{len(lines)} stderr lines after a rank's death: {' / '.join(lines)[-300:]}")
    status = _status(run_dir)
    if status == "completed":
        difference = first_difference(ref, run_dir)
        if problems:
            outcome = "FAILED: " + "; ".join(problems)
        elif difference:
            outcome = f"FAILED: finished by itself but {difference}"
        else:
            outcome = "finished identically by itself"
        return {"outcome": outcome, "detail": "; ".join(notes), "exit_code": code,
                "wall_s": time.perf_counter() - start}
    stale = (run_dir / LOCK).exists()
    rerun = _run_to_end(case.config, run_dir)
    said = rerun.stdout + rerun.stderr
    notes.append(f"lock left: {stale}; rerun exit {rerun.returncode}")
    if rerun.returncode != 0:
        problems.append(f"the rerun exited {rerun.returncode}: "
                        f"{' / '.join(_nonempty_lines(rerun.stderr))[-300:]}")
    elif stale and "stale lock" not in said:
        problems.append("the rerun took over the lock without a note")
    if not problems:
        difference = first_difference(ref, run_dir)
        if difference:
            problems.append(difference)
    outcome = "resumed identically" if not problems else "FAILED: " + "; ".join(problems)
    return {"outcome": outcome, "detail": "; ".join(notes), "exit_code": code,
            "wall_s": time.perf_counter() - start}


def run_cases(cases: list, work: Path, keep: bool = False, echo=print) -> list[dict]:
    """Run `cases` one after another under `work`; one row per case."""
    refs: dict = {}
    rows = []
    for case in cases:
        folder = work / case.id
        try:
            if isinstance(case, Kill):
                got = run_kill(case, folder, refs, work)
            else:
                got = run_bad_input(case, folder)
        except Exception as exc:  # noqa: BLE001  (the harness's own failure is a case's FAILED)
            got = {"outcome": f"FAILED: {type(exc).__name__}: {exc}"[:500], "detail": "",
                   "exit_code": "", "wall_s": 0.0}
        finally:
            if not keep:
                shutil.rmtree(folder, ignore_errors=True)
        row = {"kind": case.kind, "id": case.id, "overrides": case.overrides,
               "expected": case.expected, "outcome": got["outcome"], "detail": got["detail"],
               "exit_code": got["exit_code"], "wall_s": round(got["wall_s"], 1)}
        rows.append(row)
        echo(f"{case.kind:9} {case.id:34} {row['outcome']}  ({row['wall_s']} s)", flush=True)
    if not keep:
        shutil.rmtree(work / "ref", ignore_errors=True)
    return rows


def totals(rows: list[dict]) -> str:
    def count(kind, outcome):
        return sum(1 for r in rows if r["kind"] == kind and r["outcome"].startswith(outcome))

    return (f"bad inputs: {count('bad input', 'refused cleanly')} refused cleanly, "
            f"{count('bad input', 'accepted by design')} accepted by design, "
            f"{count('bad input', 'FAILED')} FAILED; "
            f"kills: {count('kill', 'resumed identically')} resumed identically, "
            f"{count('kill', 'finished identically by itself')} finished by itself, "
            f"{count('kill', 'FAILED')} FAILED")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["bad", "kills"], help="run only this part")
    parser.add_argument("--cases", nargs="+", metavar="ID", help="run only these case ids")
    parser.add_argument("--keep", action="store_true", help="keep every case's folder")
    parser.add_argument("--out", type=Path,
                        default=REPO / "results" / "bench" / "cli_audit.csv")
    args = parser.parse_args(argv)
    cases = {"bad": BAD_INPUTS, "kills": KILLS, None: ALL_CASES}[args.only]
    if args.cases:
        known = {c.id for c in ALL_CASES}
        unknown = [i for i in args.cases if i not in known]
        if unknown:
            parser.error(f"unknown case ids: {', '.join(unknown)}")
        cases = [c for c in cases if c.id in args.cases]
    # a short folder under /tmp, so the launcher's forkserver socket path fits (launch.py)
    work = Path(tempfile.mkdtemp(prefix="acc-audit-", dir="/tmp"))
    try:
        rows = run_cases(cases, work, keep=args.keep)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    write_csv(rows, args.out)
    print(totals(rows))
    return 1 if any(r["outcome"].startswith("FAILED") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
