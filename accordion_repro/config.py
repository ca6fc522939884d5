"""Validation of a composed config, before any rank starts.

Every check here exists so that a typo or an out-of-range value costs the user one second, not
a queued Slurm job: the message names the key. Checks that belong to a package (compressor
options, schedule levels, dataset files) are delegated to that package's own validator, so the
rules live in one place.
"""

from __future__ import annotations

import hashlib

from typing import Any, Mapping

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from accordion_repro.errors import ConfigError


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


def register_resolvers() -> None:
    """Resolvers the conf/ tree uses; safe to call more than once."""
    OmegaConf.register_new_resolver("acc.subdir", _subdir, replace=True)
    OmegaConf.register_new_resolver("acc.mul", _mul, replace=True)


register_resolvers()


def world_size_of(cfg: Mapping) -> int:
    """The number of ranks this config will run on (environment of torchrun / Slurm first)."""
    from accordion_repro.env import env_world_size

    env = env_world_size() if cfg["dist"].get("launcher", "auto") != "spawn" else None
    return env if env is not None else int(cfg["dist"]["nproc_per_node"])


def compressor_level(name: str, options: Mapping):
    """The compressor's own level: a PowerSGD rank, a Top-K ratio, or None for dense."""
    return {"powersgd": options.get("rank"), "topk": options.get("ratio")}.get(name)


def _require(cond: bool, key: str, message: str) -> None:
    if not cond:
        raise ConfigError(key, message)


def _positive_int(cfg: Mapping, section: str, key: str, allow_none: bool = False) -> None:
    value = cfg[section].get(key)
    if value is None and allow_none:
        return
    _require(
        isinstance(value, int) and not isinstance(value, bool) and value >= 1,
        f"{section}.{key}",
        f"must be an integer >= 1, got {value!r}",
    )


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError (or DatasetMissingError) for anything that would fail later."""
    from accordion_repro.accordion import validate_schedule
    from accordion_repro.comm import validate_compressor
    from accordion_repro.data import DATASET_NAMES, check_dataset
    from accordion_repro.models import MODEL_NAMES

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

    trainer, optim, dist = c["trainer"], c["optim"], c["dist"]
    _positive_int(c, "trainer", "epochs")
    _positive_int(c, "trainer", "batch_size")
    _positive_int(c, "trainer", "eval_batch_size")
    _positive_int(c, "trainer", "max_steps_per_epoch", allow_none=True)
    _positive_int(c, "trainer", "max_eval_steps", allow_none=True)
    _positive_int(c, "trainer", "max_micro_batch", allow_none=True)
    stop = trainer.get("stop_after_epoch")
    _require(stop is None or (isinstance(stop, int) and stop >= 0), "trainer.stop_after_epoch",
             f"must be an epoch >= 0 or null, got {stop!r}")
    _require(trainer["resume"] in ("auto", "never"), "trainer.resume",
             f"must be auto or never, got {trainer['resume']!r}")
    _require(trainer["device"] in ("auto", "cpu", "cuda"), "trainer.device",
             f"must be auto, cpu or cuda, got {trainer['device']!r}")
    _require(trainer["progress"] in ("auto", "always", "never"), "trainer.progress",
             f"must be auto, always or never, got {trainer['progress']!r}")
    _require(trainer["nan_policy"] in ("stop", "continue"), "trainer.nan_policy",
             f"must be stop or continue, got {trainer['nan_policy']!r}")
    _require(isinstance(trainer["allow_config_change"], bool), "trainer.allow_config_change",
             f"must be true or false, got {trainer['allow_config_change']!r}")
    nw = trainer["num_workers"]
    _require(nw == "auto" or (isinstance(nw, int) and nw >= 0), "trainer.num_workers",
             f"must be auto or an integer >= 0, got {nw!r}")

    _require(optim["name"] in ("sgd", "lstm_momentum"), "optim.name",
             f"unknown optimizer {optim['name']!r}; choose sgd or lstm_momentum")
    _require(isinstance(optim["lr"], (int, float)) and optim["lr"] > 0, "optim.lr",
             f"must be > 0, got {optim['lr']!r}")
    _require(0 <= optim["momentum"] < 1, "optim.momentum", f"must be in [0, 1), got {optim['momentum']!r}")
    _require(optim["weight_decay"] >= 0, "optim.weight_decay", f"must be >= 0, got {optim['weight_decay']!r}")
    _require(optim["warmup_epochs"] >= 0, "optim.warmup_epochs", f"must be >= 0, got {optim['warmup_epochs']!r}")
    _require(0 < optim["decay_factor"] <= 1, "optim.decay_factor", f"must be in (0, 1], got {optim['decay_factor']!r}")
    _require(optim["reference_batch"] >= 1, "optim.reference_batch", "must be >= 1")
    clip = optim.get("clip_grad_norm")
    _require(clip is None or clip > 0, "optim.clip_grad_norm", f"must be > 0 or null, got {clip!r}")
    _require(optim["clip_point"] in ("local", "averaged"), "optim.clip_point",
             f"must be local or averaged, got {optim['clip_point']!r}")
    from accordion_repro.engine.lr import build_epoch_lr

    # raises ConfigError("optim.decay_at") or ("optim.official_decay_compare")
    build_epoch_lr(optim, total_epochs=trainer["epochs"], world_size=1, batch_size=trainer["batch_size"])

    _positive_int(c, "dist", "nproc_per_node")
    _require(dist["backend"] in ("auto", "gloo", "nccl"), "dist.backend",
             f"must be auto, gloo or nccl, got {dist['backend']!r}")
    _require(dist["launcher"] in ("auto", "spawn", "env"), "dist.launcher",
             f"must be auto, spawn or env, got {dist['launcher']!r}")
    mode = c["logger"]["wandb"]["mode"]
    _require(mode in ("offline", "online", "disabled"), "logger.wandb.mode",
             f"must be offline, online or disabled, got {mode!r}")

    is_text = c["model"]["name"] == "lstm"
    dataset_is_text = c["dataset"]["name"] in ("wikitext2", "synthetic_text")
    _require(is_text == dataset_is_text, "dataset.name",
             f"model {c['model']['name']!r} cannot train on dataset {c['dataset']['name']!r}")

    comp = dict(c["compressor"])
    comp_name = comp.pop("name")
    validate_compressor(comp_name, comp)
    world = world_size_of(c)
    sched = dict(c["schedule"])
    sched_name = sched.pop("name")
    validate_schedule(
        sched_name, sched,
        compressor=comp_name,
        default_level=compressor_level(comp_name, comp),
        base_global_batch=trainer["batch_size"] * world,
        world_size=world,
        total_epochs=trainer["epochs"],
    )
    # The batch schedules scale the LR from B_low, so B_low must be the batch the LR is set for.
    b_low_key = {"batch_accordion": "low", "joint": "batch_low"}.get(sched_name)
    if b_low_key is not None:
        base = trainer["batch_size"] * world
        _require(sched[b_low_key] == base, f"schedule.{b_low_key}",
                 f"B_low must equal trainer.batch_size x world size = {trainer['batch_size']} x {world} "
                 f"= {base} (the batch the LR schedule is set for), got {sched[b_low_key]}")
    check_dataset(c["dataset"])
