"""Start rank 0 and rank 1 of one command, one per namespace, joined over gloo on the veth."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence, TypeVar

from accordion_repro.run_layout import PROJECT_ROOT as REPO

from .netns import NamespacePair, NetbenchUnavailable

DEFAULT_PORT = 29577
T = TypeVar("T")


class RanksFailed(RuntimeError):
    """A rank exited non-zero or the pair ran past its timeout; the message names the log."""


def rank_environment(pair: NamespacePair, rank: int, *, port: int) -> dict[str, str]:
    """torchrun-style variables; gloo is pinned to the veth so it never picks another device."""
    env = dict(os.environ)
    env.update(
        RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR=pair.addresses[0], MASTER_PORT=str(port),
        GLOO_SOCKET_IFNAME=pair.devices[rank],
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
        # `python -m benchmarks.netbench...` from any working directory
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    return env


def run_two_ranks(pair: NamespacePair, argv: Sequence[str], *, log_dir: Path,
                  timeout_s: float, port: int = DEFAULT_PORT) -> float:
    """Run argv as rank 0 in namespace a and rank 1 in namespace b; return the wall time.

    Both ranks share the time limit; on failure or timeout the survivors are stopped so the
    namespaces can be deleted, and the error points at the log files.
    """
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    procs, logs = [], []
    start = time.monotonic()
    try:
        for rank in (0, 1):
            log = open(log_dir / f"rank{rank}.log", "w")
            logs.append(log)
            procs.append(pair.popen(rank, argv, env=rank_environment(pair, rank, port=port),
                                    stdout=log, stderr=log))
        while any(p.poll() is None for p in procs):
            if any(p.poll() not in (None, 0) for p in procs):
                break
            if time.monotonic() - start > timeout_s:
                raise RanksFailed(f"ranks ran past {timeout_s:.0f} s; logs in {log_dir}")
            time.sleep(0.05)
        codes = [p.poll() for p in procs]
        if codes != [0, 0]:
            raise RanksFailed(f"ranks exited with {codes}; see {log_dir}/rank*.log:\n"
                              + _tail(log_dir / f"rank{codes.index(next(c for c in codes if c))}.log"))
        return time.monotonic() - start
    finally:
        pair.stop_children()
        for log in logs:
            log.close()


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def python_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


def run_reported(name: str, measure: Callable[[], T]) -> tuple[int, T | None]:
    """(0, measure()), or the exit code after one line on stderr: 1 where the link could not be
    built or a rank failed, 130 when interrupted (everything it made is torn down by then)."""
    try:
        return 0, measure()
    except (NetbenchUnavailable, RanksFailed, FileNotFoundError) as err:
        print(f"{name}: {err}", file=sys.stderr)
        return 1, None
    except KeyboardInterrupt as err:
        print(f"{name}: interrupted ({err or 'SIGINT'}); everything it made is removed",
              file=sys.stderr)
        return 130, None
