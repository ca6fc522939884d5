"""The shaped two-namespace link: shaping commands, guaranteed teardown, a measured all-reduce.

Tests that touch the kernel need root, iproute2 and tc; elsewhere they are skipped with the
reason. Every namespace a test makes is deleted in a `finally`, also when the test fails.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from accordion_repro.errors import ConfigError
from accordion_repro.benchmarks.netbench import netns
from accordion_repro.benchmarks.netbench.netns import (
    PREFIX,
    LinkSpec,
    NamespacePair,
    cleanup_leftovers,
    list_namespaces,
    missing_requirement,
    shaping_commands,
)

MISSING = missing_requirement()
needs_root_tc = pytest.mark.skipif(MISSING is not None, reason=f"netns tests: {MISSING}")


def host_links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout


# ---------------------------------------------------------------- no privileges needed


def test_linkspec_rejects_bad_values_naming_the_key():
    with pytest.raises(ConfigError, match="bandwidth"):
        LinkSpec(0)
    with pytest.raises(ConfigError, match="latency"):
        LinkSpec(1e8, -1e-3)
    assert LinkSpec(1e8, 5e-4).label == "100 Mbit/s, 0.5 ms"
    assert LinkSpec(1e9).label == "1 Gbit/s, 0 ms"


def test_shaping_commands_put_rate_under_delay():
    link = LinkSpec(100e6, 0.5e-3)
    with_delay = shaping_commands("veth0", link, with_delay=True)
    assert with_delay[0][:9] == ["tc", "qdisc", "replace", "dev", "veth0", "root", "handle", "1:",
                                 "netem"]
    assert "500us" in with_delay[0]
    assert with_delay[1][5:8] == ["parent", "1:1", "handle"]
    assert "tbf" in with_delay[1] and "100000000bit" in with_delay[1]
    (rate_only,) = shaping_commands("veth0", link, with_delay=False)
    assert "netem" not in rate_only and "tbf" in rate_only
    # the bucket must hold at least 1 ms of traffic at 1 Gbit/s or tbf caps the rate
    assert netns.tbf_burst_bytes(1e9) >= 1e9 / 8 * 1e-3


def test_missing_requirement_is_one_line_or_none():
    assert MISSING is None or (isinstance(MISSING, str) and "\n" not in MISSING)


# ---------------------------------------------------------------- root, ip and tc


@pytest.mark.slow
@needs_root_tc
def test_pair_is_created_isolated_and_torn_down():
    before = host_links()
    pair = NamespacePair("t1")
    try:
        pair.create()
        assert set(pair.namespaces) <= set(list_namespaces())
        assert host_links() == before, "the veth pair must live only inside our namespaces"
        routes = subprocess.run(["ip", "-n", pair.namespaces[0], "route"],
                                capture_output=True, text=True).stdout
        assert "default" not in routes and "10.77.0.0/30" in routes
    finally:
        pair.teardown()
    assert not set(pair.namespaces) & set(list_namespaces())
    assert host_links() == before


@pytest.mark.slow
@needs_root_tc
def test_cleanup_removes_only_leftovers_of_dead_owners():
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = f"{PREFIX}{dead.pid}-old-a"
    alive_owner = f"{PREFIX}1-live-a"  # pid 1 always exists: a concurrent run's namespace
    try:
        for name in (leftover, alive_owner):
            subprocess.run(["ip", "netns", "add", name], check=True)
        removed = cleanup_leftovers()
        assert leftover in removed and leftover not in list_namespaces()
        assert alive_owner in list_namespaces()
    finally:
        for name in (leftover, alive_owner):
            subprocess.run(["ip", "netns", "delete", name], capture_output=True)


PARENT_SCRIPT = textwrap.dedent("""
    import sys, time
    from accordion_repro.benchmarks.netbench.netns import NamespacePair, teardown_on_signals
    with teardown_on_signals():
        with NamespacePair("sig") as pair:
            child = pair.popen(1, ["sleep", "60"])
            print(" ".join(pair.namespaces), child.pid, flush=True)
            time.sleep(60)
""")


def _start_parent():
    parent = subprocess.Popen([sys.executable, "-c", PARENT_SCRIPT], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    ns_a, ns_b, child_pid = parent.stdout.readline().split()
    return parent, (ns_a, ns_b), int(child_pid)


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not os.path.exists(f"/proc/{pid}") or "State:\tZ" in open(f"/proc/{pid}/status").read():
            return True
        time.sleep(0.05)
    return False


@pytest.mark.slow
@needs_root_tc
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signal_to_parent_tears_everything_down(sig):
    parent, names, child = _start_parent()
    try:
        parent.send_signal(sig)
        parent.wait(timeout=15)
        assert _wait_gone(child), "the process inside the namespace survived"
        assert not set(names) & set(list_namespaces())
    finally:
        parent.kill()
        for name in names:
            netns.delete_namespace(name)


@pytest.mark.slow
@needs_root_tc
def test_sigkilled_parent_takes_its_ranks_and_next_start_cleans_up():
    parent, names, child = _start_parent()
    try:
        parent.kill()
        parent.wait(timeout=15)
        assert _wait_gone(child), "PDEATHSIG should kill the ranks with their parent"
        assert set(names) <= set(list_namespaces())  # SIGKILL cannot be caught...
        removed = cleanup_leftovers()  # ...so the next start removes them
        assert set(names) <= set(removed)
        assert not set(names) & set(list_namespaces())
    finally:
        for name in names:
            netns.delete_namespace(name)


# ---------------------------------------------------------------- benchmark plumbing (no root)


def test_missing_requirement_names_root_then_tc(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "root" in missing_requirement()
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(netns.shutil, "which", lambda tool: None if tool == "tc" else "/x")
    assert "`tc`" in missing_requirement()


def test_script_stops_at_once_with_one_line_when_requirements_are_missing(monkeypatch, capsys):
    from accordion_repro.benchmarks import network

    monkeypatch.setattr(network, "missing_requirement", lambda: "needs `tc` on PATH")
    assert network.main([]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "bench-network: needs `tc` on PATH"


def test_units_parse_rates_and_delays():
    from accordion_repro.benchmarks.netbench.netns import parse_bandwidth, parse_duration

    assert parse_bandwidth("100mbit") == 100e6
    assert parse_bandwidth("1Gbit") == 1e9
    assert parse_bandwidth("2.5e9") == 2.5e9
    assert parse_duration("0.5ms") == pytest.approx(5e-4)
    assert parse_duration("200us") == pytest.approx(2e-4)
    with pytest.raises(ConfigError, match="bandwidth"):
        parse_bandwidth("fast")
