"""Two "hosts" on this machine (two network namespaces joined by one veth link): torchrun with
--nnodes 2 rendezvouses across the link, and the run equals the same run on one host.

Needs root, iproute2 and tc (skipped with the reason elsewhere). Every namespace and process a
test makes is removed in a `finally`, also when it fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accordion_repro.netbench.netns import NamespacePair, list_namespaces, missing_requirement
from conftest import REPO, read_metrics, read_summary

MISSING = missing_requirement()
pytestmark = [pytest.mark.slow, pytest.mark.distributed,
              pytest.mark.skipif(MISSING is not None, reason=f"two-host tests: {MISSING}")]

TINY = ["model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10", "dataset.train_size=128",
        "dataset.test_size=32", "schedule=accordion", "schedule.interval=1", "trainer.epochs=2",
        "trainer.batch_size=16", "trainer.eval_batch_size=16", "trainer.max_eval_steps=2",
        "logger.wandb.mode=disabled", "trainer.progress=never"]
CASES = {"powersgd": ["compressor=powersgd", "schedule.low=2", "schedule.high=1"],
         "topk": ["compressor=topk", "schedule.low=0.1", "schedule.high=0.01"]}
TIMING = {"epoch_time_s", "compute_time_s", "comm_time_s"}
PORT = 29512


def _without_timing(records):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


@pytest.fixture
def two_hosts():
    pair = NamespacePair("nodes")
    pair.create()
    try:
        yield pair
    finally:
        pair.teardown()
    assert not any(ns in list_namespaces() for ns in pair.namespaces)


def torchrun_on_two_hosts(pair: NamespacePair, run_dir: Path, overrides: list[str],
                          timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """`torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint A:PORT`,
    once per host; gloo binds to each host's own link (GLOO_SOCKET_IFNAME). Host A is told
    it holds the rendezvous store (`--rdzv_conf is_host=...`): torchrun decides that by
    resolving the machine's host name, which here (as on many clusters with a separate
    fabric) does not resolve to the rendezvous address, so no node would host it; and each
    host gives its own address on the link (`--local_addr`), which rank 0's becomes the
    workers' MASTER_ADDR (else its host name, unreachable from the other host)."""
    procs = []
    for side in (0, 1):
        env = {**os.environ, "GLOO_SOCKET_IFNAME": pair.devices[side], "OMP_NUM_THREADS": "1"}
        argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                "--nproc_per_node", "1", "--rdzv_backend", "c10d",
                "--rdzv_endpoint", f"{pair.addresses[0]}:{PORT}", "--rdzv_id", "accordion-test",
                "--rdzv_conf", f"is_host={'true' if side == 0 else 'false'}",
                "--local_addr", pair.addresses[side],
                "-m", "accordion_repro.train", *overrides, f"hydra.run.dir={run_dir}"]
        procs.append(pair.popen(side, argv, env=env, cwd=str(REPO), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE))
    deadline = time.monotonic() + timeout
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode()))
    return done


@pytest.mark.parametrize("case", sorted(CASES))
def test_torchrun_across_two_hosts_equals_two_ranks_on_one_host(two_hosts, tmp_path, case):
    overrides = [*TINY, *CASES[case]]
    one_host = tmp_path / "one_host"
    local = subprocess.run([sys.executable, "-m", "accordion_repro.train", *overrides,
                            "dist.nproc_per_node=2", f"hydra.run.dir={one_host}"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    across = tmp_path / "two_hosts"
    results = torchrun_on_two_hosts(two_hosts, across, overrides)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(across)["status"] == "completed" and read_summary(across)["world_size"] == 2
    ours, reference = read_metrics(across), read_metrics(one_host)
    assert [r["epoch"] for r in ours] == [0, 1]
    # value by value: losses, accuracies, levels, floats and bytes sent
    assert _without_timing(ours) == _without_timing(reference)
    assert json.loads((across / "summary.json").read_text())["total_bytes_sent"] == \
        read_summary(one_host)["total_bytes_sent"]
