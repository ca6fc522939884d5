"""Entry point: `python -m accordion_repro.train model=resnet18 compressor=powersgd schedule=accordion`.

Hydra composes and this module validates once, before any rank starts, into RunSettings (the
ranks get it, and every component its part); the resolved config is written to the run
directory as the run's record. The run directory's name
comes from the preset, the overrides and the seed (conf/config.yaml), never from the clock, so a
requeued or resumed job finds its own checkpoint.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Callable

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from accordion_repro import config as config_module
from accordion_repro.data import prepare_dataset
from accordion_repro.engine.checkpoint import CheckpointError
from accordion_repro.errors import ConfigError, DatasetMissingError
from accordion_repro.env import env_rank
from accordion_repro.launch import RankFailed, RunStopped, hold_stop_signals, launch
from accordion_repro.runlog import read_summary
from accordion_repro.rundir import (ConfigMismatch, RunDirectoryInUse, RunRecordGap, check_existing_run,
                                    run_lock)
from accordion_repro.run_layout import CHECKOUT, CONF_DIR, RESOLVED
from accordion_repro.utils import atomic_write_text

# Errors the user fixes on the command line: one line, exit 2, nothing started or changed.
USER_ERRORS = (ConfigError, DatasetMissingError, CheckpointError, ConfigMismatch, RunDirectoryInUse,
               RunRecordGap)


def run(cfg: DictConfig, run_dir: Path, accepted: Callable[[], None] | None = None) -> Path:
    """Validate, check the run directory, start the ranks. Usable without Hydra (tests, scripts).

    Everything that can refuse the job (config values, dataset contents, another job on the
    directory, a changed config, an unreadable checkpoint) is checked before resolved.yaml is
    written and before any rank starts; then `accepted()` is called. Under torchrun or Slurm,
    rank 0 does the checks; the other ranks wait for it in the process-group rendezvous.
    """
    settings = config_module.validate(cfg)
    run_dir = Path(run_dir)
    if env_rank() != 0:
        launch(settings, run_dir)
        return run_dir
    with hold_stop_signals(), run_lock(run_dir):  # a stop signal from here on ends the job as stopped
        change = check_existing_run(run_dir, settings.resolved, settings.trainer)
        prepare_dataset(settings.dataset)
        atomic_write_text(run_dir / RESOLVED,
                          OmegaConf.to_yaml(OmegaConf.create(settings.resolved)))
        if accepted is not None:
            accepted()
        launch(dataclasses.replace(settings, config_change=change), run_dir)
    return run_dir


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    pending = run_dir / hydra_cfg.output_subdir if hydra_cfg.output_subdir else None
    with hold_stop_signals(restore=False):  # until this process ends: no signal finds it unhandled
        try:
            run(cfg, run_dir, accepted=lambda: keep_hydra_files(pending))
        except USER_ERRORS + (RankFailed, RunStopped) as exc:
            if hydra_cfg.mode == RunMode.MULTIRUN:
                # Hydra reports the failed job with its overrides and still runs the other jobs.
                raise JobFailed(str(exc)) from None
            if isinstance(exc, RunStopped):
                print(str(exc), file=sys.stderr)
                sys.exit(exc.exit_code)
            print(f"error: {exc}", file=sys.stderr)
            sys.exit(2 if isinstance(exc, USER_ERRORS) else 1)
        finally:
            if is_pending(pending):  # a refused job's, a rank's
                shutil.rmtree(pending, ignore_errors=True)
        if env_rank() == 0:
            print(closing_summary(run_dir, Path(cfg.paths.runs_dir)))


def is_pending(folder: Path | None) -> bool:
    """Whether `folder` is this process's .hydra/pending-<pid> (conf/config.yaml), not a folder
    a user's `hydra.output_subdir` names."""
    return folder is not None and folder.name.startswith("pending-") and folder.parent.name == ".hydra"


def keep_hydra_files(pending: Path | None) -> None:
    """An accepted job's Hydra files (conf/config.yaml `hydra.output_subdir`: .hydra/pending-<pid>)
    replace those in .hydra/; until then .hydra/ holds the files of the run the directory has."""
    if not is_pending(pending) or not pending.is_dir():
        return
    for path in pending.iterdir():
        os.replace(path, pending.parent / path.name)
    pending.rmdir()


def closing_summary(run_dir: Path, runs_dir: Path) -> str:
    """What a finished run tells the user: its result and where everything went."""
    summary = read_summary(run_dir)
    lines = []
    metric = summary.get("metric")
    value = summary.get(f"final_{metric}")
    if summary.get("status") == "completed" and value is not None:
        unit = " %" if metric == "test_acc" else ""
        lines.append(f"done: {metric} {value:.2f}{unit} after {summary.get('epochs_completed')} "
                     f"epochs; {summary.get('total_floats_sent', 0) / 1e6:.2f}M floats sent per "
                     f"worker")
    lines.append(f"run directory: {run_dir} (metrics.jsonl, summary.json, resolved.yaml)")
    wandb_dir = run_dir / "wandb"
    if wandb_dir.is_dir():
        lines.append(f"wandb files: {wandb_dir} (offline runs upload with `wandb sync "
                     f"{wandb_dir}/offline-run-*`)")
    rebuild = (f"make figures RUNS={runs_dir}" if CHECKOUT else  # no Makefile in an installed wheel
               f"python -m accordion_repro.analysis --runs {runs_dir} --out results")
    lines.append(f"tables and figures: `{rebuild}` writes results/tables and results/figures")
    return "\n".join(lines)


class JobFailed(RuntimeError):
    """One job of a sweep was refused or failed; the message says why."""


def expand_experiment_globs(argv: list[str]) -> list[str]:
    """`experiment=glob(table1/*)` over the nested preset folders.

    Hydra's glob() sees only the top level of a config group, while the presets sit one folder
    down (experiment/table1/...), so the sweep list is expanded here, before Hydra parses it.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Glob

    presets_dir = CONF_DIR / "experiment"
    names = sorted(p.relative_to(presets_dir).with_suffix("").as_posix() for p in presets_dir.rglob("*.yaml")
                   if "_base" not in p.relative_to(presets_dir).parts)  # _base/: family bases, not presets
    out = []
    for arg in argv:
        if arg.lstrip("+~").startswith("experiment=") and "glob(" in arg:
            override = OverridesParser.create().parse_override(arg)
            value = override.value()
            if isinstance(value, Glob):
                chosen = value.filter(names)
                if not chosen:
                    raise ConfigError("experiment", f"{arg!r} matches no preset under {presets_dir}")
                arg = f"{override.get_key_element()}={','.join(chosen)}"
        out.append(arg)
    return out


def import_plugins(argv: list[str]) -> None:
    """`plugins=[mypkg.compressors]`: modules imported before the config is composed, where your
    own compressors register themselves (comm/registry.py's register_compressor): a registered
    compressor is then `compressor=<name>` on the command line, with or without a
    conf/compressor/<name>.yaml. The ranks import the module again when they unpickle its
    settings, which registers it there too."""
    import importlib

    from hydra.core.override_parser.overrides_parser import OverridesParser

    for arg in argv[1:]:
        if arg.lstrip("+").partition("=")[0] != "plugins":
            continue
        value = OverridesParser.create().parse_override(arg).value()
        for name in [value] if isinstance(value, str) else list(value or []):
            try:
                importlib.import_module(str(name))
            except Exception as exc:  # noqa: BLE001  (whatever the module raises: one line)
                raise ConfigError("plugins", f"cannot import {name!r}: "
                                             f"{type(exc).__name__}: {exc}") from None
    config_module.register_defaults()  # what the plugins registered, for Hydra to compose


def check_run_dir_writable(argv: list[str]) -> None:
    """Where the run directory cannot be written, Hydra fails setting up its job log with a
    30-line traceback; say it in one line before anything starts."""
    targets = {"paths.runs_dir": os.environ.get("ACCORDION_RUNS", "results/runs")}
    for arg in argv[1:]:
        key, _, value = arg.lstrip("+").partition("=")
        if key in ("hydra.run.dir", "paths.runs_dir") and value:
            targets[key] = value
    for key, target in targets.items():
        existing = Path(target).absolute()
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if os.statvfs(existing).f_flag & os.ST_RDONLY:
            why = "on a read-only file system"
        elif not os.access(existing, os.W_OK | os.X_OK):
            why = "permission denied"
        else:
            continue
        raise ConfigError(key, f"cannot write the run directory {target} ({existing}: {why}); "
                               f"choose another with hydra.run.dir=... or paths.runs_dir=...")


def check_overrides_compose(argv: list[str]) -> None:
    """Hydra's own refusals (a key the config lacks, an unknown group option, an override that
    does not parse) are 6 to 20 lines: compose the job once before Hydra runs it, and say the
    same in one line. Sweeps and Hydra's flags (any argument starting with '-') and Hydra's own
    keys are left to Hydra."""
    args = argv[1:]
    if any(arg.startswith("-") for arg in args):
        return
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException

    overrides = [arg for arg in args if not arg.lstrip("+~").startswith(("hydra.", "hydra/"))]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        try:
            compose(config_name="config", overrides=overrides)
        except HydraException as exc:
            missing = re.match(r"Could not override '([\w.]+)'", str(exc))
            if missing:
                raise ConfigError(missing[1], _not_a_key(missing[1], overrides)) from None
            unparsed = _unparsed_override(overrides)
            if unparsed is not None:
                key, value = unparsed
                raise ConfigError(key, f"{value!r} does not parse as a value ("
                                       f"{_one_line(str(exc))})") from None
            raise ConfigError("the command line", _one_line(str(exc))) from None


def _unparsed_override(overrides: list[str]) -> tuple[str, str] | None:
    """(key, value) of the first override Hydra's grammar cannot parse (an unclosed
    `schedule.windows=[[0,1]`), so that the refusal names the key; None when each parses."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_overrides([override])
        except HydraException:
            key, _, value = override.partition("=")
            return key.lstrip("+~"), value
    return None


def _not_a_key(key: str, overrides: list[str]) -> str:
    """'dataset.root' under dataset=npz: name the keys its parent does have (Hydra's own
    message suggests `+dataset.root=`, which the validation would then refuse)."""
    from hydra import compose

    parent, _, _ = key.rpartition(".")
    others = [arg for arg in overrides if not arg.lstrip("+~").startswith(f"{key}=")]
    try:
        node = OmegaConf.select(compose(config_name="config", overrides=others), parent) if parent else None
    except Exception:  # another override is also wrong: Hydra's words for this one suffice
        node = None
    if not isinstance(node, DictConfig):
        return "not a key of this configuration"
    return f"not a key of this configuration; {parent} has: {', '.join(sorted(node.keys()))}"


def _one_line(message: str) -> str:
    """Hydra's message as one line: 'Available options in 'model': densenet, ...'."""
    parts: list[str] = []
    for line in message.splitlines():
        if not line.strip() or line.startswith("Set the environment variable HYDRA_FULL_ERROR"):
            continue
        if line.startswith("Config search path"):
            break
        if line.startswith(("\t", " ")) and parts and parts[-1].endswith((":", ",")):
            parts[-1] += f" {line.strip()},"
        else:
            parts.append(line.strip())
    return "; ".join(part.rstrip(",.") for part in parts)


if __name__ == "__main__":
    try:
        sys.argv = expand_experiment_globs(sys.argv)
        import_plugins(sys.argv)
        check_run_dir_writable(sys.argv)
        check_overrides_compose(sys.argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    main()
