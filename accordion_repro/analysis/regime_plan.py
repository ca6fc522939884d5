"""Figure 2 (b)'s two arms from a logged run, not from hand-placed windows.

The paper asks whether *where* high compression is applied matters more than *how much*. Its
arms put high compression only inside, or only outside, the critical regimes. Here the
regimes are the ones the detector found in a reference run at the low level (a static run
with `schedule.detect=true`, same seed):

- inside: high compression in exactly the epochs that run held critical;
- outside: high compression in as many epochs that it did not hold critical. In each LR phase
  (the epochs between two LR decays), the outside arm takes as many epochs as the inside arm has
  there, and takes the latest non-critical ones (the plateau before a decay, where the
  gradient is quietest). If a phase has too few, the latest non-critical epochs left
  anywhere make up the count.
- earliest and random: the same count per phase from the same non-critical epochs, the earliest
  ones, or drawn at random. These are the control arms: "latest" puts rank 1 just before each
  decay, where compression may cost least, so "outside beats inside" could mean "before a
  decay beats after one" rather than "non-critical epochs are free". The random draw is
  seeded from RANDOM_SEED and the reference run's seed, and written into the plan file before
  the arm runs, so it can be redone and checked.

Every arm then runs the same number of epochs at each level, so they send the same floats. The
plan becomes `schedule.windows` of the regime_windows schedule (half-open [start, end) epoch
pairs), so the arms are ordinary runs whose resolved.yaml holds their epochs.

    python -m accordion_repro.analysis.regime_plan RUN_DIR [--decision model_norm|any|majority]
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from ..accordion.schedules import BATCH_DECISIONS, held_decision
from ..run_layout import RESOLVED
from .collect import RunDirectoryError, read_metrics

RULE = ("outside: per LR phase, as many epochs as the inside arm has there, the latest ones the "
        "reference run did not hold critical; a shortfall is made up by the latest such epochs "
        "left anywhere")
CONTROL_RULES = {
    "earliest": "per LR phase, as many epochs as the inside arm has there, the earliest ones the "
                "reference run did not hold critical; a shortfall is made up by the earliest "
                "such epochs left anywhere",
    "random": "per LR phase, as many epochs as the inside arm has there, drawn without "
              "replacement from those the reference run did not hold critical (Python's "
              "random.Random seeded with the string in random_seed); a shortfall is drawn from "
              "such epochs left anywhere",
}
# The committed seed of the random control arm's draw (with the reference run's own seed).
RANDOM_SEED = 36
ARMS = ("inside", "outside", "earliest", "random")


@dataclass(frozen=True)
class RegimePlan:
    reference: str
    decision: str
    critical_epochs: list[int]   # the inside arm's high-compression epochs
    outside_epochs: list[int]    # the outside arm's, as many
    inside_windows: list[list[int]]
    outside_windows: list[list[int]]
    rule: str = RULE
    earliest_epochs: list[int] = ()    # the control arms' high-compression epochs, as many
    earliest_windows: list[list[int]] = ()
    random_epochs: list[int] = ()
    random_windows: list[list[int]] = ()
    random_seed: str = ""              # what seeded the random arm's draw
    control_rules: dict = None

    def epochs(self, arm: str) -> list[int]:
        """The epochs in which this arm runs the high-compression level."""
        return {"inside": self.critical_epochs, "outside": self.outside_epochs,
                "earliest": self.earliest_epochs, "random": self.random_epochs}[arm]

    def overrides(self, arm: str) -> list[str]:
        """The command-line overrides that put high compression in this arm's epochs."""
        return ["schedule.windows=" + json.dumps(windows(self.epochs(arm))).replace(" ", "")]


def held_critical(records: list[dict], decision: str = "model_norm") -> list[bool]:
    """Whether each epoch of a detect run ran inside a critical regime.

    A record logs the flags decided at the end of its epoch, which hold from the next epoch on;
    epoch 0 runs critical, as the detector starts every unit critical (Algorithm 1).
    """
    if decision not in BATCH_DECISIONS:
        raise ValueError(f"decision must be one of {', '.join(BATCH_DECISIONS)}, got {decision!r}")
    held = [True]
    for record in records[:-1]:
        report = record.get("detector")
        if not report or report.get("granularity") != "layer+model":
            raise RunDirectoryError(
                f"epoch {record['epoch']} has no per-layer and whole-model detector flags; the "
                "reference must be a static run with schedule.detect=true")
        held.append(held_decision(report["critical"], decision))
    return held


def lr_phases(records: list[dict]) -> list[int]:
    """The LR phase of each epoch: a new phase starts at every epoch whose LR is lower than the
    one before it (warm-up raises the LR and stays in the first phase)."""
    phases, phase = [], 0
    for before, record in zip([None, *records], records):
        if before is not None and record["lr"] < before["lr"]:
            phase += 1
        phases.append(phase)
    return phases


def _latest(epochs: list[int], count: int) -> list[int]:
    return epochs[len(epochs) - count:]


def _earliest(epochs: list[int], count: int) -> list[int]:
    return epochs[:count]


def random_seed_text(seed: int) -> str:
    return f"fig2-random-{RANDOM_SEED}-seed{seed}"


def _random_pick(seed: int):
    """Draws `count` of the epochs, in order, from one generator per reference seed (str seeds
    hash the same way on every Python 3 version and machine)."""
    generator = random.Random(random_seed_text(seed))
    return lambda epochs, count: sorted(generator.sample(epochs, count))


def quiet_epochs(held: list[bool], phases: list[int], pick=_latest) -> list[int]:
    """Per LR phase as many non-critical epochs as it has critical ones, `pick`ed from its
    non-critical epochs (the latest, the earliest or a random draw); a shortfall is picked from
    the non-critical epochs left anywhere."""
    chosen: list[int] = []
    for phase in sorted(set(phases)):
        epochs = [e for e, p in enumerate(phases) if p == phase]
        wanted = sum(held[e] for e in epochs)
        quiet = [e for e in epochs if not held[e]]
        chosen += pick(quiet, min(wanted, len(quiet)))
    shortfall = sum(held) - len(chosen)
    if shortfall:
        left = [e for e, critical in enumerate(held) if not critical and e not in chosen]
        if len(left) < shortfall:
            raise ValueError(f"the reference run holds {sum(held)} of {len(held)} epochs critical; "
                             "fewer are left outside for the other arm")
        chosen += pick(left, shortfall)
    return sorted(chosen)


def outside_epochs(held: list[bool], phases: list[int]) -> list[int]:
    return quiet_epochs(held, phases, _latest)


def windows(epochs: list[int]) -> list[list[int]]:
    """Consecutive epochs as half-open [start, end) windows: [0, 1, 2, 6] -> [[0, 3], [6, 7]]."""
    runs = itertools.groupby(enumerate(sorted(epochs)), key=lambda pair: pair[1] - pair[0])
    spans = [[e for _, e in group] for _, group in runs]
    return [[span[0], span[-1] + 1] for span in spans]


def plan_from_run(run_dir: str | Path, decision: str = "model_norm") -> RegimePlan:
    """The two arms' epochs from a completed static detect run."""
    records = read_metrics(Path(run_dir))
    held = held_critical(records, decision)
    phases = lr_phases(records)
    critical = [e for e, flag in enumerate(held) if flag]
    outside = outside_epochs(held, phases)
    earliest = quiet_epochs(held, phases, _earliest)
    seed = _reference_seed(Path(run_dir))
    drawn = quiet_epochs(held, phases, _random_pick(seed))
    return RegimePlan(reference=str(run_dir), decision=decision, critical_epochs=critical,
                      outside_epochs=outside, inside_windows=windows(critical),
                      outside_windows=windows(outside), earliest_epochs=earliest,
                      earliest_windows=windows(earliest), random_epochs=drawn,
                      random_windows=windows(drawn), random_seed=random_seed_text(seed),
                      control_rules=dict(CONTROL_RULES))


def _reference_seed(run_dir: Path) -> int:
    resolved = run_dir / RESOLVED
    if not resolved.is_file():
        raise RunDirectoryError(f"{run_dir} has no resolved.yaml; the random arm's draw needs "
                                "the reference run's seed")
    return int(yaml.safe_load(resolved.read_text(encoding="utf-8"))["seed"])


def write_plan(plan: RegimePlan, path: Path, relative_to: Path | None = None) -> None:
    """The plan as JSON; the reference run named relative to `relative_to` (a runs folder), so
    the file reads the same on every machine."""
    record = asdict(plan)
    if relative_to is not None:
        record["reference"] = Path(plan.reference).resolve().relative_to(
            Path(relative_to).resolve()).as_posix()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="a completed static run with schedule.detect=true")
    parser.add_argument("--decision", choices=BATCH_DECISIONS, default="model_norm",
                        help="one flag per epoch from the whole-model norm (default), any layer, "
                             "or a majority of layers")
    parser.add_argument("--out", type=Path, help="also write the plan here as JSON")
    args = parser.parse_args(argv)
    try:
        plan = plan_from_run(args.run_dir, args.decision)
    except (RunDirectoryError, ValueError) as error:
        print(f"error: {args.run_dir}: {error}", file=sys.stderr)
        return 2
    if args.out:
        write_plan(plan, args.out)
    for arm in ARMS:
        print(f"{arm + ':':9} epochs {plan.epochs(arm)}  {' '.join(plan.overrides(arm))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
