"""The package's non-torch dependencies as wheels for an offline GPU node (`make wheelhouse`).

    python scripts/wheelhouse.py [--python-version 3.12] [--out wheelhouse] [--have numpy ...]

Run it where PyPI is reachable; copy the repository with its wheelhouse/ to the node and
install there with no index, into the environment that already has the node's torch:

    python3 -m pip install --no-index --find-links wheelhouse -e '.[suite]'

pip then keeps the node's torch (pyproject asks for torch>=2.1, a range) and takes everything
else from the folder. Wheels are for CPython `--python-version` on manylinux x86_64, at the
versions constraints.txt pins where that Python has them. Packages the node already has are
left out (`--have`, default: the scientific stack of a typical torch node, numpy, pandas,
matplotlib and pillow, which alone are about 45 MB of the 77 MB); pass `--have` with nothing
to take them too. omegaconf's parser runtime (antlr4-python3-runtime 4.9) exists only as a
source archive: it is built here into a pure-Python wheel, so the node builds nothing.

The folder must stay under --limit-mib (64 MiB by default): the script says its size, and fails
above the limit. It then resolves the requirements again from the folder alone (`pip install
--dry-run --no-index`), so a missing wheel shows here, not on the node.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TORCH = {"torch", "torchvision"}
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "linux_x86_64", "any")
SOURCE_ONLY = ("antlr4-python3-runtime==4.9.*",)  # omegaconf 2.3's pin; no wheel on PyPI


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower().replace("_", "-")


def requirements(have: set[str]) -> list[str]:
    """pyproject's dependencies and its `suite` extra (the CLI, Hydra, the tables) less torch,
    torchvision and what the node has, and its build requirements (setuptools: `pip
    install -e .` builds in an isolated environment, which offline can only fill from the
    folder)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    deps = (pyproject["project"]["dependencies"]
            + pyproject["project"]["optional-dependencies"]["suite"]
            + pyproject["build-system"]["requires"])
    return [d for d in deps if _name(d) not in TORCH | have]


def constraints() -> list[str]:
    """constraints.txt's pins less torch's (the node has its own)."""
    lines = (REPO / "constraints.txt").read_text().splitlines()
    return [line for line in lines
            if line.strip() and not line.startswith("#") and _name(line) not in TORCH]


def _target(python_version: str) -> list[str]:
    abi = "cp" + python_version.replace(".", "")
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            "--abi", abi, "--abi", "abi3", "--abi", "none",
            *[arg for platform in PLATFORMS for arg in ("--platform", platform)]]


def _pip(*args: str) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if done.returncode:
        lines = [l for l in done.stderr.splitlines() if "is ignored" not in l]
        raise SystemExit(f"wheelhouse: pip {args[0]} failed: {' '.join(lines[-3:])}")


def size_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file()) / 2**20


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python-version", default="3.12")
    parser.add_argument("--out", type=Path, default=REPO / "wheelhouse")
    parser.add_argument("--have", nargs="*", default=["numpy", "pandas", "matplotlib", "pillow"],
                        help="packages the node has already (left out); none: take all")
    parser.add_argument("--limit-mib", type=float, default=64.0)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    wanted = requirements({_name(h) for h in args.have})
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as pins:
        pins.write("\n".join(constraints()) + "\n")
        pins.flush()
        # the source-only package, built once into a pure-Python wheel that any Python 3 takes
        _pip("wheel", "--quiet", "--no-deps", "--wheel-dir", str(args.out), *SOURCE_ONLY)
        _pip("download", "--quiet", *_target(args.python_version), "--find-links", str(args.out),
             "--constraint", pins.name, "--dest", str(args.out), *wanted)
    size = size_mib(args.out)
    # everything resolves from the folder alone, for that Python, with no index
    with tempfile.TemporaryDirectory() as empty:
        _pip("install", "--quiet", "--dry-run", "--ignore-installed", "--no-index",
             "--find-links", str(args.out), *_target(args.python_version), "--target", empty,
             *wanted)
    wheels = sorted(p.name for p in args.out.glob("*.whl"))
    print(f"wheelhouse: {len(wheels)} wheels for CPython {args.python_version} manylinux x86_64, "
          f"{size:.1f} MiB in {args.out} (left out: torch, torchvision"
          + (f", {', '.join(args.have)}" if args.have else "") + ")")
    if size > args.limit_mib:
        print(f"wheelhouse: {size:.1f} MiB is above the {args.limit_mib:g} MiB limit",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
