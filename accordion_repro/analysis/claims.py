"""`make check-claims`: every numbered claim of docs/artifact.md checked against the evidence.

An artifact reviewer needs each claim with the command that checks it, the output it should
give and the tolerance. The claims are data (docs/claims.yaml); this module recomputes each one
and prints one line per claim, PASS or FAIL with the difference, so that a number in the docs
that no longer follows from the committed runs is caught. A claim on runs is recomputed: the
tables are rebuilt from the run directories (build_all, tables only) into a temporary folder,
never read from the committed tables, which the runs might no longer give. A benchmark's number
is a measurement and is read from its committed CSV; a fidelity claim runs its tests.

    python -m accordion_repro.analysis.claims [--runs results/runs] [--only C1 C5] [--markdown]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path

import yaml

from accordion_repro.run_layout import PROJECT_ROOT

CLAIMS_FILE = PROJECT_ROOT / "docs" / "claims.yaml"
CHECKS = ("runs", "bench", "tests")
_CLAIM_KEYS = {"id", "claim", "stated", "check", "command", "table", "select", "pivot", "values",
               "tolerance", "file", "tests"}


@dataclass(frozen=True)
class Claim:
    id: str
    claim: str
    stated: str
    check: str
    command: str
    table: str = ""          # runs: results/tables/<table>.csv as rebuilt
    file: str = ""           # bench: results/bench/<file>.csv
    select: dict = field(default_factory=dict)
    pivot: str = ""          # a long table's column naming the statistic (fig2_paired's kind)
    values: dict = field(default_factory=dict)   # column -> the number as the docs print it
    tolerance: dict = field(default_factory=dict)
    tests: tuple = ()

    def allowed(self, column: str) -> Decimal:
        """Half a unit of the last printed digit, unless the claim sets its own tolerance."""
        if column in self.tolerance:
            return Decimal(str(self.tolerance[column]))
        return Decimal(1).scaleb(Decimal(self.values[column]).as_tuple().exponent) / 2


def load_claims(path: Path = CLAIMS_FILE) -> list[Claim]:
    """The claims of `path`, refused in one line where one is malformed."""
    claims = []
    for entry in yaml.safe_load(Path(path).read_text()):
        where = f"{path}: claim {entry.get('id', '?')}"
        unknown = set(entry) - _CLAIM_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}")
        if entry.get("check") not in CHECKS:
            raise ValueError(f"{where}: check must be one of {', '.join(CHECKS)}")
        if entry["check"] != "tests" and not entry.get("values"):
            raise ValueError(f"{where}: names no values")
        entry = {**entry, "values": {k: str(v) for k, v in entry.get("values", {}).items()},
                 "select": {k: str(v) for k, v in entry.get("select", {}).items()},
                 "tests": tuple(entry.get("tests", ()))}
        claims.append(Claim(**entry))
    ids = [c.id for c in claims]
    if ids != [f"C{i}" for i in range(1, len(ids) + 1)]:
        raise ValueError(f"{path}: the claims must be numbered C1..C{len(ids)} in order, got {ids}")
    return claims


def _rows(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _measured(claim: Claim, rows: list[dict]) -> dict[str, str]:
    """The claim's columns in the row its `select` names (with `pivot`, one row per statistic)."""
    chosen = [r for r in rows if all(r.get(k) == v for k, v in claim.select.items())]
    if claim.pivot:
        return {r[claim.pivot]: r["value"] for r in chosen if r[claim.pivot] in claim.values}
    if len(chosen) != 1:
        raise LookupError(f"{len(chosen)} rows match {claim.select}")
    return {column: chosen[0].get(column, "") for column in claim.values}


def _compare(claim: Claim, measured: dict[str, str]) -> tuple[bool, str]:
    parts, ok = [], True
    for column, stated in claim.values.items():
        got = measured.get(column, "")
        try:
            diff = abs(Decimal(got) - Decimal(stated))
        except ArithmeticError:  # a word (matches: yes/no) or nothing at all
            good = got == stated
            parts.append(f"{column} {stated}" + ("" if good else f" but got {got or 'nothing'}"))
            ok &= good
            continue
        good = diff <= claim.allowed(column)
        ok &= good
        parts.append(f"{column} {stated} vs {_shown(got, stated)} (diff {_shown(diff, stated)}"
                     f"{'' if good else f' > {claim.allowed(column)}'})")
    return ok, "; ".join(parts)


def _shown(value, like: str) -> str:
    """`value` with two more decimals than `like` prints (none for a whole number)."""
    exponent = Decimal(like).as_tuple().exponent
    return str(Decimal(value).quantize(Decimal(1).scaleb(exponent - 2 if exponent < 0 else 0)))


def rebuilt_tables(runs: Path, out: Path) -> Path:
    """Every table as `make figures` builds it from `runs`, into out/tables (no figures)."""
    from accordion_repro.analysis.build import build_all

    build_all(runs, out, figures=False)
    return out / "tables"


def check(claim: Claim, tables: Path | None, bench: Path, python: str = sys.executable) -> tuple[bool, str]:
    """(passed, what was compared) for one claim."""
    try:
        if claim.check == "runs":
            return _compare(claim, _measured(claim, _rows(tables / f"{claim.table}.csv")))
        if claim.check == "bench":
            return _compare(claim, _measured(claim, _rows(bench / f"{claim.file}.csv")))
    except (LookupError, OSError) as err:
        return False, f"no value to compare: {err}"
    done = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *claim.tests],
                          cwd=PROJECT_ROOT, capture_output=True, text=True)
    last = (done.stdout.strip().splitlines() or ["no output"])[-1]
    return done.returncode == 0, f"{len(claim.tests)} test ids: {last}"


def markdown(claims: list[Claim]) -> str:
    """The claims table of docs/artifact.md (tests/test_artifact.py keeps the two equal)."""
    lines = ["| id | claim | stated in | checked by | produced by |", "|---|---|---|---|---|"]
    how = {"runs": "recomputed from results/runs ({})", "bench": "read from results/bench/{}.csv",
           "tests": "{}"}
    for c in claims:
        target = {"runs": f"`{c.table}`", "bench": c.file,
                  "tests": "<br>".join(f"`{t}`" for t in c.tests)}[c.check]
        lines.append(f"| {c.id} | {c.claim} | {c.stated} | {how[c.check].format(target)} | "
                     f"`{c.command}` |")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m accordion_repro.analysis.claims",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=PROJECT_ROOT / "results" / "runs",
                        help="the run directories the run claims are recomputed from")
    parser.add_argument("--bench", type=Path, default=PROJECT_ROOT / "results" / "bench",
                        help="the benchmark CSVs the benchmark claims are read from")
    parser.add_argument("--claims", type=Path, default=CLAIMS_FILE)
    parser.add_argument("--only", nargs="+", metavar="ID", help="check these claims only")
    parser.add_argument("--markdown", action="store_true",
                        help="print docs/artifact.md's claims table instead of checking")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    claims = load_claims(args.claims)
    if args.markdown:
        print(markdown(claims))
        return 0
    if args.only:
        unknown = sorted(set(args.only) - {c.id for c in claims})
        if unknown:
            print(f"error: --only: no claim {', '.join(unknown)} in {args.claims}", file=sys.stderr)
            return 2
        claims = [c for c in claims if c.id in args.only]
    if not args.runs.is_dir():
        print(f"error: --runs: {args.runs} is not a folder", file=sys.stderr)
        return 2
    failed = 0
    with tempfile.TemporaryDirectory(prefix="claims-") as temp:
        tables = rebuilt_tables(args.runs, Path(temp)) if any(c.check == "runs" for c in claims) else None
        for claim in claims:
            ok, detail = check(claim, tables, args.bench)
            failed += not ok
            print(f"{claim.id:<4} {'PASS' if ok else 'FAIL'}  {detail}", flush=True)
    print(f"{len(claims) - failed} of {len(claims)} claims hold" + (f"; {failed} FAIL" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
