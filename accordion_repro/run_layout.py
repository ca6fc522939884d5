"""The run directory's layout (docs/run_directory.md): the one place its file names, and the
seed folder of a study's runs, are spelled. Every module that reads or writes a run asks here.

The directory's own path (`<runs>/<scale>/<run.name>/<overrides>seed<seed>`) is Hydra's, written
once in conf/config.yaml (`hydra.sweep.subdir`, which `hydra.run.dir` reuses; the overrides
through config.py's `acc.subdir` resolver); a study, which passes no overrides and names
`<runs>/<scale>` as its folder, puts each run at `<runs>/<run.name>/seed<seed>` (study_run_dir).
"""

from __future__ import annotations

from pathlib import Path

RESOLVED = "resolved.yaml"     # the whole resolved config of the run
METRICS = "metrics.jsonl"      # one line per epoch
SUMMARY = "summary.json"       # status, totals, numerics
CHECKPOINTS = "checkpoints"    # folder of the resumable state
LAST_CHECKPOINT = "last.pt"    # in CHECKPOINTS
LOCK = ".lock"                 # the job holding the directory
TIMINGS = "timings.csv"        # a study's wall times, beside its runs

# Where the configs are and where results/ goes. A checkout holds conf/ and results/ beside the
# package; an installed wheel holds the configs inside it (accordion_repro/conf, pyproject.toml's
# package-dir) and writes results/ under the working directory.
PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT = PACKAGE_DIR.parent if (PACKAGE_DIR.parent / "conf" / "config.yaml").is_file() else None
CONF_DIR = PACKAGE_DIR.parent / "conf" if CHECKOUT else PACKAGE_DIR / "conf"
PROJECT_ROOT = CHECKOUT or Path.cwd()


def seed_folder(seed: int) -> str:
    return f"seed{seed}"


def study_run_dir(runs: Path, run_name: str, seed: int) -> Path:
    """Where a study (reproduce_cpu.py, which passes no overrides) keeps one run."""
    return Path(runs) / run_name / seed_folder(seed)
