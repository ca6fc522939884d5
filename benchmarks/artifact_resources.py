"""What the artifact's commands cost, measured: wall time, CPU time and peak memory of each
(GNU time's `-v`), for docs/artifact.md.

An artifact reviewer plans by the resources each command takes; estimates mislead (the
GPU-hours in docs/reproduce.md are estimates, and say so). Each command runs under
`/usr/bin/time -v` from the checkout's root; its report is kept beside the CSV
(results/bench/artifact_resources/<slug>.txt) and summed up in one CSV row: wall, user, system,
the peak resident set of the largest single process of the command's tree (GNU time's "Maximum
resident set size": ru_maxrss over the process and the descendants it waited for, not a sum),
the CPU, and the 1-minute load average before and after, since other work on the machine
(a study's training) stretches the wall time and not the CPU time. With --cwd the commands run
in another checkout, a fresh clone, whose first `make` target installs its venv.

    python scripts/bench_artifact_resources.py [--commands "make check-claims" ...]
"""

from __future__ import annotations

import argparse
import datetime
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from accordion_repro.engine.numerics import cpu_model
from accordion_repro.run_layout import PROJECT_ROOT

from .harness import write_csv

COMMANDS = ["make check-claims", "make figures", "make kick-the-tires"]
TIME = "/usr/bin/time"
FIELDS = {  # GNU time -v line -> our column
    "User time (seconds)": "user_s",
    "System time (seconds)": "sys_s",
    "Elapsed (wall clock) time (h:mm:ss or m:ss)": "wall_s",
    "Maximum resident set size (kbytes)": "max_rss_mib",
    "Exit status": "exit_status",
}


def _seconds(clock: str) -> float:
    """GNU time's h:mm:ss or m:ss.ss as seconds."""
    total = 0.0
    for part in clock.split(":"):
        total = total * 60 + float(part)
    return total


def parse_time_report(text: str) -> dict:
    """The columns of FIELDS from a `/usr/bin/time -v` report."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.strip().rpartition(": ")
        if key in FIELDS:
            found[FIELDS[key]] = value.strip()
    missing = sorted(set(FIELDS.values()) - set(found))
    if missing:
        raise ValueError(f"the time report lacks {', '.join(missing)}")
    return {"wall_s": round(_seconds(found["wall_s"]), 1),
            "user_s": float(found["user_s"]), "sys_s": float(found["sys_s"]),
            "cpu_s": round(float(found["user_s"]) + float(found["sys_s"]), 1),
            "max_rss_mib": round(int(found["max_rss_mib"]) / 1024, 1),
            "exit_status": int(found["exit_status"])}


def measure(command: str, report_dir: Path, cwd: Path = PROJECT_ROOT) -> dict:
    slug = re.sub(r"[^a-z0-9]+", "_", command.lower()).strip("_")[:60]
    report = report_dir / f"{slug}.txt"
    report_dir.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()[0]
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    print(f"$ {command}", flush=True)
    subprocess.run([TIME, "-v", "-o", str(report), *shlex.split(command)], cwd=cwd)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=cwd, capture_output=True,
                            text=True).stdout.strip()
    return {"command": command, **parse_time_report(report.read_text()),
            "checkout": "this one" if cwd == PROJECT_ROOT else "a fresh clone",
            "commit": commit,
            "load_1m_before": round(load_before, 2), "load_1m_after": round(os.getloadavg()[0], 2),
            "cpus": os.cpu_count(), "cpu_model": cpu_model(), "started_utc": started,
            "report": (report.relative_to(PROJECT_ROOT) if report.is_relative_to(PROJECT_ROOT)
                       else report).as_posix()}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python scripts/bench_artifact_resources.py",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--commands", nargs="+", default=COMMANDS)
    parser.add_argument("--cwd", type=Path, default=PROJECT_ROOT,
                        help="the checkout the commands run in (a fresh `git clone`, say: its "
                             "first `make` target installs; default: this checkout)")
    parser.add_argument("--out", type=Path,
                        default=PROJECT_ROOT / "results" / "bench" / "artifact_resources.csv")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not shutil.which(TIME):
        print(f"artifact resources: {TIME} is not installed (GNU time: apt-get install -y time)",
              file=sys.stderr)
        return 1
    rows = [measure(command, args.out.with_suffix(""), args.cwd.resolve()) for command in args.commands]
    write_csv(rows, args.out)
    failed = [row["command"] for row in rows if row["exit_status"] != 0]
    if failed:
        print(f"artifact resources: {', '.join(failed)} exited non-zero", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
