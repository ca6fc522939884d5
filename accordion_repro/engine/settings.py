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
    epochs: int = option(Options.integer, on_resume="changeable", help="epochs to train")
    batch_size: int = option(
        Options.integer,
        help="samples per worker per step (the global batch is this x the world size)")
    eval_batch_size: int = option(
        Options.integer, on_resume="changeable",
        help="samples per evaluation batch")
    max_steps_per_epoch: int | None = option(
        Options.integer, optional=True, on_resume="changeable",
        help="cap on the training steps of an epoch (null: the whole epoch)")
    max_eval_steps: int | None = option(
        Options.integer, optional=True, on_resume="changeable",
        help="cap on the evaluation batches after an epoch (null: the whole test set)")
    max_micro_batch: int | None = option(
        Options.integer, optional=True,
        help="largest micro-batch one forward runs; a bigger batch accumulates (null: no cap; "
             "images only)")
    stop_after_epoch: int | None = option(
        Options.integer, minimum=0, optional=True, on_resume="free",
        help="stop cleanly after this epoch, resumable (null: run every epoch)")
    resume: str = option(
        Options.choice, ("auto", "never"), on_resume="free",
        help="auto: continue the run in the directory from its checkpoint; never: move it aside "
             "and start afresh")
    device: str = option(
        Options.choice, ("auto", "cpu", "cuda"),
        help="auto: CUDA when available, else the CPU")
    progress: str = option(
        Options.choice, ("auto", "always", "never"), on_resume="free",
        help="the progress bar: auto (on a terminal), always or never")
    nan_policy: str = option(
        Options.choice, ("stop", "continue"), on_resume="changeable",
        help="stop: end the run at the first epoch whose loss is not finite; continue: train on")
    allow_config_change: bool = option(
        Options.flag, on_resume="free",
        help="resume with the new values of the keys a resume may change (rundir.py), recording "
             "the change")
    num_workers: int | str = option(
        lambda o, k: "auto" if o.get(k) == "auto" else o.integer(k, minimum=0), on_resume="changeable",
        help="data loader processes per rank (auto: 4 on CUDA, 0 on the CPU)")
    checkpoint: bool = option(
        Options.flag, on_resume="changeable",
        help="write checkpoints/last.pt at the end of every epoch")
    reshuffle_each_epoch: bool = option(
        Options.flag,
        help="a new sample order every epoch (false: the same order every epoch, as the official "
             "code)")
    deterministic: bool = option(Options.flag, help="deterministic cuDNN kernels (no autotuning)")
    precision: str = option(
        Options.choice, ("fp32", "bf16", "fp16"), added="fp32",
        help="the compute precision of forward and backward (engine/precision.py)")
    channels_last: bool = option(
        Options.flag, added=False,
        help="NHWC conv weights and inputs (image models)")

    @property
    def use_cuda(self) -> bool:
        import torch

        return self.device == "cuda" or (self.device == "auto" and torch.cuda.is_available())


@dataclass(frozen=True)
class OptimSettings(Settings):
    SECTION = "optim"
    name: str = option(
        Options.choice, ("sgd", "lstm_momentum"),
        help="the optimiser: sgd (the CIFAR models) or lstm_momentum (the official LSTM's)")
    lr: float = option(
        Options.number, on_resume="changeable",
        help="learning rate of one worker at reference_batch samples per step")
    momentum: float = option(
        Options.number, high=1, closed="low", on_resume="changeable",
        help="momentum, in [0, 1)")
    weight_decay: float = option(
        Options.number, closed="low", on_resume="changeable",
        help="L2 weight decay")
    warmup_epochs: float = option(
        Options.number, closed="low", on_resume="changeable",
        help="epochs of linear warm-up from lr to lr x the world size")
    decay_factor: float = option(
        Options.number, high=1, closed="high", on_resume="changeable",
        help="the LR is multiplied by this at each decay epoch")
    reference_batch: float = option(
        Options.number, low=1, closed="low", on_resume="changeable",
        help="the per-worker batch the lr is set for (it scales linearly with trainer.batch_size)")
    clip_grad_norm: float | None = option(
        Options.number, optional=True, on_resume="changeable",
        help="clip the gradient to this L2 norm (null: no clipping)")
    clip_point: str = option(
        Options.choice, ("local", "averaged"), on_resume="changeable",
        help="clip each worker's local gradient (the detector sees it clipped) or the averaged one")
    nesterov: bool = option(Options.flag, on_resume="changeable", help="Nesterov momentum")
    decay_at: list | None = option(
        Options.get, on_resume="changeable",
        help="decay epochs, or fractions of the run (rounded to an epoch)")
    official_off_by_one: bool = option(
        Options.flag, on_resume="changeable",
        help="reproduce the official scripts' LR off-by-one (the LR of epoch e+1 is set at the end"
             " of e)")
    official_decay_compare: list | None = option(
        Options.get, None, on_resume="changeable",
        help="one '>' or '>=' per decay: the official scripts' comparison (absent: '>' at every "
             "decay)")


@dataclass(frozen=True)
class DistSettings(Settings):
    SECTION = "dist"
    nproc_per_node: int = option(
        Options.integer,
        help="ranks to start on this host when not under torchrun or Slurm")
    backend: str = option(
        Options.choice, ("auto", "gloo", "nccl"),
        help="the process group's backend (auto: nccl on CUDA, gloo on the CPU)")
    launcher: str = option(
        Options.choice, ("auto", "spawn", "env"),
        help="auto: join torchrun's or Slurm's ranks when their variables are set, else spawn; "
             "spawn; env")
    master_addr: str = option(
        Options.get, on_resume="free",
        help="the address the spawned local ranks rendezvous on")
    timeout_s: int = option(
        Options.integer, on_resume="free",
        help="timeout of one collective, in seconds")
    # ddp: every rank holds the whole model, the reducer all-reduces; fsdp: FSDP2 shards the
    # model and the reducer runs inside its reduce-scatter (docs/fsdp.md)
    strategy: str = option(
        Options.choice, ("ddp", "fsdp"), added="ddp",
        help="ddp: every rank holds the whole model; fsdp: FSDP2 shards it and the reducer runs in"
             " its reduce-scatter")
