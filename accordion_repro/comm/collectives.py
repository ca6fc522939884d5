"""The only place that talks to torch.distributed.

Every collective goes through a Communicator so the reducers can count calls and bytes, and so
a run without a process group behaves as one worker: the same compression code runs and the
collectives become no-ops (a sum or gather over one worker is the identity).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from .stats import CommStats


# torch renamed all_gather_into_tensor to all_gather_single; use whichever this torch has.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# Elements (float32: 256 KiB) per piece of an all-gather on gloo; see all_gather_async.
GLOO_ALLGATHER_SEGMENT = 65_536


# torch 2.14 deprecates reduce_scatter_tensor (a FutureWarning on every run) for
# reduce_scatter_single, which older torch lacks: the current name where there is one.
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def broadcast_object(obj, src: int = 0, group=None):
    """`src`'s picklable object on every rank (how one rank's decision reaches all of them).

    Pass a CPU-capable group (control_group): on an NCCL-only group torch stages the pickle on
    `torch.cuda.current_device()`, which is GPU 0 in a process that never called set_device.
    """
    if not distributed():
        return obj
    payload = [obj]
    dist.broadcast_object_list(payload, src=src, group=group)
    return payload[0]


def control_group(group=None):
    """A group over `group`'s ranks that takes CPU tensors: `group` itself when its backend
    has gloo, else a new gloo group (collective: every rank of `group` calls it, once, at the
    same point; callers keep the result).

    The small agreements of a step or an epoch (the level check, rank 0's plan, a stop flag)
    go through it with CPU tensors, so they never wait for the GPU: reading an NCCL result
    on the host (`int()`, `.item()`) blocks until every kernel queued before it has run, and
    NCCL's object collectives stage on the *current* CUDA device, not the model's.
    """
    if "gloo" in str(dist.get_backend(group)):  # "gloo", or "cpu:gloo,cuda:nccl"
        return dist.group.WORLD if group is None else group
    if group is None or group is dist.group.WORLD:
        return dist.new_group(backend="gloo")
    ranks = [dist.get_global_rank(group, r) for r in range(dist.get_world_size(group))]
    return dist.new_group(ranks=ranks, backend="gloo", use_local_synchronization=True)


class Communicator:
    def __init__(self, group=None):
        self.distributed = distributed()
        self.group = group
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.gloo_segment = GLOO_ALLGATHER_SEGMENT
        self._control = None

    def control(self):
        """control_group(group), made at the first call (see control_group: every rank must
        make that call at the same point; AccordionHookState and Accordion make it when built)."""
        if self.distributed and self._control is None:
            self._control = control_group(self.group)
        return self._control

    def differing(self, values: list[int], device: torch.device) -> list[bool]:
        """Which of `values` (as many on every worker) are not the same on every worker, in one
        tiny blocking all-reduce of their maxima and their negatives' maxima (not counted in
        CommStats: it checks agreement, it moves no gradient)."""
        if not self.distributed:
            return [False] * len(values)
        pairs = torch.tensor(list(values) + [-v for v in values], dtype=torch.int64,
                             device=device)
        dist.all_reduce(pairs, op=dist.ReduceOp.MAX, group=self.group)
        largest, negated_smallest = pairs.view(2, -1).tolist()
        return [big != -small for big, small in zip(largest, negated_smallest)]

    def all_reduce_sum(self, buffer: torch.Tensor, stats: CommStats):
        """Start summing `buffer` over workers in place; the work handle (None if nothing sent)."""
        if not self.distributed or buffer.numel() == 0:
            return None
        stats.collectives += 1
        stats.bytes_sent += buffer.numel() * buffer.element_size()
        return dist.all_reduce(buffer, group=self.group, async_op=True)

    def reduce_scatter(self, output: torch.Tensor, flat: torch.Tensor, op, stats: CommStats):
        """`flat` (world_size equal, rank-major parts) reduced with `op` into this worker's part
        `output`, blocking (FSDP's own collective; the FSDP path sends its dense tensors so)."""
        if not self.distributed or flat.numel() == 0:
            output.copy_(flat[:output.numel()])
            return
        stats.collectives += 1
        stats.bytes_sent += flat.numel() * flat.element_size()
        _reduce_scatter_single(output, flat, op=op, group=self.group)

    def all_to_all_async(self, send: torch.Tensor, stats: CommStats):
        """Start sending row j of `send` (world_size, n) to rank j: (the (world_size, n) rows
        received, row r from rank r, valid once every work handle is waited on, and the list of
        those handles, empty when nothing was sent). Counted as its input, as every collective
        here (this rank's own row included, which stays on the rank).

        One worker: its row is its own (`send` itself is returned)."""
        if not self.distributed or send.numel() == 0:
            return send, []
        stats.collectives += 1
        stats.bytes_sent += send.numel() * send.element_size()
        received = torch.empty_like(send)
        return received, [dist.all_to_all_single(received, send, group=self.group,
                                                 async_op=True)]

    def all_gather(self, local: torch.Tensor, stats: CommStats) -> torch.Tensor:
        """Stack every worker's `local` (same size on all) into one (world_size, n) tensor."""
        gathered, handles = self.all_gather_async(local, stats)
        for handle in handles:
            handle.wait()
        return gathered

    def all_gather_async(self, local: torch.Tensor, stats: CommStats,
                         out: torch.Tensor | None = None):
        """all_gather started asynchronously: (the (world_size, n) output, valid once every
        work handle is waited on, and the list of those handles, empty when nothing was sent).

        `out`: a flat tensor of world_size * n elements to gather into, rank-major (FSDP2's
        own buffer, of which `local` may be this rank's slice); a new one when None.

        Counted as one collective however many pieces it travels in. CPU tensors (gloo) travel
        in segments of at most `gloo_segment` elements: gloo sends one all-gather as one
        message, which reached 65% of a tc-shaped 100 Mbit/s link and 64% of a 1 Gbit/s one
        for 8 MB per rank, against 94% and 96% in 256 KiB segments, its all-reduce's rate
        (docs/performance.md). NCCL (CUDA tensors) pipelines internally and gets one call.
        """
        n = local.numel()
        if not self.distributed or n == 0:
            if out is None:
                return local.unsqueeze(0).expand(self.world_size, n), []
            rows = out.view(self.world_size, n)
            rows.copy_(local.expand(self.world_size, n))
            return rows, []
        stats.collectives += 1
        stats.allgathers += 1
        stats.bytes_sent += n * local.element_size()
        stats.allgather_bytes += n * local.element_size()
        if out is None:
            out = torch.empty(self.world_size * n, dtype=local.dtype, device=local.device)
        rows = out.view(self.world_size, n)
        if local.device.type != "cpu" or n <= self.gloo_segment:  # CPU tensors go by gloo
            return rows, [_all_gather_flat(out, local, group=self.group, async_op=True)]
        handles = []
        for start in range(0, n, self.gloo_segment):
            end = min(start + self.gloo_segment, n)
            handles.append(dist.all_gather(list(rows[:, start:end].unbind(0)), local[start:end],
                                           group=self.group, async_op=True))
        return rows, handles

    def max_and_min(self, value: int) -> tuple[int, int]:
        """The largest and smallest `value` over workers, in one tiny blocking all-reduce of a
        CPU tensor on the control group (no GPU sync; not counted in CommStats: it checks
        agreement, it moves no gradient)."""
        if not self.distributed:
            return value, value
        pair = torch.tensor([value, -value], dtype=torch.int64)
        dist.all_reduce(pair, op=dist.ReduceOp.MAX, group=self.control())
        largest, negated = pair.tolist()
        return largest, -negated
