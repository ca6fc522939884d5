"""Decoded JPEG datasets kept on disk, so 60,000 images are decoded once, not per rank and run.

Decoding the whole of CIFAR-10 from JPEG takes 30 s to over 2 minutes on a 2-core machine. The
first process to need a file decodes it and stores the arrays under the cache directory; every
later process (the other ranks, later runs) loads them in a fraction of a second.

A cache entry is keyed by the source file's size and SHA-256, so an edited or replaced file gets
a new entry and a stale one is never read. It is written to a temporary name and renamed into
place, so a half-written entry is never visible; an entry that fails to load or whose recorded
source does not match is decoded again. Concurrent processes wait on a lock file instead of
decoding the same file twice.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from ..utils import atomic_write

ENV_VAR = "ACCORDION_CACHE_DIR"


def default_cache_dir() -> Path:
    """$ACCORDION_CACHE_DIR, else $XDG_CACHE_HOME/accordion_repro, else ~/.cache/accordion_repro."""
    if os.environ.get(ENV_VAR):
        return Path(os.environ[ENV_VAR])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "accordion_repro"


def file_digest(path: str | os.PathLike) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _read_entry(path: Path, size: int, digest: str) -> dict[str, np.ndarray] | None:
    """The entry's arrays, or None when it is absent, unreadable or for another source."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        if str(arrays.pop("_source_sha256")) != digest or int(arrays.pop("_source_size")) != size:
            raise ValueError("recorded source does not match")
        return arrays
    except Exception as exc:  # a damaged entry is rebuilt, never used
        print(f"warning: ignoring the unusable decode cache {path} ({type(exc).__name__}: {exc}); "
              f"decoding again", file=sys.stderr)
        return None


def cached_decode(source: str | os.PathLike, decode: Callable[[], dict[str, np.ndarray]],
                  cache_dir: str | os.PathLike | None) -> dict[str, np.ndarray]:
    """`decode()`'s arrays for `source`, from the cache when a valid entry exists.

    `cache_dir=None` uses default_cache_dir(). When the cache cannot be written (read-only
    disk), the arrays are decoded in memory and a warning says so.
    """
    source = Path(source)
    size, digest = source.stat().st_size, file_digest(source)
    root = Path(cache_dir) if cache_dir else default_cache_dir()
    path = root / "decoded" / f"{source.stem}-{size}-{digest[:20]}.npz"
    found = _read_entry(path, size, digest)
    if found is not None:
        return found
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path.with_suffix(".lock"), "a+")
    except OSError as exc:
        print(f"warning: decode cache {root} is not writable ({exc}); decoding {source.name} "
              f"in memory (set dataset.cache_dir or ${ENV_VAR})", file=sys.stderr)
        return decode()
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be decoding this file now
        found = _read_entry(path, size, digest)
        if found is not None:
            return found
        start = time.perf_counter()
        print(f"decoding {source.name} once into {path} ...", file=sys.stderr, flush=True)
        arrays = decode()
        atomic_write(path, lambda tmp: _save(tmp, arrays, size, digest))
        print(f"decoded {source.name} in {time.perf_counter() - start:.1f} s", file=sys.stderr,
              flush=True)
        return arrays


def _save(tmp: Path, arrays: dict[str, np.ndarray], size: int, digest: str) -> None:
    with open(tmp, "wb") as f:  # a file object: np.savez would append ".npz" to a bare name
        np.savez(f, _source_sha256=np.array(digest), _source_size=np.array(size), **arrays)
