"""Time one training step of each static configuration across a link, and calibrate the link.

A link is calibrated with raw gloo collectives (a bulk all-reduce and a bulk all-gather: the
rates the backend reaches; a one-float all-reduce: the per-collective latency), which is what
the cost model is told about it. A step is timed by running the static run's own preset (its
scale, model width, batch, compressor and level) as rank 0 and rank 1 of the real trainer,
one per namespace, on synthetic images of the same shape, for a few short epochs: the median
over epochs of the epoch's mean step is the measurement, the first epoch left out (it pays for
warm-up and connection set-up).
The unshaped pair (veth at memory speed) gives each configuration's step without a network
in the way: its compute, compression included, which the cost model adds the link to.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

from accordion_repro.costmodel import Network, step_comm_time
from .allreduce_probe import AllreduceMeasurement, measure_shaped_allreduce
from .netns import LinkSpec, NamespacePair, ShapingReport
from .ranks import python_argv, run_two_ranks
from .study import Run

WORKERS = 2
TIMED_EPOCHS = 3  # after one warm-up epoch
BULK_NUMEL = 2_000_000  # 8 MB: long enough at 1 Gbit/s (64 ms) to swamp per-call overheads


@dataclass(frozen=True)
class LinkCalibration:
    """What raw gloo collectives do on one link; `shaping` None is the unshaped pair.

    gloo's all-gather is bimodal on a shaped link: a call runs either near line rate or ~1.6x
    slower, and large buffers are slow more often (docs/network_bench.md; one message per
    all-gather, before the Top-K reducer sent its all-gathers in segments, which run near line
    rate). So the all-gather is probed at two sizes, as the reducer issues it, its rate
    interpolated in log size, and every probe is summarised by its mean (a whole run pays the
    mean over its steps, not the median).
    """

    shaping: ShapingReport | None
    bulk: AllreduceMeasurement
    gather: AllreduceMeasurement        # the Top-K reducer's collective, same bytes as bulk
    gather_small: AllreduceMeasurement  # and at 1/16 of the size
    tiny: AllreduceMeasurement

    @property
    def label(self) -> str:
        return self.shaping.label if self.shaping else "unshaped veth"

    @property
    def bandwidth_bps(self) -> float:
        """The nominal rate; the unshaped pair has none, so its all-reduce defines it."""
        return self.shaping.link.bandwidth_bps if self.shaping else self.bulk.bytes * 8 / self.bulk.mean_s

    @property
    def latency_s(self) -> float:
        """A two-worker ring all-reduce pays two latencies: half a one-float all-reduce, plus
        the delay netem added (none where the kernel lacks netem)."""
        added = self.shaping.effective_latency_s if self.shaping else 0.0
        return self.tiny.median_s / 2 + added

    def rate(self, m: AllreduceMeasurement) -> float:
        """Fraction of the line rate a probe reached (ideal two-worker ring: size / bandwidth)."""
        return min(1.0, m.bytes * 8 / self.bandwidth_bps / m.mean_s)

    def allgather_rate(self, nbytes: float) -> float:
        small, large = self.gather_small, self.gather
        x = min(max(math.log(max(nbytes, 1.0)), math.log(small.bytes)), math.log(large.bytes))
        w = (x - math.log(small.bytes)) / (math.log(large.bytes) - math.log(small.bytes))
        return self.rate(small) + w * (self.rate(large) - self.rate(small))

    def network(self, allgather_bytes: float = 0.0) -> Network:
        """The cost model's view of the link for a step whose all-gathers move `allgather_bytes`
        per rank: nominal rate, the rates gloo reaches, latency."""
        return Network(bandwidth_bps=self.bandwidth_bps, latency_s=self.latency_s,
                       allreduce_rate=self.rate(self.bulk),
                       allgather_rate=self.allgather_rate(allgather_bytes or self.gather.bytes))


def calibrate(pair: NamespacePair, work_dir: Path) -> dict:
    """The raw probes of one link: name -> {numel, bytes, times_s}."""
    def probe(numel, op, repeats=12):
        return vars(measure_shaped_allreduce(pair, numel=numel, repeats=repeats, op=op,
                                             work_dir=work_dir / f"{op}{numel}"))

    return {"bulk": probe(BULK_NUMEL, "allreduce"), "gather": probe(BULK_NUMEL, "allgather"),
            "gather_small": probe(BULK_NUMEL // 16, "allgather"), "tiny": probe(1, "allreduce", 20)}


def link_calibration(shaping: ShapingReport | None, probes: dict) -> LinkCalibration:
    return LinkCalibration(shaping, **{name: AllreduceMeasurement(**probe) for name, probe in probes.items()})


@dataclass(frozen=True)
class StepTime:
    """One configuration's mean step on one link (per worker: rank 0's record)."""

    step_s: float
    compute_s: float
    comm_s: float
    bytes_sent: float
    collectives: float
    allgather_bytes: float
    allgathers: float
    steps: int

    @classmethod
    def from_epochs(cls, epochs: list[dict]) -> "StepTime":
        """Medians over the epochs of each per-step mean."""
        def per(key: str) -> float:
            return statistics.median(float(e.get(key, 0)) / int(e["steps"]) for e in epochs)

        return cls(step_s=per("epoch_time_s"), compute_s=per("compute_time_s"),
                   comm_s=per("comm_time_s"), bytes_sent=per("bytes_sent"),
                   collectives=per("collectives"), allgather_bytes=per("allgather_bytes_sent"),
                   allgathers=per("allgathers"), steps=sum(int(e["steps"]) for e in epochs))

    def network_s(self, network: Network) -> float:
        """The cost model's communication for this step's collectives."""
        return step_comm_time(self.bytes_sent, self.collectives, self.allgather_bytes,
                              self.allgathers, network, WORKERS)

    def gathered_per_call(self) -> float:
        return self.allgather_bytes / self.allgathers if self.allgathers else 0.0


def predicted_step(fast: StepTime, fast_link: LinkCalibration, link: LinkCalibration | Network) -> float:
    """The cost model: the step without a network in the way (compute and compression, from
    the unshaped pair, less the little the unshaped link itself cost) plus this link's time for
    the same collectives."""
    size = fast.gathered_per_call()
    network = link if isinstance(link, Network) else link.network(size)
    return fast.step_s - fast.network_s(fast_link.network(size)) + fast.network_s(network)


def steps_for(global_batch: int, steps: int, reference_batch: int = 128) -> int:
    """Steps per timed epoch: `steps` at the reference batch, fewer (>= 2) for larger batches,
    whose steps are long anyway."""
    return max(2, round(steps * reference_batch / global_batch))


def step_overrides(run: Run, steps: int, run_dir: Path, *, epochs: int = 1 + TIMED_EPOCHS,
                   extra: tuple[str, ...] = ()) -> list[str]:
    """The run's own configuration (preset and scale), on synthetic images of the same shape:
    `epochs` epochs of `steps` steps at its first epoch's global batch."""
    batch = int(run.epochs[0]["global_batch"])
    return [
        f"experiment={run.preset}", f"scale={run.scale}", "dataset=synthetic_cifar10",
        f"dataset.train_size={steps * batch}", "dataset.test_size=64", "trainer.max_eval_steps=1",
        f"trainer.epochs={epochs}", *extra, "trainer.resume=never", "trainer.checkpoint=false",
        "trainer.progress=never", "logger.wandb.mode=disabled", f"hydra.run.dir={run_dir}",
    ]


# What the benchmark keeps of each trainer epoch (results/bench/network_raw.json).
EPOCH_KEYS = ("epoch", "steps", "global_batch", "levels", "epoch_time_s", "compute_time_s",
              "comm_time_s", "floats_sent", "bytes_sent", "collectives", "allgather_bytes_sent",
              "allgathers")


def run_trainer(pair: NamespacePair, overrides: list[str], run_dir: Path, *, timeout_s: float) -> list[dict]:
    """Train across the link as rank 0 and rank 1; return rank 0's per-epoch records (EPOCH_KEYS)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)  # never resume a previous attempt's checkpoint
    run_dir.mkdir(parents=True)
    run_two_ranks(pair, python_argv("accordion_repro.train", *overrides), log_dir=run_dir / "logs",
                  timeout_s=timeout_s)
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"the trainer wrote no {path}")
    epochs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not epochs:
        raise ValueError(f"{path} holds no epoch")
    return [{k: e[k] for k in EPOCH_KEYS if k in e} for e in epochs]


def link_pair(link: LinkSpec | None, tag: str):
    """A fresh namespace pair, shaped to `link` (None: left unshaped)."""
    pair = NamespacePair(tag)
    pair.create()
    try:
        shaping = pair.shape(link) if link is not None else None
    except BaseException:
        pair.teardown()
        raise
    return pair, shaping
