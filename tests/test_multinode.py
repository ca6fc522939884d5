"""Two "hosts" on this machine (two network namespaces joined by one veth link): torchrun with
--nnodes 2 rendezvouses across the link, and the run equals the same run on one host.

Needs root, iproute2 and tc (skipped with the reason elsewhere). Every namespace and process a
test makes is removed in a `finally`, also when it fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from accordion_repro.benchmarks.netbench.netns import NamespacePair, list_namespaces, missing_requirement
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


def start_torchrun_on_two_hosts(pair: NamespacePair, run_dir: Path,
                                overrides: list[str]) -> list[subprocess.Popen]:
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
    return procs


def torchrun_on_two_hosts(pair: NamespacePair, run_dir: Path, overrides: list[str],
                          timeout: float = 300) -> list[subprocess.CompletedProcess]:
    procs = start_torchrun_on_two_hosts(pair, run_dir, overrides)
    deadline = time.monotonic() + timeout
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(), err.decode()))
    return done


def one_host_run(overrides: list[str], run_dir: Path) -> Path:
    """The same run as 2 local ranks on one host: the value-by-value reference."""
    local = subprocess.run([sys.executable, "-m", "accordion_repro.train", *overrides,
                            "dist.nproc_per_node=2", f"hydra.run.dir={run_dir}"], cwd=REPO,
                           capture_output=True, text=True, timeout=300)
    assert local.returncode == 0, local.stderr
    return run_dir


@pytest.mark.parametrize("case", sorted(CASES))
def test_torchrun_across_two_hosts_equals_two_ranks_on_one_host(two_hosts, tmp_path, case):
    overrides = [*TINY, *CASES[case]]
    one_host = one_host_run(overrides, tmp_path / "one_host")
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


def _pids_in(pair: NamespacePair, side: int) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", pair.namespaces[side]], capture_output=True,
                         text=True).stdout
    return [int(token) for token in out.split()]


def test_a_host_killed_mid_epoch_ends_the_other_within_60_s_and_the_same_command_resumes(
        two_hosts, tmp_path):
    """Every process of host B is SIGKILLed during epoch 1. Host A's rank sees its peer's
    sockets close, ends within 60 s with one `error:` line naming itself and the lost peer's
    address, and nothing of the job is left on either host. The same two torchrun commands
    then resume from epoch 0's checkpoint (the dead rank's lock is taken over) and end with
    metrics equal, value by value, to the uninterrupted run on one host."""
    overrides = [*TINY, *CASES["powersgd"], "trainer.epochs=3", "dataset.train_size=1024"]
    one_host = one_host_run(overrides, tmp_path / "one_host")
    across = tmp_path / "two_hosts"
    host_a, host_b = start_torchrun_on_two_hosts(two_hosts, across, overrides)
    metrics = across / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.exists() and metrics.read_text().strip()):
        assert host_a.poll() is None and host_b.poll() is None, "a host ended before epoch 0"
        assert time.monotonic() < deadline, "epoch 0 did not finish within 240 s"
        time.sleep(0.1)
    time.sleep(0.5)  # into epoch 1
    for pid in _pids_in(two_hosts, 1):
        os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    _, err = host_a.communicate(timeout=120)
    ended_after = time.monotonic() - killed
    host_b.wait(timeout=30)
    assert ended_after < 60 and host_a.returncode != 0, (ended_after, host_a.returncode)
    errors = [line for line in err.decode().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, err.decode()[-3000:]
    assert "rank 0 lost a peer" in errors[0] and two_hosts.addresses[1] in errors[0], errors
    assert "resumes from the last checkpoint" in errors[0]
    assert _pids_in(two_hosts, 0) == [] and _pids_in(two_hosts, 1) == []
    assert [r["epoch"] for r in read_metrics(across)] == [0]

    results = torchrun_on_two_hosts(two_hosts, across, overrides)
    for result in results:
        assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(across)["status"] == "completed"
    assert _without_timing(read_metrics(across)) == _without_timing(read_metrics(one_host))
