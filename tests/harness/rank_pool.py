"""Two gloo ranks kept for many short runs: each job is one Trainer run in their group.

Why: starting two ranks cost about 8 CPU-s when each imported torch and torch._dynamo, which a
one-step run pays many times over; tests/test_presets.py's 28 FSDP presets spent some 240 CPU-s
mostly on starts. These ranks start once; each job is the launcher's rank body
(launch._run, without leaving the group) on RunSettings validated in the test's own process, as
the CLI validates them. A job that fails or times out ends the pool
(its group may be unusable); the next job starts a new one. The launcher's own path (its ranks'
start, signals, a dead rank) is tested by tests/test_train.py and tests/test_run_integrity.py.
"""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
import time
import traceback
from pathlib import Path

from accordion_repro.utils import adopt_environment
from harness import forked_ranks

WORLD = 2


def _rank_loop(rank: int, store_file: str, jobs, results, environ: dict[str, str]) -> None:
    adopt_environment(environ)
    import torch
    import torch.distributed as dist

    from accordion_repro.launch import _exit_without_finalizing, _run
    from accordion_repro.utils import die_with_parent

    die_with_parent()  # a test process killed outright leaves no rank behind
    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(WORLD), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank,
                            world_size=WORLD, timeout=datetime.timedelta(seconds=120))
    while (job := jobs.get()) is not None:
        run, run_dir = job
        try:
            _run(run, Path(run_dir))  # the launcher's rank body, the group left standing
            dist.barrier()
            results.put((rank, None))
        except BaseException:  # noqa: BLE001  (reported to the test, which fails naming it)
            results.put((rank, traceback.format_exc()))
            break
    _exit_without_finalizing()  # as a launched rank: no teardown of torch's objects


class RankPool:
    """`pool.train(run_settings, run_dir)` runs one job on both ranks; `close()` ends them."""

    def __init__(self, timeout_s: float = 300.0):
        self.timeout_s = timeout_s
        self._processes: list = []  # none while the pool is not started

    def _start(self) -> None:
        ctx = forked_ranks.context()
        self._store = tempfile.TemporaryDirectory(prefix="rank-pool-")
        store_file = os.path.join(self._store.name, "store")
        self._jobs = [ctx.Queue() for _ in range(WORLD)]
        self._results = ctx.Queue()
        self._processes = [ctx.Process(target=_rank_loop, args=(rank, store_file, self._jobs[rank],
                                                                 self._results, dict(os.environ)),
                                       daemon=True)
                           for rank in range(WORLD)]
        for process in self._processes:
            process.start()

    def train(self, run, run_dir: Path) -> None:
        """Run the job on both ranks; AssertionError with the ranks' tracebacks if it fails."""
        if not self._processes:
            self._start()
        for jobs in self._jobs:
            jobs.put((run, str(run_dir)))
        errors, done = {}, 0
        deadline = time.monotonic() + self.timeout_s
        while done < WORLD and not errors:
            try:
                rank, error = self._results.get(timeout=1)
            except queue.Empty:
                dead = [(rank, p.exitcode) for rank, p in enumerate(self._processes)
                        if not p.is_alive()]
                if dead:
                    errors.update({rank: f"died with exit code {code}" for rank, code in dead})
                elif time.monotonic() > deadline:
                    errors[-1] = f"no result within {self.timeout_s:.0f} s"
                continue
            if error is None:
                done += 1
            else:
                errors[rank] = error
        if errors:
            self.close(wait_s=0)  # the other rank may be waiting in a collective
            raise AssertionError("\n".join(f"rank {rank}: {text}" for rank, text in errors.items()))

    def close(self, wait_s: float = 30) -> None:
        """Ask the ranks to leave; kill any that have not within `wait_s`."""
        if not self._processes:
            return
        for jobs in self._jobs:
            jobs.put(None)
        for process in self._processes:
            process.join(timeout=wait_s)
            if process.is_alive():
                process.kill()
                process.join()
        self._store.cleanup()
        self._processes = []
