"""A refactor may not change what a run computes: 2-rank runs against committed metrics.jsonl.

tests/golden/ holds the metrics.jsonl of two short 2-rank synthetic runs made with the code as
it stood before the configuration rework of issue 16 (commit 4925838; the same runs at
ddea92d, before any of issue 16, agree line for line except the two all-gather counters added
since). Each line is compared as the trainer writes it (json.dumps, same key order, same float
repr) with only the wall-clock fields taken out. The two cases cover PowerSGD under the
per-layer Accordion schedule and Top-K under the joint schedule (levels and global batch both
switching, LR decays firing the detector's rule).

Float results are bit-for-bit reproducible on one instruction set and torch build, not across
them: these tiny runs are chaotic enough that an AVX2 machine and an AVX512 one part by up to
100 % in a float after one epoch, and in the detector's decisions by epoch 3, so no tolerance
makes a comparison across machines mean anything. tests/golden/<cpu capability>/ therefore
holds one set per instruction set, each with its machine.json. The test compares bit for bit
against the set of this machine's capability and skips, saying why, on a capability or torch
build that has none.

Both sets were made anew when PowerSGD's packing became one everywhere (issue 55: the trainer
now starts every P and Q block on 64 bytes, as the DDP hook and the FSDP path did; the Top-K
case did not move): AVX512 on an AVX512 machine, AVX2 on the same machine held to AVX2 by
ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2, a cap that
reproduced the AVX2 set made on a real AVX2 machine (fc29a11) bit for bit before the change.
"""

from __future__ import annotations

import json
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


def this_machine() -> dict:
    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability()}


def golden_dir() -> Path:
    """This machine's golden files; a skip, saying why, where there are none."""
    machine = this_machine()
    folder = GOLDEN / machine["cpu_capability"]
    if not (folder / "machine.json").is_file():
        made = sorted(p.parent.name for p in GOLDEN.glob("*/machine.json"))
        pytest.skip(f"no golden files for CPU capability {machine['cpu_capability']} (made for "
                    f"{', '.join(made)}): floats differ across instruction sets")
    recorded = json.loads((folder / "machine.json").read_text())
    if recorded != machine:
        pytest.skip(f"golden files for {recorded}, this machine is {machine}")
    return folder


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("case", sorted(CASES))
def test_two_rank_metrics_are_unchanged_by_refactors(tmp_path, case):
    folder = golden_dir()
    run_dir = train([*COMMON, *CASES[case]], tmp_path / case)
    got = [_without_times(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    want = (folder / f"metrics_{case}.jsonl").read_text().splitlines()
    assert len(got) == len(want) == 6
    for epoch, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"epoch {epoch} differs from {folder.name}/metrics_{case}.jsonl"


def test_every_golden_set_holds_both_cases_for_its_machine():
    sets = sorted(GOLDEN.glob("*/machine.json"))
    assert [p.parent.name for p in sets] == ["AVX2", "AVX512"]
    for machine in sets:
        assert json.loads(machine.read_text())["cpu_capability"] == machine.parent.name
        for case in CASES:
            assert len((machine.parent / f"metrics_{case}.jsonl").read_text().splitlines()) == 6
