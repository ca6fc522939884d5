"""The trainer's, the optimiser's and the launcher's options, read once (no torch at import).

Each field names the Options reader that checks it. The trainer is only ever driven through a
composed config, so conf/ holds every default and these dataclasses none. A field read with
`Options.get` passes unchecked (engine.lr checks `optim.decay_at`).
"""

from __future__ import annotations

from dataclasses import dataclass

from accordion_repro.options import Options, Settings, option


@dataclass(frozen=True)
class TrainerSettings(Settings):
    SECTION = "trainer"
    epochs: int = option(Options.integer)
    batch_size: int = option(Options.integer)  # per worker
    eval_batch_size: int = option(Options.integer)
    max_steps_per_epoch: int | None = option(Options.integer, optional=True)  # None: no limit
    max_eval_steps: int | None = option(Options.integer, optional=True)
    max_micro_batch: int | None = option(Options.integer, optional=True)
    stop_after_epoch: int | None = option(Options.integer, minimum=0, optional=True)
    resume: str = option(Options.choice, ("auto", "never"))
    device: str = option(Options.choice, ("auto", "cpu", "cuda"))
    progress: str = option(Options.choice, ("auto", "always", "never"))
    nan_policy: str = option(Options.choice, ("stop", "continue"))
    allow_config_change: bool = option(Options.flag)
    num_workers: int | str = option(lambda o, k: "auto" if o.get(k) == "auto" else o.integer(k, minimum=0))
    checkpoint: bool = option(Options.flag)
    reshuffle_each_epoch: bool = option(Options.flag)
    deterministic: bool = option(Options.flag)
    precision: str = option(Options.choice, ("fp32", "bf16", "fp16"))  # engine/precision.py
    channels_last: bool = option(Options.flag)  # NHWC conv weights and inputs (image models)

    @property
    def use_cuda(self) -> bool:
        import torch

        return self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available())


@dataclass(frozen=True)
class OptimSettings(Settings):
    SECTION = "optim"
    name: str = option(Options.choice, ("sgd", "lstm_momentum"))
    lr: float = option(Options.number)  # of one worker at reference_batch samples per step
    momentum: float = option(Options.number, high=1, closed="low")
    weight_decay: float = option(Options.number, closed="low")
    warmup_epochs: float = option(Options.number, closed="low")
    decay_factor: float = option(Options.number, high=1, closed="high")
    reference_batch: float = option(Options.number, low=1, closed="low")
    clip_grad_norm: float | None = option(Options.number, optional=True)
    clip_point: str = option(Options.choice, ("local", "averaged"))
    nesterov: bool = option(Options.flag)
    decay_at: list | None = option(Options.get)  # epochs, or fractions of the run
    official_off_by_one: bool = option(Options.flag)
    official_decay_compare: list | None = option(Options.get, None)  # absent: '>' at every decay


@dataclass(frozen=True)
class DistSettings(Settings):
    SECTION = "dist"
    nproc_per_node: int = option(Options.integer)  # ranks to start when not under torchrun / Slurm
    backend: str = option(Options.choice, ("auto", "gloo", "nccl"))
    launcher: str = option(Options.choice, ("auto", "spawn", "env"))
    master_addr: str = option(Options.get)
    timeout_s: int = option(Options.integer)  # collective timeout
    # ddp: every rank holds the whole model, the reducer all-reduces; fsdp: FSDP2 shards the
    # model and the reducer runs inside its reduce-scatter (docs/fsdp.md)
    strategy: str = option(Options.choice, ("ddp", "fsdp"))
