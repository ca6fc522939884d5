"""Moving tensors between the host and the device without stalling the device's queue.

A copy from ordinary (pageable) host memory to a CUDA device is synchronous for the host: CUDA
stages it through a pinned buffer and the call returns only once the data is staged, after the
work queued before it on the stream ("API synchronization behavior", CUDA runtime docs;
torch's `Tensor.to(non_blocking=True)` is asynchronous only from pinned memory). On the
per-step path (the device input pipeline's random crops, flips and angles, a PowerSGD level
change's fresh Q) that is one host stall per copy; from pinned memory the copy is queued and the
host goes on. torch's caching host allocator keeps a pinned block alive until the copies that
read it have run, so the temporary pinned tensor may be dropped at once.

CPU runs take the plain `.to()` path: nothing is copied and the numbers are the same objects.
"""

from __future__ import annotations

import torch


def host_to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` (on the host) on `device`: pinned and queued asynchronously for CUDA."""
    if torch.device(device).type == "cuda" and tensor.device.type == "cpu":
        return tensor.pin_memory().to(device, non_blocking=True)
    return tensor.to(device)


def to_cpu(value):
    """`value` with every tensor in it (nested dicts, lists, tuples) moved to the CPU.

    Checkpoint parts go through it before they are gathered: pickled CUDA tensors unpickle on
    the device they came from, so rank k's error memory would land on GPU k inside rank 0's
    process (or fail where rank 0 cannot see GPU k).
    """
    if isinstance(value, torch.Tensor):
        return value if value.device.type == "cpu" else value.detach().cpu()
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value
