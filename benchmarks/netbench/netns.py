"""Two private network namespaces joined by a veth pair, shaped with tc, always torn down.

Safety model: the namespaces hold only `lo` and one veth end each, addressed from a private /30
that exists nowhere else, with no default route; a process started inside them can reach the
other end and nothing beyond. Every object carries the fixed prefix plus the owning process id
(`accbench-<pid>-a`), so a run that was SIGKILLed is recognised (its owner is gone) and removed
by the next start, while a concurrent run on the same host is left alone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

from accordion_repro.errors import ConfigError
from accordion_repro.utils import die_with_parent, pid_alive

PREFIX = "accbench-"
SUBNET_ADDRESSES = ("10.77.0.1", "10.77.0.2")
SUBNET_PREFIX_LEN = 30
DEVICE_NAMES = ("accbench0", "accbench1")

# Rates and durations as people type them on a command line: 100mbit, 1gbit, 0.5ms.
_RATE_UNITS = {"": 1.0, "bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}
_TIME_UNITS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6}


def _parse(text: str, units: dict[str, float], *, key: str, example: str) -> float:
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    if not match or match.group(2) not in units:
        raise ConfigError(key, f"cannot read {text!r}; write e.g. {example}")
    return float(match.group(1)) * units[match.group(2)]


def parse_bandwidth(text: str, *, key: str = "bandwidth") -> float:
    """Bits per second from '100mbit', '1gbit', '2.5e9'."""
    return _parse(text, _RATE_UNITS, key=key, example="100mbit, 1gbit or 2.5e9 (bit/s)")


def parse_duration(text: str, *, key: str = "latency") -> float:
    """Seconds from '0.5ms', '200us', '0'."""
    return _parse(text, _TIME_UNITS, key=key, example="0.5ms, 200us or 0")


class NetbenchUnavailable(RuntimeError):
    """This host cannot build the shaped link; the message is one line saying what is missing."""


def missing_requirement() -> str | None:
    """One line naming what is missing to build namespaces and shape them, or None."""
    if os.geteuid() != 0:
        return "needs root: network namespaces, veth and tc need CAP_NET_ADMIN (run as root)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` on PATH (install iproute2)"
    return None


@dataclass(frozen=True)
class LinkSpec:
    """One direction of the emulated link; both directions are shaped the same way."""

    bandwidth_bps: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.bandwidth_bps > 0:
            raise ConfigError("bandwidth", f"must be > 0 bit/s, got {self.bandwidth_bps}")
        if self.latency_s < 0:
            raise ConfigError("latency", f"must be >= 0 s, got {self.latency_s}")

    @property
    def label(self) -> str:
        if self.bandwidth_bps >= 1e9:
            rate = f"{self.bandwidth_bps / 1e9:g} Gbit/s"
        else:
            rate = f"{self.bandwidth_bps / 1e6:g} Mbit/s"
        return f"{rate}, {self.latency_s * 1e3:g} ms"


@dataclass(frozen=True)
class ShapingReport:
    """What the kernel actually accepted: netem is often compiled out of small kernels."""

    link: LinkSpec
    latency_applied: bool
    note: str = ""

    @property
    def effective_latency_s(self) -> float:
        return self.link.latency_s if self.latency_applied else 0.0

    @property
    def label(self) -> str:
        """The link as shaped, so a table never claims a delay the kernel refused."""
        if self.latency_applied or self.link.latency_s == 0:
            return self.link.label
        return f"{LinkSpec(self.link.bandwidth_bps, 0.0).label} (no netem)"


def tbf_burst_bytes(bandwidth_bps: float) -> int:
    """Bucket of ~2 ms of traffic (at least 32 KiB) so the token timer never caps the rate."""
    return max(32 * 1024, int(bandwidth_bps / 8 * 2e-3))


def shaping_commands(device: str, link: LinkSpec, *, with_delay: bool) -> list[list[str]]:
    """tc argv lists for one veth end: netem (delay) at the root with tbf (rate) below it."""
    rate = link.bandwidth_bps
    # the queue holds ~100 ms of traffic (at least 1 MiB): deep enough that TCP is shaped, not dropped
    tbf = ["tbf", "rate", f"{int(rate)}bit", "burst", str(tbf_burst_bytes(rate)),
           "limit", str(max(1 << 20, int(rate / 8 * 0.1)))]
    if not with_delay:
        return [["tc", "qdisc", "replace", "dev", device, "root", "handle", "1:", *tbf]]
    delay = f"{link.latency_s * 1e6:.0f}us"
    return [
        ["tc", "qdisc", "replace", "dev", device, "root", "handle", "1:", "netem",
         "delay", delay, "limit", "100000"],
        ["tc", "qdisc", "add", "dev", device, "parent", "1:1", "handle", "10:", *tbf],
    ]


def _run(argv: Sequence[str], *, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        raise NetbenchUnavailable(
            f"`{' '.join(argv)}` failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
        )
    return proc


def list_namespaces() -> list[str]:
    out = _run(["ip", "netns", "list"], check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _kill_pids(pids: Sequence[int], grace_s: float = 2.0) -> None:
    """SIGTERM, then SIGKILL whatever is still there after the grace period."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def delete_namespace(namespace: str) -> None:
    """Kill what still runs inside, then delete; the veth end dies with its namespace."""
    out = _run(["ip", "netns", "pids", namespace], check=False).stdout
    _kill_pids([int(tok) for tok in out.split() if tok.isdigit()])
    _run(["ip", "netns", "delete", namespace], check=False)


def cleanup_leftovers(prefix: str = PREFIX) -> list[str]:
    """Delete namespaces with our prefix whose owning process is gone (a crashed or killed run)."""
    removed = []
    for name in list_namespaces():
        if not name.startswith(prefix):
            continue
        match = re.match(rf"^{re.escape(prefix)}(\d+)-\w+-[ab]$", name)
        owner = int(match.group(1)) if match else None
        if owner is not None and (owner == os.getpid() or pid_alive(owner)):
            continue
        delete_namespace(name)
        removed.append(name)
    return removed


class NamespacePair:
    """Namespaces `a` and `b`, a veth pair between them, addresses from a private /30.

    Use as a context manager (or call create/teardown): teardown kills every process left in
    the namespaces and deletes them, and is safe to call twice.
    """

    def __init__(self, tag: str = "run"):
        if not re.fullmatch(r"\w{1,12}", tag):
            raise ValueError(f"tag must be 1-12 word characters, got {tag!r}")
        stem = f"{PREFIX}{os.getpid()}-{tag}"
        self.namespaces = (f"{stem}-a", f"{stem}-b")
        self.devices = DEVICE_NAMES
        self.addresses = SUBNET_ADDRESSES
        self._created: list[str] = []
        self._children: list[subprocess.Popen] = []

    def __enter__(self) -> "NamespacePair":
        self.create()
        return self

    def __exit__(self, *exc) -> None:
        self.teardown()

    def create(self) -> None:
        reason = missing_requirement()
        if reason:
            raise NetbenchUnavailable(reason)
        for ns in self.namespaces:
            _run(["ip", "netns", "add", ns])
            self._created.append(ns)
        ns_a, ns_b = self.namespaces
        # Both ends are created directly inside their namespaces: nothing appears on the host.
        _run(["ip", "link", "add", self.devices[0], "netns", ns_a, "type", "veth",
              "peer", "name", self.devices[1], "netns", ns_b])
        for ns, dev, addr in zip(self.namespaces, self.devices, self.addresses):
            _run(["ip", "-n", ns, "addr", "add", f"{addr}/{SUBNET_PREFIX_LEN}", "dev", dev])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "link", "set", dev, "up"])

    def shape(self, link: LinkSpec) -> ShapingReport:
        """Shape both directions; fall back to rate-only when the kernel lacks netem."""
        if link.latency_s > 0 and self._shape(link, with_delay=True, check=False):
            return ShapingReport(link=link, latency_applied=True)
        self._shape(link, with_delay=False, check=True)
        note = "netem is not available in this kernel: latency not added (rate only)"
        return ShapingReport(link=link, latency_applied=False, note=note if link.latency_s > 0 else "")

    def _shape(self, link: LinkSpec, *, with_delay: bool, check: bool) -> bool:
        """tc on both ends; a failing command raises (check) or is undone (returns False)."""
        for ns, dev in zip(self.namespaces, self.devices):
            for argv in shaping_commands(dev, link, with_delay=with_delay):
                if _run(["ip", "netns", "exec", ns, *argv], check=check).returncode != 0:
                    for ns2, dev2 in zip(self.namespaces, self.devices):
                        _run(["ip", "netns", "exec", ns2, "tc", "qdisc", "del", "dev", dev2,
                              "root"], check=False)
                    return False
        return True

    def popen(self, side: int, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              stdout=None, stderr=None, cwd: str | None = None) -> subprocess.Popen:
        """Start argv inside namespace `side` (0 = a, 1 = b); it dies if this process dies."""
        parent = os.getpid()
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.namespaces[side], *argv],
            env=dict(env) if env is not None else None, stdout=stdout, stderr=stderr, cwd=cwd,
            start_new_session=True, preexec_fn=lambda: die_with_parent(parent_pid=parent),
        )
        self._children.append(proc)
        return proc

    def stop_children(self) -> None:
        for proc in self._children:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 3.0
        for proc in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self._children.clear()

    def teardown(self) -> None:
        self.stop_children()
        for ns in reversed(self._created):
            delete_namespace(ns)
        self._created.clear()


@contextlib.contextmanager
def teardown_on_signals(
    signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
) -> Iterator[None]:
    """Turn SIGINT/SIGTERM/SIGHUP into exceptions so every `finally` and `__exit__` runs."""

    def raise_exit(signum, _frame):
        raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")

    previous = {sig: signal.signal(sig, raise_exit) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
