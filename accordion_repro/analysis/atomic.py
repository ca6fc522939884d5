"""Write outputs so that an interrupted build never leaves a half-written table or figure.

Every file goes to a temporary name in the destination folder (same file system) and is then
moved over the old one with os.replace, which is atomic on POSIX and Windows.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

# PDF and PNG writers stamp a creation date / software version by default; dropping them
# keeps a rebuild from the same runs byte-identical.
PDF_METADATA = {"CreationDate": None, "Producer": None, "Creator": None}
PNG_METADATA = {"Software": None}

_UMASK = os.umask(0)
os.umask(_UMASK)


def _temporary_beside(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(handle)
    os.chmod(name, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs are ordinary files
    return Path(name)


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    temporary = _temporary_beside(path)
    try:
        with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
            handle.write(text)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def save_figure_atomic(figure, path: str | os.PathLike, *, dpi: int = 150) -> Path:
    """Save a matplotlib figure in the format named by the suffix (.png or .pdf)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    metadata = {"pdf": PDF_METADATA, "png": PNG_METADATA}.get(fmt)
    if metadata is None:
        raise ValueError(f"unsupported figure format {fmt!r} for {path}")
    temporary = _temporary_beside(path)
    try:
        figure.savefig(temporary, format=fmt, dpi=dpi, metadata=metadata)
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path
