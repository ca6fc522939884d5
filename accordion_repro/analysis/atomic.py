"""Figure writer that keeps rebuilds byte-identical and never leaves half a file."""

from __future__ import annotations

import os
from pathlib import Path

from accordion_repro.utils import atomic_write

# PDF and PNG writers stamp a creation date / software version by default; dropping them
# keeps a rebuild from the same runs byte-identical.
PDF_METADATA = {"CreationDate": None, "Producer": None, "Creator": None}
PNG_METADATA = {"Software": None}


def save_figure_atomic(figure, path: str | os.PathLike, *, dpi: int = 150) -> Path:
    """Save a matplotlib figure in the format named by the suffix (.png or .pdf)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    metadata = {"pdf": PDF_METADATA, "png": PNG_METADATA}.get(fmt)
    if metadata is None:
        raise ValueError(f"unsupported figure format {fmt!r} for {path}")
    return atomic_write(path, lambda tmp: figure.savefig(tmp, format=fmt, dpi=dpi, metadata=metadata))
