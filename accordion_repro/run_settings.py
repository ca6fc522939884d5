"""RunSettings: a run's whole configuration, read and checked once, as typed frozen objects.

config.validate builds it before any rank starts; the launcher hands it to the ranks (it
pickles: mp.spawn and Hydra's submitit launcher copy it) and the trainer hands each component
its own part, so no option is read from the config dict a second time. The resolved dict
travels along only as the run's record (resolved.yaml, the checkpoint's copy, wandb's config).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from accordion_repro.options import Settings


@dataclass(frozen=True)
class RunSettings:
    seed: int
    scale: str  # scale.name: recorded in summary.json; its values already fed the other keys
    trainer: Settings  # engine.settings.TrainerSettings
    optim: Settings  # engine.settings.OptimSettings
    dist: Settings  # engine.settings.DistSettings
    model_name: str
    model: Settings  # models/settings.py, by model_name
    dataset: Settings  # data/settings.py (it holds its name)
    compressor_name: str
    compressor: Settings  # comm/config.py, by compressor_name
    schedule_name: str
    schedule: Settings  # the schedule's Settings (accordion/), levels and epochs resolved
    wandb: Settings  # runlog.WandbSettings
    # the run's record, written as it is; never read for a value (the fields above are)
    resolved: dict = field(default_factory=dict, compare=False, repr=False)
    # keys a resume changed (rundir.check_existing_run), recorded in every later epoch
    config_change: dict = field(default_factory=dict, compare=False)
