"""The catalog of every option of a run: which settings class each config node reads, the keys
they make, and docs/options.md made from their help.

On the top floor of the package (tests/test_layers.py): it imports every part, and nothing below
imports it. RunSettings, which the parts hand each other, lives in run_settings.py, and
require_settings in options.py.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator

from accordion_repro.options import NOT_ADDED


def settings_classes() -> Iterator[tuple[str, str | None, type]]:
    """(config node, choice, settings class) of every part of a run: the trainer's, optimiser's,
    launcher's and wandb's, then each model, dataset, compressor and schedule by name."""
    from accordion_repro.accordion import SCHEDULES
    from accordion_repro.comm.registry import compressor_settings
    from accordion_repro.data.registry import SETTINGS as DATASETS
    from accordion_repro.engine.settings import DistSettings, OptimSettings, TrainerSettings
    from accordion_repro.models.factory import SETTINGS as MODELS
    from accordion_repro.runlog import WandbSettings

    for cls in (TrainerSettings, OptimSettings, DistSettings, WandbSettings):
        yield cls.SECTION, None, cls
    for section, choices in (("model", MODELS), ("dataset", DATASETS),
                             ("compressor", compressor_settings()),
                             ("schedule", {name: c.Settings for name, c in SCHEDULES.items()})):
        for name, cls in choices.items():
            yield section, name, cls


def option_keys(on_resume: str | None = None) -> dict[str, object]:
    """{`section.option`: the value a run without it ran as (NOT_ADDED for an option as old as
    the runs)} over every settings class, of the options with this `on_resume` (all: None)."""
    keys: dict[str, object] = {}
    for section, _, cls in settings_classes():
        for f in dataclasses.fields(cls):
            if on_resume is None or f.metadata["on_resume"] == on_resume:
                keys[f"{section}.{f.name}"] = f.metadata["added"]
    return keys


def added_keys() -> dict[str, object]:
    """{`section.option`: the value run directories made before the option was added ran as}."""
    return {key: added for key, added in option_keys().items() if added is not NOT_ADDED}


def key_of(cls: type, name: str) -> str:
    """`section.name` of an option of `cls`; a KeyError if `cls` has no such option, so that a
    key list written in terms of the classes breaks loudly when an option is renamed."""
    if name not in {f.name for f in dataclasses.fields(cls)}:
        raise KeyError(f"{cls.__name__} has no option {name!r}")
    return f"{cls.SECTION}.{name}"


def _default(f: dataclasses.Field) -> str:
    if f.default is dataclasses.MISSING:
        return "conf/"  # no default in the class: conf/ gives it (or it is required)
    return "null" if f.default is None else f"`{f.default!r}`".replace("|", "\\|")


def options_page() -> str:
    """docs/options.md: every option of a run with its default and help, from the classes."""
    lines = ["# Options", "",
             "Every option a run reads, from the settings classes' `option(help=...)` fields "
             "(generated: `python -m accordion_repro.settings > docs/options.md`; "
             "tests/test_run_settings.py checks it is current). Set one on the command line as "
             "`section.option=value` (`schedule.eta=0.3`). Default `conf/`: the class has none, "
             "conf/ gives it (trainer, optim, dist, logger) or the chosen preset must (a rank, a "
             "level, a path). Resume: what trainer.allow_config_change may change (`changeable`) "
             "and what never blocks a resume (`free`), rundir.py.", ""]
    for section, choice, cls in settings_classes():
        title = f"`{section}`" + (f" = `{choice}`" if choice else "")
        lines += [f"## {title}", "", "| option | default | resume | what it does |",
                  "| --- | --- | --- | --- |"]
        for f in dataclasses.fields(cls):
            resume = "" if f.metadata["on_resume"] == "fixed" else f.metadata["on_resume"]
            text = f.metadata["help"].replace("|", "\\|")
            lines.append(f"| `{f.name}` | {_default(f)} | {resume} | {text} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(options_page())
