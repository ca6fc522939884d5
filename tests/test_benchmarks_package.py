"""benchmarks/ owns the benchmark harness; scripts/*.py are its and the package's command lines
(issue 39).

The benchmarks import each other as a package (no `sys.path` edits), from any directory, and
the ranks they start as subprocesses run `python -m accordion_repro.benchmarks.<module>` with options that
module's own parser accepts.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys

import pytest

from accordion_repro.benchmarks import harness
from conftest import REPO


def test_no_script_or_benchmark_edits_sys_path():
    for path in [*(REPO / "scripts").glob("*.py"), *(REPO / "benchmarks").rglob("*.py")]:
        assert "sys.path" not in path.read_text(), path


# scripts/wheelhouse.py runs on a plain python3 without this package installed (`make wheelhouse`)
STANDALONE_SCRIPTS = {"wheelhouse.py"}


def test_every_script_is_the_command_line_of_a_module():
    scripts = sorted(p for p in (REPO / "scripts").glob("*.py") if p.name not in STANDALONE_SCRIPTS)
    assert len(scripts) == 13 and len([p for p in scripts if p.name.startswith("bench_")]) == 11
    for path in scripts:
        text = path.read_text()
        found = re.search(r"^from ((benchmarks|accordion_repro)(\.\w+)+) import main$", text,
                          flags=re.M)
        assert found, path
        assert callable(importlib.import_module(found.group(1)).main)
        code = text.split('"""')[-1]  # after the docstring
        assert len([line for line in code.splitlines() if line.strip()]) <= 4, path


def test_the_package_imports_from_outside_the_repository(tmp_path):
    done = subprocess.run([sys.executable, "-c", "import accordion_repro.benchmarks.harness, "
                           "accordion_repro.benchmarks.ddp_step, accordion_repro.benchmarks.fsdp_traffic, "
                           "accordion_repro.benchmarks.netbench.ranks"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_rank_commands_run_a_module_whose_parser_takes_them(tmp_path):
    from accordion_repro.benchmarks import ddp_network, ddp_step, fsdp_traffic

    raw = tmp_path / "raw.json"
    argv = ddp_network._rank_argv(ddp_network.parse_args(["--only", "r2", "--topk", "0.01"]),
                                  0.25, raw)
    assert argv[:3] == [sys.executable, "-m", "accordion_repro.benchmarks.ddp_step"]
    args = ddp_step.parse_args(argv[3:])
    assert (args.env, args.raw, args.width, args.only, args.topk, args.compute) == (
        True, raw, 0.25, ["r2"], [0.01], True)
    argv = fsdp_traffic._rank_argv(fsdp_traffic.parse_args(["--widths", "0.5", "--ranks", "2"]),
                                   raw)
    assert argv[:3] == [sys.executable, "-m", "accordion_repro.benchmarks.fsdp_traffic"]
    args = fsdp_traffic.parse_args(argv[3:])
    assert (args.env, args.raw, args.widths, args.ranks) == (True, raw, [0.5], [2])


def test_interleave_times_every_configuration_once_per_round_after_the_warmup():
    calls = []

    def run(name):
        calls.append(name)
        return float(len(calls))

    samples, _ = harness.interleave({"a": (run, "a"), "b": (run, "b")}, warmup=2, steps=3)
    assert calls == ["a", "b"] * 5
    assert samples == {"a": [5.0, 7.0, 9.0], "b": [6.0, 8.0, 10.0]}
    row = harness.quantile_rows({"a": [0.001, 0.002, 0.003, 0.004, 0.005]})[0]
    assert (row["median_ms"], row["p25_ms"], row["p75_ms"], row["n"]) == pytest.approx(
        (3.0, 2.0, 4.0, 5))


def _sum_of_ranks(args, rank: int):
    import torch
    import torch.distributed as dist

    if args == "die" and rank == 1:
        raise SystemExit(3)
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    return float(total), dist.get_world_size(), torch.get_num_threads()


@pytest.mark.slow
@pytest.mark.distributed
def test_loopback_ranks_report_rank_zeros_record_and_a_dead_rank_stops_them():
    caller = os.environ.get("OMP_NUM_THREADS")
    assert harness.run_ranks(_sum_of_ranks, "sum", timeout=300) == (3.0, harness.WORLD, 1)
    assert os.environ.get("OMP_NUM_THREADS") == caller  # the ranks' setting, not the caller's
    # rank 1 exits with 3; rank 0, whose all-reduce then fails, may be gone before the harness
    # looks (exit 1, or -6: gloo aborts it in one run of a hundred) or not: the dead rank's code
    # is in the message either way, beside only non-zero ones
    with pytest.raises(RuntimeError, match=r"ranks exited with \[.*\] before reporting") as caught:
        harness.run_ranks(_sum_of_ranks, "die", timeout=300)
    codes = [int(c) for c in re.search(r"\[(.*)\]", str(caught.value)).group(1).split(",")]
    assert 3 in codes and 0 not in codes and len(codes) <= harness.WORLD, codes
