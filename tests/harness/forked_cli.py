"""`python -m accordion_repro.train ...` in a new process forked from a server that imported
torch, Hydra and the CLI's modules once, instead of a fresh interpreter per call.

Why: a CLI process spent about 4 of its CPU-s importing torch, torch._dynamo (torch.optim's
constructor imports it) and Hydra before it read its first argument, a hundred times a suite.
Each call here is still its own process: multiprocessing's forkserver (forked_ranks.py; no torch
op has run in it) forks it, it takes the test's environment and working directory, writes its
stdout and stderr to files of its own, runs the CLI module as `__main__` the way `-m` does,
including the launcher's own ranks and the atexit handlers, and exits with the CLI's code.
What it leaves out is the interpreter's start. Tests whose subject is the process a user starts
(signals, process groups, the one-line output of a dying job, Hydra's own refusals, the demo)
keep starting it with subprocess.
"""

from __future__ import annotations

import atexit
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from accordion_repro.utils import adopt_environment
from harness import forked_ranks

MODULE = "accordion_repro.train"
# Read by OpenMP and MKL when they load, that is in the server: a child cannot take other values.
LOAD_TIME_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_")


def run_cli(args: list[str], *, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """What subprocess.run([python, -m, MODULE, *args], capture_output=True, text=True) gives.
    Refused when the test's environment sets a thread variable other than the server's: a forked
    child could not honour it, and would compute other last bits than the CLI (seen once: a test
    had left OMP_NUM_THREADS=1 in its worker's environment)."""
    differences = _load_time_differences(dict(os.environ))
    if differences:
        raise RuntimeError(f"forked_cli cannot give a child {', '.join(differences)}: they are "
                           f"read when OpenMP loads; start this CLI with subprocess")
    with tempfile.TemporaryDirectory(prefix="forked-cli-") as folder:
        out, err = Path(folder, "stdout"), Path(folder, "stderr")
        proc = forked_ranks.context().Process(
            target=_cli_process, args=(list(args), dict(os.environ), str(cwd), str(out), str(err)))
        proc.start()
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()  # its ranks die with it (launch: die_with_parent)
            proc.join()
            raise subprocess.TimeoutExpired([MODULE, *args], timeout, out.read_text(),
                                            err.read_text())
        return subprocess.CompletedProcess([sys.executable, "-m", MODULE, *args], proc.exitcode,
                                           out.read_text(), err.read_text())


def _load_time_differences(environ: dict[str, str]) -> list[str]:
    server = forked_ranks.SERVER_ENVIRONMENT
    keys = {k for k in {*environ, *server} if k.startswith(LOAD_TIME_PREFIXES)}
    return sorted(f"{k}={environ.get(k)!r} (server: {server.get(k)!r})" for k in keys
                  if environ.get(k) != server.get(k))


def _cli_process(args: list[str], environ: dict[str, str], cwd: str, out: str, err: str) -> None:
    adopt_environment(environ)
    os.chdir(cwd)
    for fd, path in ((1, out), (2, err)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.argv = [MODULE, *args]
    code = 0
    try:
        runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:  # what the interpreter does with an uncaught exception
        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
