"""Stop requests: a signal sets a flag, the training loop stops after its current step.

The handler only records the signal; the trainer asks `requested()` between steps and the ranks
agree (one tiny all-reduce) so that every rank stops after the same step. A second signal (more
than a second after the first: Ctrl-C reaches a rank both from the terminal and from its
launcher) ends the process at once, for a job that must not wait.
"""

from __future__ import annotations

import os
import signal
import time

_state = {"signal": 0, "at": 0.0}
FORCE_AFTER_S = 1.0


def _handler(signum, frame):
    if _state["signal"]:
        if time.monotonic() - _state["at"] > FORCE_AFTER_S:
            os._exit(128 + signum)
        return
    request(signum)


def request(signum: int) -> None:
    """Ask to stop as `signum` would (a rank told by its launcher of a signal it missed)."""
    if not _state["signal"]:
        _state.update(signal=int(signum), at=time.monotonic())


def install(signals) -> None:
    """Make each of `signals` a stop request."""
    _state["signal"] = 0
    for sig in signals:
        signal.signal(sig, _handler)


def requested() -> int:
    """The signal number that asked to stop, or 0."""
    return _state["signal"]
