"""How a rank walks its data: a distributed image loader, and token streams cut into batches.

The official CIFAR code builds a DistributedSampler and never calls set_epoch, so every worker
sees the same order in every epoch (facts section 5). `reshuffle_each_epoch=False` reproduces
that quirk by pinning the sampler's epoch to 0; True gives the usual fresh order per epoch.
The sampler never drops samples: like the official code it pads the last rank's share by
repeating indices, so every rank runs the same number of steps.
"""

from __future__ import annotations

from typing import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler


def epoch_sampler(dataset, *, rank: int, world_size: int, epoch: int, shuffle: bool,
                  reshuffle_each_epoch: bool, seed: int) -> DistributedSampler:
    """This rank's share of one epoch, in order (both image pipelines walk it)."""
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                 seed=seed, drop_last=False)
    sampler.set_epoch(epoch if reshuffle_each_epoch else 0)
    return sampler


def image_loader(dataset, *, batch_size: int, rank: int, world_size: int, epoch: int,
                 shuffle: bool, reshuffle_each_epoch: bool, seed: int, num_workers: int = 0,
                 drop_last: bool = False) -> DataLoader:
    """This rank's loader for one epoch; `drop_last` drops the rank's last partial batch."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    sampler = epoch_sampler(dataset, rank=rank, world_size=world_size, epoch=epoch,
                            shuffle=shuffle, reshuffle_each_epoch=reshuffle_each_epoch, seed=seed)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      pin_memory=torch.cuda.is_available(), persistent_workers=False,
                      drop_last=drop_last)


def batchify(tokens: torch.Tensor, batch_size: int, rank: int, world_size: int) -> torch.Tensor:
    """This rank's contiguous shard of the stream, laid out as batch_size columns: (T, B).

    Each column is a contiguous piece of text, so hidden state carries over between BPTT
    windows as in word_language_model; tokens that do not fill a whole row are dropped.
    """
    if tokens.dim() != 1:
        raise ValueError(f"expected a 1-D token stream, got shape {tuple(tokens.shape)}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside world size {world_size}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    shard_length = len(tokens) // world_size
    shard = tokens[rank * shard_length:(rank + 1) * shard_length]
    rows = shard_length // batch_size
    if rows < 2:
        raise ValueError(f"{len(tokens)} tokens over {world_size} ranks give {rows} rows of "
                         f"{batch_size} columns; at least 2 are needed for one input/target pair")
    return shard[:rows * batch_size].view(batch_size, rows).t().contiguous()


def bptt_windows(data: torch.Tensor, bptt: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(input[t:t+L], target[t+1:t+1+L]) for t = 0, bptt, ..., with L = min(bptt, T-1-t)."""
    if bptt < 1:
        raise ValueError(f"bptt must be >= 1, got {bptt}")
    total = data.size(0)
    for start in range(0, total - 1, bptt):
        length = min(bptt, total - 1 - start)
        yield data[start:start + length], data[start + 1:start + 1 + length]
