"""Every table cell and figure curve is one configuration, or the build stops.

A cell averages its runs as seeds of one configuration. A run of the same preset with another
value (`schedule.eta=0.3`, another rank) lands beside them under its own directory name and
would enter that mean as one more seed: a mislabelled result nobody would see. So before
anything is written, the runs of each cell at each scale must agree on every key that changes
what is computed (rundir.config_delta, the same comparison a resumed run must pass); otherwise
the build stops, naming the cell, the runs and the keys, and how to keep the variant apart.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from accordion_repro.analysis.collect import RUN_DIR, read_config
from accordion_repro.accordion.schedules import StaticSettings
from accordion_repro.comm.config import ACPPowerSGDSettings, PowerSGDSettings
from accordion_repro.rundir import ADDED_KEYS, DETECTOR_KEYS, config_delta
from accordion_repro.settings import key_of
from accordion_repro.utils import flatten

# Keys that differ between the seeds of one configuration (the run's seed, the compressor's,
# which conf ties to it), or only name a run.
PER_SEED_KEYS = {"seed", key_of(PowerSGDSettings, "seed"), key_of(ACPPowerSGDSettings, "seed")}
NAMING_PREFIX = "run."
# A static schedule's detector only watches: with or without it, the run computes the same.
WATCHING_KEYS = {key_of(StaticSettings, "detect"), *DETECTOR_KEYS}


class MixedCellError(ValueError):
    """One cell's runs are not one configuration; the message names the runs and keys."""


def _static(flat: dict) -> bool:
    return flat.get("schedule.name") == "static"


def differences(base: dict, other: dict) -> dict[str, list]:
    """{key: [base value, other value]} for the keys in which two runs of one cell may not
    differ. A key one run lacks (added to the config after it ran) is not compared unless
    rundir.ADDED_KEYS says what its absence meant."""
    a, b = flatten(base), flatten(other)
    watching = WATCHING_KEYS if _static(a) and _static(b) else set()
    return {key: values for key, values in config_delta(base, other).items()
            if key not in PER_SEED_KEYS and not key.startswith(NAMING_PREFIX)
            and key not in watching and ((key in a and key in b) or key in ADDED_KEYS)}


def check_one_configuration(runs_dir: str | Path, runs: pd.DataFrame, owner: str,
                            configs: dict[str, dict] | None = None) -> None:
    """Raise MixedCellError if two runs of one (scale, model, method) cell of `owner` (a table
    or figure id) differ; `runs` has one or more rows per run. `configs` caches resolved.yaml
    by run directory across calls."""
    if runs.empty:
        return
    configs = {} if configs is None else configs
    per_run = runs.drop_duplicates(RUN_DIR)
    for (scale, model, method), cell in per_run.groupby(
            ["scale.name", "model.name", "run.method"], sort=True, dropna=False):
        names = sorted(cell[RUN_DIR])
        for name in names:
            if name not in configs:
                configs[name] = read_config(Path(runs_dir) / name)
        for name in names[1:]:
            delta = differences(configs[names[0]], configs[name])
            if delta:
                keys = "; ".join(f"{key}: {old!r} vs {new!r}" for key, (old, new) in delta.items())
                raise MixedCellError(
                    f"{owner}, {model} {method} at scale {scale}: {names[0]} and {name} are not one "
                    f"configuration ({keys}), so their mean would be mislabelled. Give the "
                    f"variant its own run.name with run.table=null and run.figure=null, or move "
                    f"it out of {runs_dir}.")


def configuration_check(runs_dir: str | Path, configs: dict[str, dict]):
    """same(run a, run b): whether two run directories under runs_dir are one configuration
    (no differences()); resolved.yaml cached in `configs` by run directory."""
    def config(name: str) -> dict:
        if name not in configs:
            configs[name] = read_config(Path(runs_dir) / name)
        return configs[name]

    return lambda a, b: not differences(config(a), config(b))
