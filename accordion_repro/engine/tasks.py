"""What one training step and one evaluation mean for each kind of data.

The training loop is the same for CIFAR classification and WikiText-2 language modelling; only
batching, the loss and the reported metric differ. A task hides those differences so the loop
(and the reducer, detector and schedule behind it) never branches on the model.
"""

from __future__ import annotations

import math
from typing import Iterator

import torch
import torch.nn.functional as F

from accordion_repro.data import DeviceImages, batchify, bptt_windows, epoch_sampler, image_loader
from accordion_repro.models import detach_hidden


class ImageClassificationTask:
    metric = "test_acc"

    def __init__(self, bundle, *, rank: int, world_size: int, device: torch.device, seed: int,
                 num_workers: int, reshuffle_each_epoch: bool, eval_batch_size: int,
                 channels_last: bool = False, pipeline: str = "pil"):
        self.bundle, self.rank, self.world_size = bundle, rank, world_size
        self.pipeline = pipeline
        self._on_device: dict[str, DeviceImages] = {}  # dataset.pipeline=device: split -> images
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.device, self.seed, self.num_workers = device, seed, num_workers
        self.reshuffle_each_epoch, self.eval_batch_size = reshuffle_each_epoch, eval_batch_size

    def steps_per_epoch(self, batch_size: int) -> int:
        per_rank = math.ceil(len(self.bundle.train) / self.world_size)
        return math.ceil(per_rank / batch_size)

    def _device_split(self, split: str) -> DeviceImages:
        if split not in self._on_device:
            self._on_device[split] = DeviceImages(getattr(self.bundle, split), self.device)
        return self._on_device[split]

    def train_batches(self, epoch: int, micro_batch: int) -> Iterator:
        if self.pipeline == "device":
            order = list(epoch_sampler(self.bundle.train, rank=self.rank, world_size=self.world_size,
                                       epoch=epoch, shuffle=True, seed=self.seed,
                                       reshuffle_each_epoch=self.reshuffle_each_epoch))
            for x, y in self._device_split("train").batches(order, micro_batch):
                yield self._inputs(x), y
            return
        loader = image_loader(self.bundle.train, batch_size=micro_batch, rank=self.rank,
                              world_size=self.world_size, epoch=epoch, shuffle=True,
                              reshuffle_each_epoch=self.reshuffle_each_epoch, seed=self.seed,
                              num_workers=self.num_workers)
        for x, y in loader:
            yield self._inputs(x), y.to(self.device, non_blocking=True)

    def _inputs(self, x: torch.Tensor) -> torch.Tensor:
        return x.to(self.device, non_blocking=True).contiguous(memory_format=self.memory_format)

    def start_epoch(self, model, batch_size: int) -> None:
        pass

    def loss(self, model, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    def _eval_indices(self, max_steps: int | None) -> list[int]:
        """The whole test split, or a fixed random sample of max_steps batches of it.

        A sample, not the first batches: test sets are often stored sorted by class. The sample
        depends on nothing but the split's size, so every run is scored on the same images.
        """
        size = len(self.bundle.test)
        if max_steps is None or max_steps * self.eval_batch_size >= size:
            return list(range(size))
        order = torch.randperm(size, generator=torch.Generator().manual_seed(0))
        return order[:max_steps * self.eval_batch_size].sort().values.tolist()

    def _eval_batches(self, max_steps: int | None) -> Iterator:
        indices = self._eval_indices(max_steps)
        if self.pipeline == "device":
            yield from self._device_split("test").batches(indices, self.eval_batch_size)
            return
        test = self.bundle.test
        subset = test if len(indices) == len(test) else torch.utils.data.Subset(test, indices)
        yield from torch.utils.data.DataLoader(subset, batch_size=self.eval_batch_size,
                                               shuffle=False, num_workers=self.num_workers)

    @torch.no_grad()
    def evaluate(self, model, max_steps: int | None) -> dict:
        loader = self._eval_batches(max_steps)
        total_loss, correct, seen = 0.0, 0, 0
        for x, y in loader:
            x, y = self._inputs(x), y.to(self.device)
            logits = model(x)
            total_loss += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(1) == y).sum().item()
            seen += y.numel()
        return {"test_loss": total_loss / max(seen, 1), "test_acc": 100.0 * correct / max(seen, 1),
                "eval_examples": seen}


class LanguageModelTask:
    """Truncated BPTT over this rank's contiguous shard; the hidden state crosses windows."""

    metric = "val_ppl"

    def __init__(self, bundle, *, rank: int, world_size: int, device: torch.device, bptt: int,
                 eval_batch_size: int):
        self.bundle, self.rank, self.world_size = bundle, rank, world_size
        self.device, self.bptt, self.eval_batch_size = device, bptt, eval_batch_size
        self._train = self._batch_size = self.hidden = None

    def _train_data(self, batch_size: int) -> torch.Tensor:
        if self._batch_size != batch_size:
            self._train = batchify(self.bundle.train, batch_size, self.rank, self.world_size).to(self.device)
            self._batch_size = batch_size
        return self._train

    def steps_per_epoch(self, batch_size: int) -> int:
        rows = self._train_data(batch_size).size(0)
        return math.ceil((rows - 1) / self.bptt)

    def start_epoch(self, model, batch_size: int) -> None:
        self.hidden = model.init_hidden(batch_size)

    def train_batches(self, epoch: int, micro_batch: int) -> Iterator:
        yield from bptt_windows(self._train_data(micro_batch), self.bptt)

    def loss(self, model, batch) -> torch.Tensor:
        inputs, targets = batch
        self.hidden = detach_hidden(self.hidden)
        logits, self.hidden = model(inputs, self.hidden)
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    @torch.no_grad()
    def evaluate(self, model, max_steps: int | None) -> dict:
        data = batchify(self.bundle.test, self.eval_batch_size, 0, 1).to(self.device)
        hidden = model.init_hidden(self.eval_batch_size)
        total, count = 0.0, 0
        for step, (inputs, targets) in enumerate(bptt_windows(data, self.bptt)):
            if max_steps is not None and step >= max_steps:
                break
            logits, hidden = model(inputs, hidden)
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1),
                                     reduction="sum").item()
            count += targets.numel()
        loss = total / max(count, 1)
        return {"test_loss": loss, "val_ppl": math.exp(min(loss, 50.0)), "eval_examples": count}


def build_task(bundle, run, *, rank: int, world_size: int, device: torch.device):
    """The task of `run` (RunSettings): its dataset's and trainer's settings say which."""
    where = dict(rank=rank, world_size=world_size, device=device)
    data, trainer = run.dataset, run.trainer
    if bundle.kind == "text":
        return LanguageModelTask(bundle, **where, bptt=data.bptt,
                                 eval_batch_size=data.eval_batch_size)
    num_workers = trainer.num_workers if trainer.num_workers != "auto" else (4 if trainer.use_cuda else 0)
    return ImageClassificationTask(bundle, **where, seed=run.seed, num_workers=num_workers,
                                   reshuffle_each_epoch=bool(trainer.reshuffle_each_epoch),
                                   eval_batch_size=trainer.eval_batch_size,
                                   channels_last=trainer.channels_last,
                                   pipeline=data.pipeline)
