"""The benchmark loop and the assembly of its tables.

`measure` does the timing: the unshaped pair first, then per link a fresh shaped pair; on
each, a calibration and the epochs of every static configuration; on the first link also one
short Accordion schedule per family, run end to end as the check of the combination. What it
measured is kept raw (results/bench/network_raw.json, rewritten after every link, so an
interrupted benchmark keeps it), and `assemble` turns raw measurements and the committed runs
into every row of the report, so the tables can be rebuilt from that file without a link.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from .bench import (LinkCalibration, StepTime, calibrate, link_calibration,
                                            link_pair, predicted_step, run_trainer, step_overrides, steps_for)
from .netns import LinkSpec, ShapingReport, cleanup_leftovers, teardown_on_signals
from .study import ACCORDION, DENSE, Family, Run, signature
from .wholerun import WholeRun, run_time, schedule_trace, steps_at, whole_runs

# The end-to-end check: a short Accordion run that decides every epoch (in a run this short
# the LR decays every epoch, and the paper's "LR decays -> low compression" rule would pin it).
CHECK_EPOCHS = 5
CHECK_SCHEDULE = ("schedule.interval=1", "schedule.lr_decay_rule=false")


@dataclass(frozen=True)
class StepRow:
    link: str
    preset: str
    level: str
    step: StepTime
    fast: StepTime               # the same configuration on the unshaped pair
    model_s: float
    study_bytes_per_step: float  # what the study's run logged, for the agreement check

    @property
    def model_error(self) -> float:
        return self.model_s / self.step.step_s - 1.0


def step_why(s: StepRow) -> str:
    """Which term a step's model error comes from, from the measured parts of the step."""
    compute = s.step.compute_s - s.fast.compute_s
    added = (s.step.step_s - s.step.compute_s) - (s.fast.step_s - s.fast.compute_s)
    modelled = s.model_s - s.fast.step_s
    if abs(compute) >= abs(added - modelled):
        return (f"compute (forward, backward, optimizer) took {compute * 1e3:+.0f} ms against the "
                f"same step on the unshaped pair: run-to-run variation of this 2-core host, not a "
                f"network term the model lacks")
    return (f"the link added {added * 1e3:.0f} ms to the step's communication, the model "
            f"{modelled * 1e3:.0f} ms: in training gloo's collectives run "
            f"{'slower' if added > modelled else 'faster'} than in the calibration probe, which "
            f"runs on idle cores (at this rate the kernel's and gloo's CPU work competes with the "
            f"training threads for the 2 cores)")


def run_why(row: WholeRun, steps: dict[tuple, float], step_rows: dict[tuple, StepRow]) -> str:
    """What the model misses on one whole run: its gap (model - measured) is the sum over the
    static configurations its epochs ran at of steps x that step's gap (wholerun.steps_at), so
    name the configuration with the largest share and the term its step's error comes from."""
    gaps = {sig: n * (step_rows[sig].model_s - step_rows[sig].step.step_s)
            for sig, n in steps.items() if n}
    top = max(gaps, key=lambda sig: abs(gaps[sig]))
    s = step_rows[top]
    share = abs(gaps[top]) / sum(abs(g) for g in gaps.values())
    where = (f"all from its {s.preset} steps" if len(gaps) == 1 else
             f"{share:.0%} of |gap| from its {steps[top]:,.0f} step-equivalents at {s.preset}")
    return (f"model {row.model_error:+.0%}, {where} (step model {s.model_error:+.0%}): "
            f"{step_why(s)}")


@dataclass(frozen=True)
class CheckRow:
    link: str
    family: str
    preset: str
    schedule: str
    measured_s: float   # the run's own epoch times (epochs after the first)
    combined_s: float   # its logged schedule x the step times of the same link

    @property
    def error(self) -> float:
        return self.combined_s / self.measured_s - 1.0


@dataclass
class BenchmarkResult:
    fast: LinkCalibration | None = None
    calibrations: list[LinkCalibration] = field(default_factory=list)
    steps: list[StepRow] = field(default_factory=list)
    rows: list[WholeRun] = field(default_factory=list)
    checks: list[CheckRow] = field(default_factory=list)
    fast_steps: dict = field(default_factory=dict)   # preset -> StepTime on the unshaped pair
    notes: list[str] = field(default_factory=list)
    command: str = ""


def static_runs(families: Sequence[Family]) -> list[Run]:
    """Each static configuration once (the dense run serves three families)."""
    seen: dict[str, Run] = {}
    for family in families:
        for run in family.static_runs:
            seen.setdefault(run.preset, run)
    return list(seen.values())


def _level(run: Run) -> str:
    batch, level = signature(run.epochs[0])
    return f"B {batch}, {level}"


def measure(links: Sequence[LinkSpec], families: Sequence[Family], *, steps: int, out_dir: Path,
            timeout_s: float, check: bool = True, command: str = "",
            save: Callable[[dict], None] = lambda raw: None,
            log: Callable[[str], None] = print) -> dict:
    """Raises KeyboardInterrupt on SIGINT/SIGTERM/SIGHUP after everything is torn down."""
    raw: dict = {"command": command, "steps": steps, "links": []}
    removed = cleanup_leftovers()
    if removed:
        log(f"removed leftovers of an earlier run: {' '.join(removed)}")
    configs = static_runs(families)
    work = out_dir / "tmp" / "network"

    def time_all(pair, link_dir: Path, label: str) -> dict[str, list[dict]]:
        epochs = {}
        for run in configs:
            run_dir = link_dir / run.preset.replace("/", "_")
            overrides = step_overrides(run, steps_for(int(run.epochs[0]["global_batch"]), steps), run_dir)
            epochs[run.preset] = run_trainer(pair, overrides, run_dir, timeout_s=timeout_s)
            step = StepTime.from_epochs(epochs[run.preset][1:])  # the first epoch is the warm-up
            log(f"[{label}] {run.preset} ({_level(run)}): {step.step_s * 1e3:.0f} ms/step")
        return epochs

    with teardown_on_signals():
        pair, _ = link_pair(None, "fast")
        try:
            raw["fast"] = {"calibration": calibrate(pair, work / "fast" / "calibration")}
            raw["fast"]["steps"] = time_all(pair, work / "fast", "unshaped")
        finally:
            pair.teardown()
        for index, link in enumerate(links):
            pair, shaping = link_pair(link, "bench")
            try:
                if shaping.note:
                    log(shaping.note)
                link_dir = work / f"{int(link.bandwidth_bps)}bps"
                entry = {"bandwidth_bps": link.bandwidth_bps, "latency_s": link.latency_s,
                         "latency_applied": shaping.latency_applied, "note": shaping.note,
                         "calibration": calibrate(pair, link_dir / "calibration")}
                cal = link_calibration(shaping, entry["calibration"])
                log(f"[{cal.label}] all-reduce at {cal.rate(cal.bulk):.2f}, all-gather at "
                    f"{cal.rate(cal.gather_small):.2f}-{cal.rate(cal.gather):.2f} of line rate")
                entry["steps"] = time_all(pair, link_dir, cal.label)
                entry["checks"] = {}
                if check and index == 0:
                    for family in families:
                        entry["checks"][family.name] = end_to_end(
                            pair, family, steps, link_dir / f"check_{family.name}", timeout_s=timeout_s)
                raw["links"].append(entry)
            finally:
                pair.teardown()
            save(raw)
    return raw


def end_to_end(pair, family: Family, steps: int, run_dir: Path, *, timeout_s: float) -> list[dict]:
    """The family's Accordion preset for a short whole schedule through the link."""
    run = family.runs[ACCORDION]
    batches = sorted({int(e["global_batch"]) for e in run.epochs})
    samples = max(steps * batches[0], 2 * batches[-1])  # every batch it may switch to divides it
    overrides = step_overrides(run, samples // int(run.epochs[0]["global_batch"]), run_dir,
                               epochs=CHECK_EPOCHS, extra=CHECK_SCHEDULE)
    return run_trainer(pair, overrides, run_dir, timeout_s=timeout_s * CHECK_EPOCHS)


def assemble(raw: dict, families: Sequence[Family]) -> BenchmarkResult:
    """Every row of the report from raw measurements and the committed runs."""
    configs = static_runs(families)
    result = BenchmarkResult(command=raw.get("command", ""))
    if "fast" not in raw:
        return result
    result.fast = link_calibration(None, raw["fast"]["calibration"])
    result.fast_steps = {p: StepTime.from_epochs(e[1:]) for p, e in raw["fast"]["steps"].items()}
    for entry in raw["links"]:
        shaping = ShapingReport(LinkSpec(entry["bandwidth_bps"], entry["latency_s"]),
                                latency_applied=entry["latency_applied"], note=entry.get("note", ""))
        cal = link_calibration(shaping, entry["calibration"])
        result.calibrations.append(cal)
        if shaping.note:
            result.notes.append(f"{shaping.link.label}: {shaping.note}")
        missing = [run.preset for run in configs if run.preset not in entry["steps"]]
        if missing:
            raise KeyError(f"{cal.label}: no step measured for {missing} (rerun the benchmark)")
        times = {run.preset: StepTime.from_epochs(entry["steps"][run.preset][1:]) for run in configs}
        modelled_step = {p: predicted_step(result.fast_steps[p], result.fast, cal) for p in times}
        step_rows = {}
        for run in configs:
            first = run.epochs[0]
            step_rows[signature(first)] = StepRow(
                link=cal.label, preset=run.preset, level=_level(run), step=times[run.preset],
                fast=result.fast_steps[run.preset], model_s=modelled_step[run.preset],
                study_bytes_per_step=float(first["bytes_sent"]) / int(first["steps"]))
            result.steps.append(step_rows[signature(first)])
        by_signature = lambda values: {signature(r.epochs[0]): values[r.preset] for r in configs}  # noqa: E731
        measured = by_signature({p: t.step_s for p, t in times.items()})
        modelled = by_signature(modelled_step)
        for family in families:
            rows = [replace(r, why=run_why(r, steps_at(family.runs[r.method].epochs, family),
                                           step_rows))
                    for r in whole_runs(cal.label, family, measured, modelled)]
            if family is not families[0]:
                rows = [r for r in rows if r.method != DENSE]  # listed once per link
            result.rows += rows
            epochs = entry.get("checks", {}).get(family.name)
            if epochs:
                timed = epochs[1:]
                result.checks.append(CheckRow(
                    link=cal.label, family=family.name, preset=family.runs[ACCORDION].preset,
                    schedule=schedule_trace(family, timed),
                    measured_s=sum(float(e["epoch_time_s"]) for e in timed),
                    combined_s=run_time(timed, family, measured)))
    return result
