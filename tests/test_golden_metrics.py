"""A refactor may not change what a run computes: 2-rank runs against committed metrics.jsonl.

tests/golden/ holds the metrics.jsonl of two short 2-rank synthetic runs made with the code as
it stood before the configuration rework of issue 16 (commit 4925838; the same runs at
ddea92d, before any of issue 16, agree line for line except the two all-gather counters added
since). Each line is compared as the trainer writes it (json.dumps, same key order, same float
repr) with only the wall-clock fields taken out. The two cases cover PowerSGD under the
per-layer Accordion schedule and Top-K under the joint schedule (levels and global batch both
switching, LR decays firing the detector's rule).

Float results are bit-for-bit reproducible on one machine and torch build, not across CPU
instruction sets. tests/golden/machine.json records where the files were made; on another
machine a line whose bytes differ must still agree in every key, every integer and string, and
every float to a relative 1e-5, and the test says which comparison it made.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from conftest import train

GOLDEN = Path(__file__).parent / "golden"
TIMES = ("epoch_time_s", "compute_time_s", "comm_time_s")
COMMON = ["model=resnet18", "model.width=0.25", "dataset=synthetic_cifar10",
          "dataset.train_size=96", "dataset.test_size=32", "trainer.batch_size=8",
          "trainer.eval_batch_size=16", "dist.nproc_per_node=2", "trainer.epochs=6",
          "trainer.max_steps_per_epoch=3", "trainer.max_eval_steps=2", "optim.warmup_epochs=0",
          "seed=5"]
CASES = {
    "accordion": ["compressor=powersgd", "schedule=accordion", "schedule.low=2",
                  "schedule.high=1", "schedule.interval=1"],
    "joint": ["compressor=topk", "schedule=joint", "schedule.low=0.5", "schedule.high=0.1",
              "schedule.batch_low=16", "schedule.batch_high=32", "schedule.interval=1"],
}


def _without_times(line: str) -> str:
    record = json.loads(line)
    for key in TIMES:
        record.pop(key)
    return json.dumps(record)


def _close(a, b) -> bool:
    """Same structure, ints and strings; floats within a relative 1e-5."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, (int, float)) and isinstance(b, (int, float)) and \
            math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-9)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_close, a, b))
    return a == b


def this_machine() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_rank_metrics_are_unchanged_by_refactors(tmp_path, case):
    run_dir = train([*COMMON, *CASES[case]], tmp_path / case)
    got = [_without_times(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    want = (GOLDEN / f"metrics_{case}.jsonl").read_text().splitlines()
    assert len(got) == len(want) == 6
    if this_machine() == json.loads((GOLDEN / "machine.json").read_text()):
        for epoch, (g, w) in enumerate(zip(got, want)):
            assert g == w, f"epoch {epoch} differs from tests/golden/metrics_{case}.jsonl"
    else:
        for epoch, (g, w) in enumerate(zip(got, want)):
            assert _close(json.loads(g), json.loads(w)), \
                f"epoch {epoch} differs from tests/golden/metrics_{case}.jsonl (compared " \
                f"within 1e-5: this machine {this_machine()} is not the golden files' machine)"
