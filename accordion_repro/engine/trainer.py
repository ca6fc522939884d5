"""The training loop: local gradients -> detector -> reducer -> optimizer, epoch after epoch.

One loop serves every model, compressor and schedule: the task hides the data, the reducer the
communication, the schedule the adaptation. At the end of each epoch rank 0's measurement is
broadcast and every rank's schedule turns it into the same plan (levels, batch size, LR scale)
for the next epoch (accordion/controller.py, as the own-code objects do).
"""

from __future__ import annotations

import logging
import math
import random
import signal
import sys
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from accordion_repro.accordion import build_schedule
from accordion_repro.accordion.controller import AdaptController, AdaptViews
from accordion_repro.comm import build_reducer
from accordion_repro.comm.config import level_of
from accordion_repro.comm.collectives import control_group
from accordion_repro.comm.collectives import distributed as _distributed
from accordion_repro.comm.stats import CommStats
from accordion_repro.data import build_data
from accordion_repro.engine import checkpoint, sharding, stop
from accordion_repro.engine.clock import PhaseClock
from accordion_repro.engine.lr import build_epoch_lr
from accordion_repro.engine.numerics import numerics_record
from accordion_repro.engine.optim import build_optimizer
from accordion_repro.engine.precision import LossScaler, autocast
from accordion_repro.engine.tasks import build_task
from accordion_repro.env import local_cuda_device
from accordion_repro.errors import ConfigWarning, TrainingDiverged
from accordion_repro.runlog import NullRunLogger, RunLogger
from accordion_repro.options import require_settings
from accordion_repro.run_settings import RunSettings
from accordion_repro.models import build_model, count_parameters


log = logging.getLogger("accordion_repro.train")

# tqdm's default lock holds a multiprocessing RLock: a named semaphore in each rank, which a
# rank ended by SIGKILL (a second stop signal, a crash) leaves to the resource tracker, whose
# "leaked semaphore objects" warning then follows the job's own last line (and failed
# test_a_second_sigterm_ends_the_run_as_stopped_and_resumable under load). One thread of one
# process draws the bar: a thread lock is all it needs.
tqdm.set_lock(threading.RLock())


class _StopRequested(Exception):
    """A signal asked the run to stop; raised between steps on every rank at once, with the
    signal, the epoch and the steps done."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _marking_last(batches, accum: int):
    """One step's micro-batches (at most `accum`) as (batch, whether it is the step's last): the
    next one is fetched before a backward, so FSDP knows which backward must reduce (the others
    accumulate unsharded gradients), also when the data ends inside a step."""
    batch = next(batches, None)
    for got in range(1, accum + 1):
        if batch is None:
            return
        upcoming = next(batches, None) if got < accum else None
        yield batch, upcoming is None
        batch = upcoming


class Trainer(AdaptViews):
    def __init__(self, run: RunSettings, run_dir: Path):
        """`run`: config.validate's RunSettings; each component gets its own checked part."""
        self.run = require_settings(run, RunSettings, "Trainer", "config.validate(cfg) returns it")
        self.run_dir = Path(run_dir)
        self.rank = dist.get_rank() if _distributed() else 0
        self.world_size = dist.get_world_size() if _distributed() else 1
        self.settings = t = run.trainer
        self.optim = run.optim
        if t.use_cuda:
            torch.cuda.set_device(local_cuda_device(torch.cuda.device_count()))  # as launch did
            self.device = torch.device("cuda", torch.cuda.current_device())
            torch.backends.cudnn.benchmark = not t.deterministic
            torch.backends.cudnn.deterministic = bool(t.deterministic)
        else:
            self.device = torch.device("cpu")

        # Same seed on every rank, as the official code; weights are then broadcast from rank 0.
        seed = run.seed
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        self.bundle = build_data(run.dataset, seed)
        self.model = build_model(run.model_name, num_classes=self.bundle.num_classes,
                                 vocab_size=self.bundle.vocab_size, settings=run.model).to(self.device)
        if t.channels_last:  # conv weights NHWC; the reducer sees their logical (NCHW) order
            self.model = self.model.to(memory_format=torch.channels_last)
        self.scaler = LossScaler() if t.precision == "fp16" else None
        self._broadcast_model()
        # dist.strategy=fsdp: the same reducer runs inside FSDP's reduce-scatter during backward
        # (comm/fsdp.py); p.grad is then this rank's shard of the averaged gradient.
        self.fsdp = None
        if run.dist.strategy == "fsdp":
            from accordion_repro.comm.fsdp import FSDPReducerState

            # clip_point=local clips each rank's whole local gradient inside the one reduction
            clip_local = self.optim.clip_grad_norm if self.optim.clip_point == "local" else None
            self.model = sharding.shard_model(self.model, self.device, one_unit=bool(clip_local))
            self.fsdp = FSDPReducerState(self.model, run.compressor, check_levels=False,
                                         clip_local=clip_local)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.reducer = (self.fsdp.reducer if self.fsdp is not None
                        else build_reducer(run.compressor, self.params))
        self.compressible = [i for i, c in enumerate(self.reducer.compressible) if c]

        schedule = build_schedule(
            run.schedule_name, num_layers=len(self.compressible), compressor=run.compressor_name,
            default_level=level_of(run.compressor),
            base_global_batch=t.batch_size * self.world_size, world_size=self.world_size,
            total_epochs=t.epochs, layer_shapes=self.reducer.matrix_shapes, settings=run.schedule)
        # Stop requests and rank 0's plan go on the CPU (gloo): NCCL runs pay no GPU sync.
        self._control_group = control_group() if _distributed() else None
        # the schedule, rank 0's detector and the plan, as the own-code objects hold them
        self.adapt = AdaptController(schedule, rank=self.rank, group=self._control_group)

        self.task = build_task(self.bundle, run, rank=self.rank, world_size=self.world_size,
                               device=self.device)
        with warnings.catch_warnings():  # config.validate showed them before the ranks started
            warnings.simplefilter("ignore", ConfigWarning)
            self.epoch_lr = build_epoch_lr(self.optim, total_epochs=t.epochs,
                                           world_size=self.world_size, batch_size=t.batch_size)
        self.optimizer = build_optimizer(self.optim, self.params, lr=self.epoch_lr(0))
        self.start_epoch = 0
        self.config_change = run.config_change
        self.wandb_id = None
        self.totals = {"floats": 0, "bytes": 0, "train_time_s": 0.0}
        self.metric_lines: list[str] = []  # rank 0: every metrics.jsonl line so far
        self._resume()
        if self.fsdp is not None and self.detector is not None:  # fed by the FSDP comm
            self.detector.prepare(self.fsdp.layer_params)
            self.fsdp.detector = self.detector
        self.resume_epoch = self.start_epoch  # where a rerun resumes: the last checkpoint's next
        self.logger = RunLogger(
            self.run_dir, config=run.resolved, wandb=run.wandb,
            wandb_id=self.wandb_id) if self.rank == 0 else NullRunLogger()
        self.logger.truncate_from(self.start_epoch)

    # ----------------------------------------------------------------------------------- set-up
    def _broadcast_model(self) -> None:
        if _distributed():
            with torch.no_grad():
                for tensor in list(self.model.parameters()) + list(self.model.buffers()):
                    dist.broadcast(tensor.data, src=0)

    def _resume(self) -> None:
        loaded = (checkpoint.load(self.run_dir, self.rank, self.world_size)
                  if self.settings.resume == "auto" else None)
        if loaded is None:
            return
        shared, mine = loaded
        # The optimizer's state dict carries its hyperparameters too; this run's config sets
        # them (an allowed config change takes effect; an unchanged one sets the same values).
        hyper = [{k: v for k, v in group.items() if k != "params"} for group in self.optimizer.param_groups]
        if self.fsdp is not None:
            sharding.load_full_state(self.model, self.optimizer, shared["model"], shared["optimizer"])
        else:
            self.model.load_state_dict(shared["model"])
            self.optimizer.load_state_dict(shared["optimizer"])
        for group, values in zip(self.optimizer.param_groups, hyper):
            group.update(values)
        # with an allowed config change the first resumed epoch runs the new settings' plan
        self.adapt.load_state_dict(shared, strict=not self.config_change,
                                   replan_from=int(shared["epoch"]) + 1 if self.config_change else None)
        if self.scaler is not None:
            self.scaler.load_state_dict(shared["loss_scale"])
        self.start_epoch = int(shared["epoch"]) + 1
        self.wandb_id = shared.get("wandb_id")
        self.totals = shared["totals"]
        self.metric_lines = list(shared.get("metric_lines") or [])
        self.reducer.load_state_dict(mine["reducer"])
        checkpoint.set_rng_state(mine["rng"])

    def _save(self, epoch: int) -> None:
        shared = None
        if self.fsdp is not None:  # collective: the whole state, gathered to rank 0
            model_state, optimizer_state = sharding.full_state(self.model, self.optimizer)
        elif self.rank == 0:
            model_state, optimizer_state = self.model.state_dict(), self.optimizer.state_dict()
        if self.rank == 0:
            shared = {"epoch": epoch, "model": model_state,
                      "optimizer": optimizer_state, **self.adapt.state_dict(),
                      "wandb_id": self.logger.wandb_id, "totals": self.totals,
                      "metric_lines": self.metric_lines,
                      "loss_scale": None if self.scaler is None else self.scaler.state_dict(),
                      "config": self.run.resolved}
        checkpoint.save(self.run_dir, shared, {"reducer": self.reducer.state_dict(),
                                               "rng": checkpoint.rng_state()})

    # ------------------------------------------------------------------------------- the loop
    def fit(self) -> None:
        t = self.settings
        self.logger.update_summary(
            num_params=count_parameters(self.model), world_size=self.world_size,
            cpu_threads=torch.get_num_threads(), model=self.run.model_name,
            dataset=self.run.dataset.name, data=self.bundle.description, scale=self.run.scale,
            metric=self.task.metric, numerics=numerics_record())
        self.logger.set_status("running")
        if self.config_change:
            change = {"from_epoch": self.start_epoch, "delta": self.config_change}
            self.logger.update_summary(config_changes=[*self.logger.summary.get("config_changes", []), change])
            if self.rank == 0:
                log.warning("continuing %s with a changed config from epoch %d: %s", self.run_dir,
                            self.start_epoch, self.config_change)
        try:
            for epoch in range(self.start_epoch, t.epochs):
                record = self._train_epoch(epoch)
                if self.config_change:
                    record["config_change"] = self.config_change
                # rank 0's replica is the one reported, as in the official code; an FSDP
                # forward needs every rank (its all-gathers), so there all of them evaluate
                if self.rank == 0 or self.fsdp is not None:
                    # another rank's data loaders draw seeds from its random streams: it leaves
                    # them as it found them, so it trains on what it would under ddp
                    streams = checkpoint.rng_state() if self.rank != 0 else None
                    self.model.eval()
                    with autocast(self.device, t.precision):
                        evaluated = self.task.evaluate(self.model, t.max_eval_steps)
                    if self.rank == 0:
                        record.update(evaluated)
                    else:
                        checkpoint.set_rng_state(streams)
                record.update(self._end_epoch(epoch))
                if self.rank == 0:  # only rank 0 evaluated
                    self.metric_lines.append(self.logger.log_epoch(record))
                    log.info(self._epoch_line(record, t.epochs))
                    metric = self.task.metric
                    self.logger.update_summary(
                        epochs_completed=epoch + 1, **{f"final_{metric}": record[metric]},
                        final_test_loss=record["test_loss"], total_floats_sent=self.totals["floats"],
                        total_bytes_sent=self.totals["bytes"], total_train_time_s=self.totals["train_time_s"])
                if t.checkpoint:
                    self._save(epoch)
                    self.resume_epoch = epoch + 1
                if t.stop_after_epoch is not None and epoch >= t.stop_after_epoch and epoch + 1 < t.epochs:
                    self.logger.set_status("stopped", stopped=f"after epoch {epoch} "
                                           f"(trainer.stop_after_epoch); {self._resumes()}")
                    return
        except _StopRequested as request:
            signum, epoch, step = request.args
            where = (f"{signal.Signals(signum).name} during epoch {epoch} (after step {step}); "
                     f"{self._resumes()}")
            self.logger.set_status("stopped", stopped=where, stop_signal=int(signum))
        except BaseException as exc:
            cause = str(exc) if isinstance(exc, TrainingDiverged) else f"{type(exc).__name__}: {exc}"
            self.logger.set_status("failed", error=f"rank {self.rank}: {cause}")
            raise
        else:
            self.logger.set_status("completed")
        finally:
            self.logger.close()

    def _resumes(self) -> str:
        """Where a rerun of a stopped run starts: after the last checkpoint written, which is
        not this epoch's under trainer.checkpoint=false."""
        if self.settings.checkpoint:
            return f"resumes from epoch {self.resume_epoch}"
        return (f"resumes from epoch {self.resume_epoch} (trainer.checkpoint=false: "
                f"{'no checkpoint' if not self.resume_epoch else 'no later checkpoint'} was written)")

    def _max_over_ranks(self, value: int) -> int:
        """The largest of the ranks' values (a stop signal, a divergence flag), the same on all."""
        if self._control_group is None:
            return value
        flag = torch.tensor([value], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._control_group)
        return int(flag.item())

    def _check_finite(self, epoch: int, train_loss: float, step_losses: torch.Tensor) -> None:
        """Stop a diverged run at the end of the epoch in which its loss left the reals.

        A NaN or inf step makes the epoch's loss sum non-finite, so a healthy epoch costs one
        flag exchange; only a diverged one is searched for its first bad step.
        """
        if self.settings.nan_policy != "stop":
            return
        if not self._max_over_ranks(0 if math.isfinite(train_loss) else 1):  # all stop alike
            return
        nonfinite = (~torch.isfinite(step_losses)).nonzero()
        if len(nonfinite):  # a float prints as nan, inf or -inf
            step = int(nonfinite[0])
            where = f"step {step} (loss {step_losses[step].item()})"
        else:
            where = "on another rank"
        raise TrainingDiverged(f"training diverged at epoch {epoch} {where}; "
                               f"trainer.nan_policy=continue lets it go on")

    def _epoch_line(self, r: dict, epochs: int) -> str:
        metric = self.task.metric
        value = f"{metric} {r[metric]:.2f}" + ("%" if metric == "test_acc" else "")
        compressed = {k: v for k, v in (r.get("levels") or {}).items() if k != "none"}
        levels = "  layers " + ", ".join(f"{v} at {k}" for k, v in compressed.items()) if compressed else ""
        return (f"epoch {r['epoch']:>3}/{epochs}  lr {r['lr']:.4g}  train_loss {r['train_loss']:.4f}  {value}  "
                f"floats {r['floats_sent'] / 1e6:.2f}M  {r['epoch_time_s']:.1f}s  batch {r['global_batch']}{levels}")

    def _micro_batches(self, per_worker: int) -> tuple[int, int]:
        cap = self.settings.max_micro_batch
        if cap is None or per_worker <= cap or self.bundle.kind == "text":
            return per_worker, 1
        accum = math.ceil(per_worker / cap)
        while per_worker % accum:
            accum += 1
        return per_worker // accum, accum

    def _train_epoch(self, epoch: int) -> dict:
        t = self.settings
        global_batch = self.plan.global_batch or t.batch_size * self.world_size
        per_worker = global_batch // self.world_size
        micro, accum = self._micro_batches(per_worker)
        lr = self.epoch_lr(epoch) * self.plan.lr_scale
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.fsdp is not None:  # the levels its backward passes reduce at
            self.reducer.set_levels(self.plan.levels)
        self.model.train()
        self.task.start_epoch(self.model, micro)

        steps_total = self.task.steps_per_epoch(per_worker)
        if t.max_steps_per_epoch is not None:
            steps_total = min(steps_total, t.max_steps_per_epoch)
        show = t.progress == "always" or (t.progress == "auto" and sys.stdout.isatty())
        bar = tqdm(total=steps_total, desc=f"epoch {epoch}", disable=not (show and self.rank == 0),
                   leave=False, dynamic_ncols=True)
        comm = CommStats()  # this epoch's traffic, summed over its steps
        # Losses stay on the device: one host sync per epoch, not per step. Every step's loss is
        # kept so that only a diverged epoch is searched for its step.
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        step_losses = torch.zeros(steps_total, dtype=torch.float64, device=self.device)
        steps = skipped = 0
        clock = PhaseClock(self.device)  # no host sync per step on CUDA (engine/clock.py)
        _sync(self.device)
        epoch_start = time.perf_counter()
        batches = iter(self.task.train_batches(epoch, micro))
        while steps < steps_total:
            if signum := self._max_over_ranks(stop.requested()):  # all ranks stop after one step
                bar.close()
                raise _StopRequested(signum, epoch, steps)
            step_loss, grads, overflow = clock.timed("compute", self._local_gradient, batches, accum)
            if grads is None:
                break
            if overflow:  # fp16: skipped on every rank, the loss scale halved
                skipped += 1
            else:
                if self.fsdp is None:
                    comm += clock.timed("comm", self.reducer.reduce, grads, self.plan.levels)
                else:  # reduced during backward: its time is in the compute phase
                    comm += self.fsdp.pop_stats()
                clock.timed("compute", self._update, grads)
            loss_sum += step_loss
            step_losses[steps] = step_loss
            steps += 1
            bar.update(1)
            if not bar.disable:  # the bar alone pays a sync per step, and only when shown
                bar.set_postfix(loss=f"{step_loss.item():.3f}")
        bar.close()
        phases = clock.totals()
        compute_s, comm_s = phases.get("compute", 0.0), phases.get("comm", 0.0)
        epoch_time = time.perf_counter() - epoch_start
        train_loss = loss_sum.item() / max(steps, 1)
        self._check_finite(epoch, train_loss, step_losses[:steps])
        self.totals["floats"] += comm.floats_sent
        self.totals["bytes"] += comm.bytes_sent
        self.totals["train_time_s"] += epoch_time
        amp = {} if self.scaler is None else {"amp_skipped_steps": skipped,
                                              "loss_scale": self.scaler.scale}
        return {"epoch": epoch, "lr": lr, "train_loss": train_loss, "steps": steps, **amp,
                "batch_size": global_batch, "global_batch": global_batch, "micro_batch": micro,
                "accumulation": accum, "floats_sent": comm.floats_sent, "bytes_sent": comm.bytes_sent,
                "collectives": comm.collectives, "allgather_bytes_sent": comm.allgather_bytes,
                "allgathers": comm.allgathers, "epoch_time_s": epoch_time,
                "compute_time_s": compute_s, "comm_time_s": comm_s}

    def _local_gradient(self, batches, accum: int):
        """This worker's step loss, gradient (None when the data ran out) over `accum`
        micro-batches, clipped under clip_point=local (the detector sees it uncompressed), and
        whether an fp16 step overflowed on some rank (then it is skipped everywhere)."""
        for p in self.params:
            p.grad = None
        step_loss, got = torch.zeros((), dtype=torch.float64, device=self.device), 0
        micro_batches = (((batch, None) for batch in batches) if self.fsdp is None
                         else _marking_last(batches, accum))
        for batch, last in micro_batches:
            if self.fsdp is not None:  # only the step's last backward reduces
                self.model.set_requires_gradient_sync(last)
            with autocast(self.device, self.settings.precision):
                loss = self.task.loss(self.model, batch)
            scaled = loss if self.scaler is None else self.scaler.scaled(loss)
            (scaled / accum).backward()
            step_loss += loss.detach() / accum
            got += 1
            if got == accum:
                break
        if got == 0:
            return step_loss, None, False
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params]
        if self.scaler is not None and self.scaler.unscale(grads, self._max_over_ranks):
            return step_loss, grads, True
        clip = self.optim.clip_grad_norm
        if clip and self.optim.clip_point == "local" and self.fsdp is None:  # p.grad is still
            # this worker's own gradient (under FSDP the comm clipped it, before reducing)
            torch.nn.utils.clip_grad_norm_(self.params, clip)
        if self.detector is not None and self.fsdp is None:  # FSDP's comm fed it in backward
            self.detector.accumulate([grads[i] for i in self.compressible])
        return step_loss, grads, False

    def _update(self, grads: list[torch.Tensor]) -> None:
        """The optimizer step on the reduced gradient (clipped here under clip_point=averaged)."""
        for p, g in zip(self.params, grads):
            p.grad = g
        clip = self.optim.clip_grad_norm
        if clip and self.optim.clip_point != "local":
            torch.nn.utils.clip_grad_norm_(self.params, clip)
        self.optimizer.step()

    def _end_epoch(self, epoch: int) -> dict:
        """Rank 0 decides the next epoch's plan; every rank applies it.

        The record describes the epoch just trained (its levels, batch and LR scale) and the
        decision taken at its end (how many layers are critical, the detector's norms).
        """
        used = self.schedule.info()
        report = self.adapt.end_epoch(epoch, self.epoch_lr(epoch), self.epoch_lr(epoch + 1))
        if self.rank != 0:
            return {}
        decided = self.schedule.info()
        info = {key: used[key] for key in ("levels", "layer_levels", "lr_scale")}
        info.update(critical_layers=decided["critical_layers"], critical_model=decided["critical_model"],
                    next_levels=decided["levels"], detector=report or None)
        return info
