"""Where one DDP training step's time goes: forward, backward, the hook, collectives, optimizer.

A step's wall time says whether a hook is fast; it does not say why not. This steps one arm of
benchmarks/ddp_step.py with clocks around its parts, for `steps` steps after `warmup`, and keeps
the median of each part (milliseconds, rank 0):

- forward: the loss, DDP's forward included (its broadcast of the module buffers);
- backward: loss.backward(), the communication hook and DDP's wait for its Futures included;
  - hook: inside the hook's calls; hook_wait: the part blocked on a collective (a work handle
    waited on, or a blocking collective such as our level check); compression: the rest
    (compressing, starting collectives, and whatever the hook finishes inline);
  - after_hooks: from the last hook call's return to backward's return: DDP waiting for the
    Futures and what runs in their callbacks (our asynchronous hook decompresses there, torch's
    powerSGD_hook also compresses there);
  - autograd: the rest of backward, the gradients' own computation;
- collectives: wall time with at least one collective in flight (started from Python: the
  hooks' all-reduces and all-gathers; dense DDP's come from its C++ reducer and are not seen),
  their number per step and the bytes handed to them; blocking: those that block their caller;
- optimizer: zero_grad and optimizer.step().

The clocks add microseconds per collective, nothing to the arithmetic.
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time

PHASES = ("step", "forward", "backward", "autograd", "hook", "compression", "hook_wait",
          "after_hooks", "collectives", "blocking", "optimizer")


class _Clock:
    """Intervals of one step: hook calls, collectives (issue to completion), waits."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        self.hooks: list[tuple[float, float]] = []
        self.collectives: list[list[float]] = []  # [issued, done (nan until done), bytes]
        self.blocking = 0.0
        self.hook_wait = 0.0
        self.in_hook = False
        self.pending = []

    def waited(self, seconds: float) -> None:
        if self.in_hook:
            self.hook_wait += seconds


class _TimedWork:
    """A work handle whose waits are clocked; everything else goes to the real one."""

    def __init__(self, work, clock: _Clock):
        self._work, self._clock = work, clock

    def wait(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            self._clock.waited(time.perf_counter() - start)

    def __getattr__(self, name):
        return getattr(self._work, name)


def _nbytes(args, kwargs) -> int:
    """all_reduce(tensor, ...): the bytes of its tensor."""
    tensor = args[0] if args else kwargs["tensor"]
    return tensor.numel() * tensor.element_size()


def _timed_collective(collective, clock: _Clock, sent=_nbytes):
    def call(*args, **kwargs):
        record = [time.perf_counter(), float("nan"), float(sent(args, kwargs))]
        with clock.lock:
            clock.collectives.append(record)
        work = collective(*args, **kwargs)
        if work is None:  # a blocking collective: done on return
            record[1] = time.perf_counter()
            clock.blocking += record[1] - record[0]
            clock.waited(record[1] - record[0])
            return work

        def done(_):
            record[1] = time.perf_counter()

        clock.pending.append(work.get_future().then(done))
        return _TimedWork(work, clock)

    return call


@contextlib.contextmanager
def _clocked_collectives(clock: _Clock):
    """Route torch.distributed.all_reduce and our all-gathers through the clock."""
    import torch.distributed as dist

    from accordion_repro.comm import collectives

    saved = dist.all_reduce, collectives._all_gather_flat, dist.all_gather
    dist.all_reduce = _timed_collective(saved[0], clock)
    # all_gather_into_tensor(output, input) and, for gloo's segments, all_gather(outputs,
    # input): the bytes sent are the input's
    sent_input = lambda a, k: a[1].numel() * a[1].element_size()  # noqa: E731
    collectives._all_gather_flat = _timed_collective(saved[1], clock, sent=sent_input)
    dist.all_gather = _timed_collective(saved[2], clock, sent=sent_input)
    try:
        yield
    finally:
        dist.all_reduce, collectives._all_gather_flat, dist.all_gather = saved


def clock_hook(hook, clock: _Clock):
    """`hook` with its calls clocked, with the signature DDP checks."""
    import torch

    def timed_hook(state, bucket):
        start = time.perf_counter()
        clock.in_hook = True
        try:
            return hook(state, bucket)
        finally:
            clock.in_hook = False
            clock.hooks.append((start, time.perf_counter()))

    timed_hook.__annotations__ = {"return": torch.futures.Future[torch.Tensor]}
    return timed_hook


def _union(intervals) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop > end:
            total += stop - max(start, end)
            end = stop
    return total


def _one_step(arm, clock: _Clock) -> dict:
    import torch
    import torch.distributed as dist

    dist.barrier()
    clock.reset()
    t0 = time.perf_counter()
    arm.optimizer.zero_grad()
    tz = time.perf_counter()
    loss = torch.nn.functional.cross_entropy(arm.net(arm.x), arm.y)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    arm.optimizer.step()
    t3 = time.perf_counter()
    for future in clock.pending:
        future.wait()
    hook = sum(stop - start for start, stop in clock.hooks)
    after = t2 - clock.hooks[-1][1] if clock.hooks else 0.0
    return {"step": t3 - t0, "forward": t1 - tz, "backward": t2 - t1,
            "autograd": t2 - t1 - hook - after, "hook": hook,
            "compression": hook - clock.hook_wait, "hook_wait": clock.hook_wait,
            "after_hooks": after,
            "collectives": _union((a, b) for a, b, _ in clock.collectives),
            "blocking": clock.blocking, "optimizer": t3 - t2 + tz - t0,
            "count": len(clock.collectives), "bytes": sum(n for _, _, n in clock.collectives)}


def breakdown(arm_factory, warmup: int, steps: int) -> dict:
    """Median of every phase over `steps` clocked steps (ms; count and bytes per step) of the
    arm `arm_factory(wrap_hook)` builds, after `warmup` steps; all ranks call it together."""
    clock = _Clock()
    arm = arm_factory(lambda hook: clock_hook(hook, clock))
    with _clocked_collectives(clock):
        for _ in range(warmup):
            _one_step(arm, clock)
        records = [_one_step(arm, clock) for _ in range(steps)]
    out = {f"{k}_ms": 1e3 * statistics.median(r[k] for r in records) for k in PHASES}
    out["collectives_per_step"] = statistics.median(r["count"] for r in records)
    out["bytes_per_step"] = statistics.median(r["bytes"] for r in records)
    return out


def table(results: dict[str, dict]) -> str:
    """One line per phase, one column per arm."""
    names = list(results)
    lines = [f"{'phase (median ms)':22s}" + "".join(f"{n:>26s}" for n in names)]
    for key in [f"{k}_ms" for k in PHASES] + ["collectives_per_step", "bytes_per_step"]:
        lines.append(f"{key:22s}" + "".join(f"{results[n][key]:26.1f}" for n in names))
    return "\n".join(lines)
