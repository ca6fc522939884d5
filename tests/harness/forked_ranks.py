"""The test harnesses' ranks forked from a server that imported torch once, instead of spawned.

Why: a spawned rank spent about 3 of its 4 CPU-s importing torch and torch._dynamo, dozens of
times a suite (run_workers, the rank pool). multiprocessing's forkserver imports them once per
test process, in a fresh interpreter that runs no torch op (no OpenMP or intra-op thread pool
for a child to inherit), and forks each rank from it: the 12 test files that start such ranks
took 196 s instead of 272 s on two workers. Each rank is still a new process. A forked rank
starts with the server's environment, taken when it started: `accordion_repro.utils.adopt_environment`
gives it the test's. The launcher's own ranks are forked the same way, from the launcher's own
server (launch.start_method), as a user's are.
"""

from __future__ import annotations

import contextlib
import multiprocessing.forkserver
import os

import torch.multiprocessing as mp

from accordion_repro.utils import adopt_environment

# What a rank and the CLI (forked_cli.py) import before their first argument; never
# accordion_repro.train itself, which the CLI runs as __main__. Not launch.RANK_MODULES, which
# adds torchvision: with it, a subset of the suite (test_comm_distributed, test_accordion_runs,
# test_run_integrity less the demo and the FSDP kill) took 373 busy CPU-s against 351 without.
PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "accordion_repro.engine.trainer", "hydra",
           "accordion_repro.config", "accordion_repro.launch", "accordion_repro.rundir",
           "accordion_repro.data"]


# The environment the server starts with, whichever test starts it: the session's, taken when the
# test files are imported, before any test has changed os.environ. What libraries read when they
# load (OpenMP's OMP_* variables: torch's thread count) is fixed then, for every forked child.
SERVER_ENVIRONMENT = dict(os.environ)


def context():
    """multiprocessing's forkserver context, its server (started at the first call) preloaded."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    with _environment(SERVER_ENVIRONMENT):
        multiprocessing.forkserver.ensure_running()
    return ctx


@contextlib.contextmanager
def _environment(environ: dict[str, str]):
    saved = dict(os.environ)
    adopt_environment(environ)
    try:
        yield
    finally:
        adopt_environment(saved)
