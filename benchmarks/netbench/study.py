"""Which committed runs the network benchmark turns into whole-run times.

A family is one of the paper's comparisons as the CPU study ran it: a static low-compression
run, a static high-compression run, Accordion switching between them, and the uncompressed
run (PowerSGD: Table 1; Top-K: Table 3; batch size: Figure 10, whose B_low is Table 1's dense
run). Every epoch of every run steps like one of the family's static runs (same level, same
global batch) or, where Accordion put some layers at each level, like a mix of the two; the
static runs' presets are what the benchmark re-runs through the link to time a step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from accordion_repro.analysis.layout import FIGURES, TABLES, TWINS
from accordion_repro.errors import ConfigError

DENSE, STATIC_LOW, STATIC_HIGH, ACCORDION = "dense", "static_low", "static_high", "accordion"
FAMILY_TITLES = {"powersgd": "PowerSGD", "topk": "Top-K", "batch": "Batch size"}
DENSE_PRESET = TABLES["table1"].cells[0].preset  # table1/resnet18_powersgd_dense


@dataclass(frozen=True)
class Run:
    """One committed run directory, read once."""

    path: Path
    preset: str
    scale: str
    label: str
    epochs: tuple[dict, ...]  # metrics.jsonl, in epoch order

    @property
    def signatures(self) -> set[tuple]:
        return {signature(e) for e in self.epochs}


def signature(epoch: dict) -> tuple:
    """How an epoch steps: its global batch and, when every layer had one level, that level
    (None for a mixed epoch; levels 'none' for an uncompressed one)."""
    levels = epoch.get("levels") or {"none": 1}
    level = next(iter(levels)) if len(levels) == 1 else None
    return (int(epoch["global_batch"]), level)


def read_run(path: Path) -> Run:
    path = Path(path)
    summary_file, metrics_file, resolved_file = (path / n for n in ("summary.json", "metrics.jsonl", "resolved.yaml"))
    for f in (summary_file, metrics_file, resolved_file):
        if not f.exists():
            raise ConfigError("schedule_from", f"{path} is not a run directory: no {f.name}")
    summary = json.loads(summary_file.read_text())
    if summary.get("status") != "completed":
        raise ConfigError("schedule_from", f"{path} did not complete (status {summary.get('status')!r})")
    resolved = yaml.safe_load(resolved_file.read_text())
    epochs = tuple(json.loads(line) for line in metrics_file.read_text().splitlines() if line.strip())
    run = resolved.get("run") or {}
    return Run(path=path, preset=str(run.get("name")), scale=str((resolved.get("scale") or {}).get("name")),
               label=str(run.get("label") or run.get("name")), epochs=epochs)


@dataclass(frozen=True)
class Family:
    name: str                 # powersgd | topk | batch
    runs: dict[str, Run]      # method -> run

    @property
    def static_runs(self) -> list[Run]:
        """The runs whose step the benchmark times (each steps one way all through)."""
        return [self.runs[m] for m in (DENSE, STATIC_LOW, STATIC_HIGH) if m in self.runs]

    def check(self) -> None:
        """Every run's pure epochs must step like one of the static runs: a schedule that
        visits a level no static run has cannot be timed."""
        for method in (STATIC_LOW, STATIC_HIGH):
            if method not in self.runs:
                raise ConfigError("runs", f"{FAMILY_TITLES[self.name]}: no {method} run to time a step of")
        for run in self.static_runs:
            if len(run.signatures) != 1:
                raise ConfigError("runs", f"{run.path}: a static run that changes level or batch "
                                          f"({sorted(map(str, run.signatures))})")
        known = {next(iter(r.signatures)) for r in self.static_runs}
        for run in self.runs.values():
            unknown = {s for s in run.signatures if s[1] is not None} - known
            if unknown:
                raise ConfigError("runs", f"{run.path} has epochs at {sorted(map(str, unknown))}, "
                                          f"which none of the family's static runs steps at")


def _cells(family: str) -> dict[str, str]:
    """method -> preset of the run behind each of the family's ResNet-18 CIFAR-10 cells (TWINS:
    Table 3's dense cell is Table 1's dense run). The batch family is Figure 10's, whose B_low
    is Table 1's dense run (its dense baseline too, so no dense entry)."""
    if family == "batch":
        cells = FIGURES["fig10"].cells
    else:
        table = "table1" if family == "powersgd" else "table3"
        cells = [c for c in TABLES[table].cells
                 if c.model == "resnet18" and c.dataset == "cifar10" and c.family == family]
    return {c.method: TWINS.get(c.preset, c.preset) for c in cells}


def _first_completed(runs_dir: Path, preset: str) -> Run | None:
    for seed_dir in sorted((runs_dir / preset).glob("seed*")):
        try:
            return read_run(seed_dir)
        except ConfigError:
            continue
    return None


def family_of(run: Run) -> str:
    """The family of an Accordion run, from its preset's cell."""
    for name in FAMILY_TITLES:
        if run.preset == _cells(name)[ACCORDION]:
            return name
    raise ConfigError("schedule_from", f"{run.path}: preset {run.preset!r} is not the Accordion cell of "
                                       f"Table 1, Table 3 or Figure 10 (ResNet-18, CIFAR-10)")


def study_families(runs_dir: Path, schedule_from: list[Path] = ()) -> list[Family]:
    """The three families from `runs_dir` (the first completed seed of each cell); a run in
    `schedule_from` (an Accordion run) takes the place of its family's."""
    replacements = [read_run(p) for p in schedule_from]
    families = []
    for name in FAMILY_TITLES:
        runs = {}
        for method, preset in _cells(name).items():
            run = _first_completed(Path(runs_dir), preset)
            if run is not None:
                runs[method] = run
        for run in replacements:
            if family_of(run) == name:
                runs[ACCORDION] = run
        if any(run.preset != DENSE_PRESET for run in runs.values()):  # more than the shared dense run
            family = Family(name, runs)
            family.check()
            families.append(family)
    if not families:
        raise ConfigError("runs", f"no completed run of Table 1, Table 3 or Figure 10 under {runs_dir}")
    return families
