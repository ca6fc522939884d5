"""What every benchmark shares: its ranks (on loopback, or one rank of a torchrun-style launch),
the arm a step is timed on, interleaved rounds, quartiles and the CSV they end in.

One harness, so that every benchmark's numbers mean the same thing: a step is timed after a
barrier of every rank, configurations run one step each per round so machine noise hits all
alike, and a row is the median and quartiles of the timed (post-warm-up) samples.
"""

from __future__ import annotations

import csv
import json
import os
import socket
import statistics
import time
from pathlib import Path
from queue import Empty
from typing import Callable

WORLD = 2  # loopback ranks: this machine's two cores, one thread each


def interleave(configs: dict, warmup: int, steps: int) -> tuple[dict[str, list[float]], float]:
    """Run one step of every configuration per round, so machine noise hits all alike.

    `configs` maps a name to (run, target): run(target) does one step and returns its seconds.
    Returns the timed samples per name (after `warmup` rounds) and the loop's wall time.
    """
    samples: dict[str, list[float]] = {}
    started = time.perf_counter()
    for step in range(warmup + steps):
        for name, (run, target) in configs.items():
            seconds = run(target)
            if step >= warmup:
                samples.setdefault(name, []).append(seconds)
    return samples, time.perf_counter() - started


def quantile_rows(samples: dict[str, list[float]]) -> list[dict]:
    """One row per configuration: median, inter-quartile range and its ends in ms, sample count."""
    rows = []
    for name, values in samples.items():
        q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
        rows.append({"config": name, "median_ms": 1e3 * median, "iqr_ms": 1e3 * (q3 - q1),
                     "p25_ms": 1e3 * q1, "p75_ms": 1e3 * q3, "n": len(values)})
    return rows


def write_csv(rows: list[dict], path: Path) -> None:
    """`rows` as a CSV whose columns are the first row's keys; says where it wrote."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"wrote {path}")


# ---- ranks -----------------------------------------------------------------------------------
# A benchmark's `measure(args, rank)` runs on every rank inside a gloo process group (one
# thread per rank) and returns rank 0's record; the two launchers below give it that group.

def _one_thread() -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


def _loopback_rank(rank: int, port: int, measure: Callable, args, queue) -> None:
    """One loopback rank of run_ranks: its own gloo process group; rank 0 reports."""
    import torch.distributed as dist

    _one_thread()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    record = measure(args, rank)
    if rank == 0:
        queue.put(record)
    dist.barrier()
    dist.destroy_process_group()


def run_ranks(measure: Callable, args, timeout: float = 1200):
    """Start WORLD gloo ranks on loopback, each a process running measure(args, rank); returns
    what rank 0's measure returned. A rank that dies stops them all at once.

    `measure` must be a module-level function (the ranks are spawned and import it)."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    processes = [ctx.Process(target=_loopback_rank, args=(r, port, measure, args, queue))
                 for r in range(WORLD)]
    # One thread per rank, set while they start: OpenMP reads it as it loads in each rank,
    # and the caller's own environment stays as it was (a test's worker kept it before).
    caller = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        for p in processes:
            p.start()
    finally:
        if caller is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = caller
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                return queue.get(timeout=1.0)
            except Empty:
                failed = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
                if failed or time.monotonic() > deadline:
                    for p in processes:  # a rank left alone waits for its peer forever
                        p.kill()
                    raise RuntimeError(f"ranks exited with {failed} before reporting" if failed
                                       else f"no result after {timeout:.0f} s") from None
    finally:
        for p in processes:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()


def env_rank(measure: Callable, args, raw: Path) -> int:
    """One rank of a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the
    environment: benchmarks/netbench/ranks.py's ranks across a shaped link); rank 0 writes what
    measure(args, rank) returned to `raw` as JSON."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        record = measure(args, dist.get_rank())
        if dist.get_rank() == 0:
            raw.parent.mkdir(parents=True, exist_ok=True)
            raw.write_text(json.dumps(record))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


# ---- arms ------------------------------------------------------------------------------------

def fixed_batch(batch: int, seed: int):
    """(images, labels): one CIFAR-shaped batch drawn from its own generator, so every arm of a
    rank trains on the same data whatever else consumed torch's global generator."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, 32, 32, generator=gen)
    return x, torch.randint(0, 10, (batch,), generator=gen)


def resnet18(width: float):
    """CIFAR-10 ResNet-18 at `width`, initialised alike in every arm and on every rank."""
    import torch

    from accordion_repro.models import build_model

    torch.manual_seed(0)
    return build_model("resnet18", num_classes=10, width=width)


class Arm:
    """A model wrapped for distributed training (`net`: DDP, FSDP), SGD with momentum and one
    fixed batch on this rank, stepped as a user's loop steps it. step() times zero_grad,
    forward, backward and optimizer.step after a barrier of every rank; subclasses count what
    the step handed to the network around it (_started, _stepped)."""

    def __init__(self, net, parameters, *, batch: int, seed: int, warmup: int):
        import torch

        self.net = net
        self.x, self.y = fixed_batch(batch, seed)
        self.optimizer = torch.optim.SGD(parameters, lr=0.01, momentum=0.9)
        self.warmup, self.steps = warmup, 0

    def forward_backward(self) -> None:
        import torch

        torch.nn.functional.cross_entropy(self.net(self.x), self.y).backward()

    def step(self) -> float:
        """One training step's seconds, timed after a barrier of every rank."""
        import torch.distributed as dist

        dist.barrier()
        self._started()
        start = time.perf_counter()
        self.optimizer.zero_grad()
        self.forward_backward()
        self.optimizer.step()
        elapsed = time.perf_counter() - start
        self.steps += 1
        self._stepped()
        return elapsed

    def _started(self) -> None:
        """Before a step's clock starts (after the barrier)."""

    def _stepped(self) -> None:
        """After a step's clock stops; self.steps counts it already."""
