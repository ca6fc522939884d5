"""Validation of a composed config, before any rank starts.

Every check here exists so that a typo or an out-of-range value costs the user one second, not
a queued Slurm job: the message names the key. Checks that belong to a package (compressor
options, schedule levels, dataset files) are delegated to that package's own validator, so the
rules live in one place. What the checks read is kept: validate returns it as RunSettings
(settings.py), which the ranks and every component take instead of the config.
"""

from __future__ import annotations

import hashlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Mapping

import yaml

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from accordion_repro.comm.config import check_level
from accordion_repro.comm.registry import compressor_settings, level_kind, level_option
from accordion_repro.env import env_rank
from accordion_repro.errors import ConfigError, ConfigWarning
from accordion_repro.options import Options, defaults_of
from accordion_repro.run_layout import CONF_DIR  # noqa: F401  (train.py and tests read it here)
from accordion_repro.run_settings import RunSettings


MAX_SUBDIR = 200  # file systems allow 255 bytes per path component


def _subdir(override_dirname: str) -> str:
    """Hydra's override dirname as a path prefix ('' when there are no overrides).

    A long list of overrides would make one path component longer than the file system
    allows; it is cut and a hash of the whole list keeps different runs apart.
    """
    if not override_dirname:
        return ""
    if len(override_dirname.encode()) > MAX_SUBDIR:
        digest = hashlib.sha256(override_dirname.encode()).hexdigest()[:12]
        override_dirname = f"{override_dirname.encode()[:MAX_SUBDIR - 14].decode(errors='ignore')}~{digest}"
    return f"{override_dirname}/"


def _mul(*factors: Any) -> int:
    """Integer product, so presets can say `${acc.mul:${trainer.batch_size},4}`."""
    out = 1
    for f in factors:
        out *= int(f)
    return out


def _own_level(schedule: str, level: Any) -> Any:
    """The compressor's own level in conf/compressor/*.yaml: `level`, or null under a schedule
    that sets every layer's level, which never reads it (`${acc.own_level:${schedule.name},2}`).
    A level a preset or the command line sets replaces this default: check_level_owner refuses it."""
    from accordion_repro.accordion import SCHEDULES

    cls = SCHEDULES.get(schedule)
    return None if cls is not None and cls.sets_levels else level


def _pid() -> str:
    """This process's id: each process of a job (every rank under torchrun or srun runs the CLI)
    gets its own `hydra.output_subdir`, .hydra/pending-<pid>, so none moves or deletes another's
    files while that one is still writing them."""
    return str(os.getpid())


def register_resolvers() -> None:
    """Resolvers the conf/ tree uses; safe to call more than once."""
    OmegaConf.register_new_resolver("acc.pid", _pid, replace=True)
    OmegaConf.register_new_resolver("acc.subdir", _subdir, replace=True)
    OmegaConf.register_new_resolver("acc.mul", _mul, replace=True)
    OmegaConf.register_new_resolver("acc.own_level", _own_level, replace=True)


def register_defaults() -> None:
    """Give conf/ the defaults of every package's settings dataclasses.

    A default lives in one place: the dataclass, because compressors, schedules, models and
    datasets are also used without Hydra. conf/<group>/<name>.yaml starts from
    `/_defaults/<group>/<name>` (stored here), so every option can still be overridden on the
    command line, and holds only what the dataclass does not default (a level, a batch bound, a
    file) or what conf ties to another key (`seed: ${seed}`, `root: ${paths.data_dir}`).
    The trainer's, optimiser's and launcher's settings default nothing: conf/ holds theirs.
    """
    from hydra.core.config_store import ConfigStore

    from accordion_repro.accordion import SCHEDULES
    from accordion_repro.data.registry import SETTINGS as DATASET_SETTINGS
    from accordion_repro.models.factory import SETTINGS as MODEL_SETTINGS

    store = ConfigStore.instance()
    groups = {"compressor": compressor_settings(), "model": MODEL_SETTINGS,
              "dataset": DATASET_SETTINGS,
              "schedule": {name: cls.Settings for name, cls in SCHEDULES.items()}}
    for group, settings in groups.items():
        for name, cls in settings.items():
            store.store(group=f"_defaults/{group}", name=name,
                        node={"name": name, **defaults_of(cls)})
    # a compressor registered without a conf/compressor/<name>.yaml (a plugin's) is still
    # `compressor=<name>`: its group file is its defaults and its level option, unset (null:
    # a schedule that sets every layer's level needs none; any other asks for it by its key)
    for name, cls in groups["compressor"].items():
        if not (CONF_DIR / "compressor" / f"{name}.yaml").is_file():
            level = {cls.LEVEL[0]: None} if cls.LEVEL[0] else {}
            store.store(group="compressor", name=name, node={"name": name, **level})


register_resolvers()
register_defaults()


def world_size_of(dist_settings) -> int:
    """The number of ranks a run with these DistSettings will run on (the environment of
    torchrun / Slurm first)."""
    from accordion_repro.env import env_world_size

    env = env_world_size() if dist_settings.launcher != "spawn" else None
    return env if env is not None else dist_settings.nproc_per_node


def _conf_keys(group: str) -> list[str]:
    """The keys conf/ gives a node that no settings class reads (run, paths, logger, scale):
    those of its group files (for `run`, of conf/config.yaml), so conf/ is their one list."""
    if group == "run":
        return list(yaml.safe_load((CONF_DIR / "config.yaml").read_text())["run"])
    keys: set[str] = set()
    for path in (CONF_DIR / group).glob("*.yaml"):
        node = yaml.safe_load(path.read_text()) or {}
        keys.update(node.get(group, {}) if "@package _global_" in path.read_text() else node)
    return sorted(keys)


# The top-level nodes of a composed config; each node is checked for keys it does not take.
SECTIONS = ("seed", "run", "model", "dataset", "compressor", "schedule", "optim", "trainer",
            "dist", "logger", "paths", "scale", "plugins")


def reject_unknown_keys(c: Mapping) -> None:
    """Refuse a key no part of the suite reads (`+trainer.epoch=5`, `++dist.nprocs=4`), naming
    it, in the nodes that have no settings class to do it: the top level, run, paths, logger and
    scale (model, dataset, compressor, schedule, optim, trainer, dist and logger.wandb are
    refused by their settings classes, read with `owner`)."""
    Options("", c).reject_unknown(SECTIONS, "the config")
    for section in ("run", "paths", "logger", "scale"):
        Options(section, c[section]).reject_unknown(_conf_keys(section), section)


def _require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(key, message)


def check_level_owner(compressor: str, options: Mapping, schedule: str) -> None:
    """compressor.rank / ratio is read only under a schedule that keeps the compressor's own
    level (static, batch_accordion), which needs one. A schedule that sets every layer's level
    never reads it, so a value set there (a preset, `compressor.rank=4` on the command line)
    would be dead: refused, naming the key, as Accordion(...) refuses rank= (ddp.py). Unknown
    names are left to validate_compressor and validate_schedule."""
    from accordion_repro.accordion import SCHEDULES

    option, cls = level_option(compressor), SCHEDULES.get(schedule)
    if option is None or cls is None:
        return
    key, value = f"compressor.{option}", options.get(option)
    if not cls.sets_levels:
        check_level(level_kind(compressor), value, key)
    elif value is not None:
        raise ConfigError(key, f"schedule {schedule!r} takes no {key}: the schedule sets each "
                               f"layer's {option}, so it would never be read (got {value!r}); "
                               "leave it unset")


def _check_fsdp(t, world: int) -> None:
    """dist.strategy=fsdp refuses, before any rank starts, what it cannot shard (one line each)."""
    from accordion_repro.torch_apis import torch_too_old_for

    too_old = torch_too_old_for("fsdp")
    _require(too_old is None, "dist.strategy",
             f"fsdp (FSDP2's custom reduce-scatter and all-gather, pytorch#155189) {too_old}: "
             "install a newer torch, or use dist.strategy=ddp")
    _require(world >= 2, "dist.strategy",
             f"fsdp needs 2 or more ranks, got {world}: with one, FSDP reduces nothing and the "
             "compressor never runs (dist.nproc_per_node=2, or dist.strategy=ddp)")
    _require(t.precision != "fp16", "trainer.precision",
             "fp16 is not supported under dist.strategy=fsdp: loss scaling unscales each rank's "
             "local gradient, which FSDP reduces inside backward; use bf16 or fp32")


def _warn_if_bf16_is_emulated(t) -> None:
    import torch

    from accordion_repro.engine.precision import EMULATED_BF16, cpu_bf16_is_emulated

    if t.precision == "bf16" and not t.use_cuda and cpu_bf16_is_emulated():
        print("warning: " + EMULATED_BF16.format(
            capability=torch.backends.cpu.get_cpu_capability()), file=sys.stderr)


def _check_feasible(sched_name, schedule, compressor: str, world: int, t, model_name: str,
                    model_options, dataset) -> None:
    """Refuse, before any rank starts, settings no plan can meet on this model's layers (a
    budget below the cheapest plan, an L-GreCo alpha that may leave none): the schedule is built
    on the layer shapes of the model made on the meta device (no memory, no compute) and asked
    (Schedule.check_feasible). The LSTM's shapes wait for its vocabulary: not checked here."""
    from accordion_repro.accordion import SCHEDULES, build_schedule
    from accordion_repro.accordion.schedules import Schedule

    cls = SCHEDULES[sched_name]
    if cls.check_feasible is Schedule.check_feasible or model_name == "lstm":
        return
    import torch

    from accordion_repro.models import build_model

    with torch.device("meta"):
        model = build_model(model_name, num_classes=getattr(dataset, "num_classes", 10),
                            settings=model_options)
    shapes = [(p.shape[0], p[0].numel()) for p in model.parameters()
              if p.requires_grad and p.dim() >= 2]
    build_schedule(sched_name, num_layers=len(shapes), compressor=compressor, default_level=None,
                   base_global_batch=t.batch_size * world, world_size=world,
                   total_epochs=t.epochs, layer_shapes=shapes, settings=schedule).check_feasible()


def validate(cfg: DictConfig) -> RunSettings:
    """The run's RunSettings, every option read and checked once; ConfigError (or
    DatasetMissingError) for anything that would fail later."""
    from accordion_repro.accordion import SCHEDULES, validate_schedule
    from accordion_repro.comm import validate_compressor
    from accordion_repro.data import DATASET_NAMES, check_dataset, dataset_settings
    from accordion_repro.models.factory import MODEL_NAMES, model_settings

    # Names first: other values may be looked up by them (scale maps are keyed by dataset).
    model_name, dataset_name = cfg.model.get("name"), cfg.dataset.get("name")
    _require(model_name in MODEL_NAMES, "model.name",
             f"unknown model {model_name!r}; choose one of {', '.join(MODEL_NAMES)}")
    _require(dataset_name in DATASET_NAMES, "dataset.name",
             f"unknown dataset {dataset_name!r}; choose one of {', '.join(DATASET_NAMES)}")
    try:
        c = OmegaConf.to_container(cfg, resolve=True)
    except InterpolationResolutionError as exc:
        key = getattr(exc, "full_key", None) or "config"
        raise ConfigError(str(key), f"cannot be resolved: {exc.msg if hasattr(exc, 'msg') else exc}") from None
    c.pop("hydra", None)

    from accordion_repro.engine.lr import build_epoch_lr
    from accordion_repro.engine.settings import DistSettings, OptimSettings, TrainerSettings
    from accordion_repro.runlog import WandbSettings

    reject_unknown_keys(c)
    plugins = c.get("plugins", [])
    _require(isinstance(plugins, list) and all(isinstance(m, str) for m in plugins), "plugins",
             f"must be a list of module names (plugins=[mypkg.compressors]), got {plugins!r}")
    # before the compressor's and the data's seeds, which conf ties to it: a bad value is named
    # by the key the user typed
    seed = Options("", c).integer("seed", minimum=0)
    t = TrainerSettings.from_config(c["trainer"], owner="trainer")
    optim = OptimSettings.from_config(c["optim"], owner=f"optimizer {c['optim'].get('name')!r}")
    # reads optim through OptimSettings, then checks optim.decay_at and official_decay_compare;
    # what it warns about is shown once, one line each (rank 0 under torchrun or Slurm), at the end
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ConfigWarning)
        build_epoch_lr(optim, total_epochs=t.epochs, world_size=1, batch_size=t.batch_size)
    dist_settings = DistSettings.from_config(c["dist"], owner="dist")
    world = world_size_of(dist_settings)
    if dist_settings.strategy == "fsdp":
        _check_fsdp(t, world)
    model = dict(c["model"])
    model_options = model_settings(model.pop("name"), model)
    wandb = WandbSettings.from_config(c["logger"]["wandb"], owner="logger.wandb")

    is_text = c["model"]["name"] == "lstm"
    dataset_is_text = c["dataset"]["name"] in ("wikitext2", "synthetic_text")
    _require(is_text == dataset_is_text, "dataset.name",
             f"model {c['model']['name']!r} cannot train on dataset {c['dataset']['name']!r}")
    _require(not (is_text and t.channels_last), "trainer.channels_last",
             "is for convolutional image models; the LSTM has no 4-D tensors to lay out")

    comp = dict(c["compressor"])
    comp_name = comp.pop("name")
    compressor = validate_compressor(comp_name, comp)
    sched = dict(c["schedule"])
    sched_name = sched.pop("name")
    check_level_owner(comp_name, comp, sched_name)
    base = t.batch_size * world
    schedule = validate_schedule(sched_name, sched, compressor=comp_name, world_size=world,
                                 total_epochs=t.epochs)
    # The batch schedules scale the LR from B_low, so B_low must be the batch the LR is set for.
    b_low = SCHEDULES[sched_name].batch_low_option
    if b_low is not None:
        _require(getattr(schedule, b_low) == base, f"schedule.{b_low}",
                 f"B_low must equal trainer.batch_size x world size = {t.batch_size} x {world} "
                 f"= {base} (the batch the LR schedule is set for), got {getattr(schedule, b_low)}")
    dataset = dataset_settings(c["dataset"])
    check_dataset(dataset)
    _check_feasible(sched_name, schedule, comp_name, world, t, model_name, model_options, dataset)
    # the warnings only once every check passed: a refused job's stderr is its one error line
    if env_rank() == 0:
        for warning in caught:
            print(f"warning: {warning.message}", file=sys.stderr)
        _warn_if_bf16_is_emulated(t)
    return RunSettings(
        seed=seed, scale=c["scale"]["name"], trainer=t,
        optim=optim, dist=dist_settings, model_name=model_name, model=model_options,
        dataset=dataset, compressor_name=comp_name, compressor=compressor,
        schedule_name=sched_name, schedule=schedule, wandb=wandb, resolved=c)
