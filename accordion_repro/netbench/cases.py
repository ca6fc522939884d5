"""Which training runs the network benchmark measures, as trainer overrides.

The cases mirror the paper's comparisons (facts: Tables 1-3 and the batch-size table): for each
compressor a static low-compression run, a static high-compression run and Accordion switching
between the two, plus the uncompressed baseline; and for the batch-size variant a small batch,
a large batch and Accordion switching between them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DENSE, STATIC_LOW, STATIC_HIGH, ACCORDION = "dense", "static_low", "static_high", "accordion"
WORKERS = 2
# In a run of a few epochs the LR schedule decays every epoch, so the paper's "lower LR next
# epoch -> low compression" rule would pin Accordion to its low level and the benchmark would
# never see it switch; the norm-ratio rule alone decides here (checked every epoch).
SHORT_RUN_SCHEDULE = ("schedule.lr_decay_rule=false",)


@dataclass(frozen=True)
class BenchCase:
    """One training run: `family` groups the rows that share a static-low baseline."""

    name: str
    family: str
    method: str
    label: str
    overrides: tuple[str, ...]
    compressor: str = "none"


@dataclass(frozen=True)
class BenchScale:
    """How much of each run to do; the defaults keep the whole benchmark CPU-sized."""

    epochs: int = 3  # Accordion: epochs 0 and 1 at the low level, first switch for epoch 2
    steps_per_epoch: int = 2
    batch_per_worker: int = 16
    # global batch sizes of the batch-size family (the paper's 512 and 4096, shrunk for CPU)
    batch_small: int = 16
    batch_large: int = 128
    # samples per epoch of the batch-size family: a multiple of batch_large so that both
    # batch sizes see the same data per epoch (the large batch takes fewer, bigger steps)
    batch_epoch_samples: int = 128
    extra_overrides: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        from accordion_repro.errors import ConfigError

        for key in ("epochs", "steps_per_epoch", "batch_per_worker", "batch_small", "batch_large",
                    "batch_epoch_samples"):
            if getattr(self, key) < 1:
                raise ConfigError(key, f"must be >= 1, got {getattr(self, key)}")
        for key in ("batch_small", "batch_large"):
            if getattr(self, key) % WORKERS:
                raise ConfigError(key, f"global batch must split over {WORKERS} workers")
        if self.batch_epoch_samples % self.batch_large:
            raise ConfigError("batch_epoch_samples", "must be a multiple of batch_large")


def compression_cases(*, powersgd_ranks=(2, 1), topk_ratios=(0.99, 0.1)) -> list[BenchCase]:
    """Dense, then PowerSGD and Top-K each at static low, static high and Accordion."""
    low_rank, high_rank = powersgd_ranks
    low_ratio, high_ratio = topk_ratios
    cases = [BenchCase("dense", "dense", DENSE, "Dense (no compression)",
                       ("compressor=none", "schedule=static"))]
    for name, key, low, high, title, fmt in (
        ("powersgd", "rank", low_rank, high_rank, "PowerSGD", lambda v: f"rank {v}"),
        ("topk", "ratio", low_ratio, high_ratio, "Top-K", lambda v: f"{v:.0%}"),
    ):
        cases += [
            BenchCase(f"{name}_static_low", name, STATIC_LOW, f"{title} {fmt(low)}",
                      (f"compressor={name}", f"compressor.{key}={low}", "schedule=static"), name),
            BenchCase(f"{name}_static_high", name, STATIC_HIGH, f"{title} {fmt(high)}",
                      (f"compressor={name}", f"compressor.{key}={high}", "schedule=static"), name),
            BenchCase(f"{name}_accordion", name, ACCORDION,
                      f"{title} Accordion {fmt(low)}<->{fmt(high)}",
                      (f"compressor={name}", f"compressor.{key}={low}", "schedule=accordion",
                       f"schedule.low={low}", f"schedule.high={high}", "schedule.interval=1",
                       *SHORT_RUN_SCHEDULE), name),
        ]
    return cases


def batch_cases(scale: BenchScale, *, with_accordion: bool) -> list[BenchCase]:
    """Small batch, large batch and (when the schedule exists) Accordion between them."""
    small, large = scale.batch_small, scale.batch_large
    cases = [
        BenchCase("batch_small", "batch", STATIC_LOW, f"Batch {small}",
                  ("compressor=none", "schedule=static",
                   f"trainer.batch_size={small // WORKERS}")),
        BenchCase("batch_large", "batch", STATIC_HIGH, f"Batch {large}",
                  ("compressor=none", "schedule=static",
                   f"trainer.batch_size={large // WORKERS}")),
    ]
    if with_accordion:
        cases.append(BenchCase(
            "batch_accordion", "batch", ACCORDION, f"Batch Accordion {small}<->{large}",
            ("compressor=none", "schedule=batch_accordion", f"schedule.low={small}",
             f"schedule.high={large}", "schedule.interval=1", *SHORT_RUN_SCHEDULE,
             f"trainer.batch_size={small // WORKERS}")))
    return cases


def run_overrides(case: BenchCase, scale: BenchScale, run_dir: str) -> list[str]:
    """Everything the trainer is told for one case; later overrides win."""
    if case.family == "batch":
        steps = [f"dataset.train_size={scale.batch_epoch_samples}",
                 "trainer.max_steps_per_epoch=null"]
        batch = []
    else:
        steps = [f"trainer.max_steps_per_epoch={scale.steps_per_epoch}"]
        batch = [f"trainer.batch_size={scale.batch_per_worker}"]
    return [
        "model=resnet18", "dataset=synthetic_cifar10", "dataset.test_size=64", *batch, *case.overrides,
        f"trainer.epochs={scale.epochs}", *steps, "trainer.max_eval_steps=1",
        "trainer.resume=never", "trainer.checkpoint=false", "trainer.progress=never",
        *scale.extra_overrides, "logger.wandb.mode=disabled", f"hydra.run.dir={run_dir}",
    ]
