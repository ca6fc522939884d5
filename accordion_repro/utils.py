"""Small helpers shared across packages (one place for each)."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write(path: str | os.PathLike, write: Callable[[Path], None]) -> Path:
    """Let `write` fill a temporary file beside `path`, then rename it over `path`.

    Readers never see half a file, and an interrupted write leaves the old file in place
    (os.replace is atomic on one file system).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    temporary = Path(name)
    try:
        os.chmod(temporary, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are ordinary files
        write(temporary)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_bytes(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (it may belong to another user)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def adopt_environment(environ: Mapping[str, str]) -> None:
    """Make `environ` this process's whole environment. A process forked from a server (a rank
    from launch's forkserver, a test's rank or CLI from the harness's) starts with the server's
    environment, taken when the server started; it takes its starter's, as a spawned one would.
    That includes TMPDIR: the temp dir the server had looked up is forgotten, so that
    `tempfile` looks it up again from the new environment."""
    os.environ.clear()
    os.environ.update(environ)
    tempfile.tempdir = None


def die_with_parent(sig: int = signal.SIGKILL, parent_pid: int | None = None) -> None:
    """In a child (a preexec_fn, or first thing in a spawned rank), Linux only: the child gets
    `sig` when its parent dies, even by SIGKILL, so no rank or daemon outlives its starter.
    With `parent_pid`, a child whose parent died before the request took effect exits now."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # PR_SET_PDEATHSIG
    if parent_pid is not None and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)  # as if the request had been in place when the parent died
        os._exit(1)


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"model": {"name": "resnet18"}} -> {"model.name": "resnet18"}; lists stay values. The
    run directory check and the analysis name a config's keys alike."""
    flat: dict[str, Any] = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, prefix=f"{name}."))
        else:
            flat[name] = value
    return flat
