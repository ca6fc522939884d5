"""From step times per configuration and a run's logged schedule to the time of the whole run.

A run's metrics.jsonl says, epoch by epoch, how many steps it took, at which global batch and
at which level (or, for an Accordion epoch with some layers at each level, how many bytes a
step sent). Training time on a link is then the sum over epochs of steps x the step time of
that configuration on the link. A mixed epoch sits between the family's two static levels:
its step time is interpolated by the bytes its step sent (communication, and the compression
work that goes with it, grow with what is sent). Evaluation is left out: it is the same for
every method and never crosses the link.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .study import STATIC_HIGH, STATIC_LOW, Family, Run, signature


def _bytes_per_step(run: Run) -> float:
    epoch = run.epochs[0]
    return float(epoch["bytes_sent"]) / int(epoch["steps"])


def _mixed_fraction(epoch: dict, family: Family) -> float:
    """Where a mixed epoch's step sits between the static low (0) and high (1) runs, by the
    bytes it sent (clipped to the two)."""
    low, high = family.runs[STATIC_LOW], family.runs[STATIC_HIGH]
    b_low, b_high = _bytes_per_step(low), _bytes_per_step(high)
    sent = float(epoch["bytes_sent"]) / int(epoch["steps"])
    return 0.0 if b_low == b_high else min(1.0, max(0.0, (sent - b_low) / (b_high - b_low)))


def epoch_step_time(epoch: dict, family: Family, times: Mapping[tuple, float]) -> float:
    """The step time of one logged epoch; `times` maps a static run's signature to seconds."""
    sig = signature(epoch)
    if sig[1] is not None:
        return times[sig]
    low, high = family.runs[STATIC_LOW], family.runs[STATIC_HIGH]
    t_low, t_high = times[signature(low.epochs[0])], times[signature(high.epochs[0])]
    return t_low + _mixed_fraction(epoch, family) * (t_high - t_low)


def epoch_weights(epoch: dict, family: Family) -> dict[tuple, float]:
    """How much of each static configuration (by signature) one step of this epoch is, as
    epoch_step_time combines them: 1 of its own for a static epoch, the static low and high
    runs' shares for a mixed one."""
    sig = signature(epoch)
    if sig[1] is not None:
        return {sig: 1.0}
    fraction = _mixed_fraction(epoch, family)
    weights: dict[tuple, float] = {}
    for method, weight in ((STATIC_LOW, 1.0 - fraction), (STATIC_HIGH, fraction)):
        key = signature(family.runs[method].epochs[0])
        weights[key] = weights.get(key, 0.0) + weight
    return weights


def run_time(epochs, family: Family, times: Mapping[tuple, float]) -> float:
    """Training time of these epochs at these step times."""
    return sum(int(e["steps"]) * epoch_step_time(e, family, times) for e in epochs)


def steps_at(epochs, family: Family) -> dict[tuple, float]:
    """Steps of these epochs per static configuration (a mixed epoch's split by its weights):
    a run's time is sum(steps_at[c] * time[c]), so its model gap is that of each c, weighted."""
    steps: dict[tuple, float] = {}
    for epoch in epochs:
        for sig, weight in epoch_weights(epoch, family).items():
            steps[sig] = steps.get(sig, 0.0) + weight * int(epoch["steps"])
    return steps


def _level(family: Family, epoch: dict) -> str:
    batch, level = signature(epoch)
    if family.name == "batch":
        return str(batch)
    if level is None:
        return "mix"
    if level == "none":
        return "dense"
    return f"{float(level):.0%}" if family.name == "topk" else level


def schedule_trace(family: Family, epochs) -> str:
    """What each epoch ran at, run-length coded: '2 x3, mix x2, 1, 2, 1 x3, 2, mix'."""
    parts: list[list] = []
    for epoch in epochs:
        text = _level(family, epoch)
        if parts and parts[-1][0] == text:
            parts[-1][1] += 1
        else:
            parts.append([text, 1])
    return ", ".join(text if n == 1 else f"{text} x{n}" for text, n in parts)


def label(family: Family, method: str, run: Run) -> str:
    """The run's own label; the batch family's from the batches it really ran (its presets'
    labels name the paper's 512 / 16,384)."""
    if family.name != "batch":
        return run.label
    batches = sorted({int(e["global_batch"]) for e in run.epochs})
    if method == "accordion":
        return f"Accordion B {batches[0]}<->{batches[-1]}"
    return f"B {batches[0]}" + (" (the dense run)" if method == STATIC_LOW else "")


@dataclass(frozen=True)
class WholeRun:
    link: str
    family: str
    method: str
    label: str
    run_dir: str
    epochs: int
    steps: int
    schedule: str
    time_s: float       # measured step times x the run's schedule
    model_s: float      # the cost model's step times x the same schedule
    floats: float       # as the run logged them (per worker)
    bytes: float
    speedup_vs_static_low: float | None = None
    speedup_vs_dense: float | None = None
    why: str = ""       # what the model misses on this row (driver.assemble)

    @property
    def model_error(self) -> float:
        return self.model_s / self.time_s - 1.0


def whole_runs(link: str, family: Family, measured: Mapping[tuple, float],
               modelled: Mapping[tuple, float]) -> list[WholeRun]:
    """One row per run of the family on one link, with speedups over the family's static-low
    run and over the dense run (for the batch family its B_low run, which is the dense one)."""
    times = {method: run_time(run.epochs, family, measured) for method, run in family.runs.items()}
    low, dense = times.get(STATIC_LOW), times.get("dense", times.get(STATIC_LOW))
    return [WholeRun(
        link=link, family=family.name, method=method, label=label(family, method, run),
        run_dir=str(run.path), epochs=len(run.epochs), steps=sum(int(e["steps"]) for e in run.epochs),
        schedule=schedule_trace(family, run.epochs), time_s=times[method],
        model_s=run_time(run.epochs, family, modelled),
        floats=float(sum(e["floats_sent"] for e in run.epochs)),
        bytes=float(sum(e["bytes_sent"] for e in run.epochs)),
        speedup_vs_static_low=low / times[method] if low else None,
        speedup_vs_dense=dense / times[method] if dense else None) for method, run in family.runs.items()]
