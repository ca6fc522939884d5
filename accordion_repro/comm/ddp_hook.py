"""Use the Accordion reducers on your own DistributedDataParallel model.

    state = AccordionHookState(model, compressor="powersgd", rank=2)
    ddp = DistributedDataParallel(model)
    ddp.register_comm_hook(state, accordion_hook)
    ...                              # train as usual
    state.set_level("layer4.1.conv2.weight", 1)     # or state.set_levels([...]), on every rank

accordion_repro.ddp.Accordion wraps this, the detector and the schedule into one object.

One reducer covers all parameters, so per-layer state (error memory, warm-start Q, level)
does not depend on how DDP groups parameters into buckets, nor on DDP rebuilding its buckets
after the first step. By default (`async_op=True`) the hook starts its collectives and returns
a Future at once, so DDP overlaps them with the rest of the backward pass (BucketPipeline);
`async_op=False` reduces each bucket inside the hook. Both run the same operations.

Half-precision gradients (bf16 or fp16 parameters, or torch's fp16_compress_wrapper around
this hook) are compressed in float32: each bucket is copied to float32, reduced, and written
back in its own dtype, and the error memory, P and Q are float32. LAPACK's QR has no half
kernels, and an error memory in bf16 would lose most of what it is meant to keep.
"""

# No `from __future__ import annotations`: DDP checks the hook's return annotation object.
import difflib
import zlib
from collections import Counter
from collections.abc import Callable, Generator, Sequence
from functools import lru_cache

import torch

from ..options import Options
from .build import build_reducer
from .base import Phase, Reducer
from .stats import CommStats


def compute_dtype(params) -> torch.dtype:
    """float32 for fp32/bf16/fp16 parameters (in any mix), float64 for float64 ones."""
    dtypes = {p.dtype for p in params}
    if not all(d.is_floating_point for d in dtypes):
        raise ValueError(f"gradients must be floating point, got {sorted(map(str, dtypes))}")
    if dtypes <= {torch.float32, torch.float16, torch.bfloat16}:
        return torch.float32
    if dtypes == {torch.float64}:
        return torch.float64
    raise ValueError(f"parameters mix {sorted(map(str, dtypes))}: one reducer computes in one "
                     "dtype; cast the model to one precision (float64 or float32/bf16/fp16)")


class LevelMismatchError(RuntimeError):
    """Ranks hold different compression levels (each rank raises it, in one line)."""


class EpochMismatchError(RuntimeError):
    """Accordion.end_epoch was called on some ranks and not others, or with other epochs."""


@lru_cache(maxsize=64)
def _fingerprint(compressor: str, levels: tuple) -> int:
    """The same number on every process for the same levels (Python's hash() is salted)."""
    return zlib.crc32(repr((compressor, [None if lv is None else float(lv) for lv in levels]))
                      .encode())


# What a rank in Accordion.end_epoch(epoch) sends in place of its fingerprint: above any crc32.
END_EPOCH_MARK = 1 << 40


def check_agreement(reducer: Reducer, ending_epoch: int | None = None) -> None:
    """Raise on every rank unless all ranks hold the reducer's levels and, with
    `ending_epoch`, all are in Accordion.end_epoch of that epoch.

    Ranks whose levels differ would hand collectives of different sizes to the backend, which
    fails deep inside gloo ("Received data size doesn't match expected size"), hangs, or, when
    the sizes happen to agree, silently averages unrelated numbers. One tiny all-reduce (the
    largest and smallest fingerprint of the levels) turns that into a one-line error. A rank in
    end_epoch sends the same all-reduce with END_EPOCH_MARK + epoch, so a rank that calls
    end_epoch alone meets the others' step check (same shape) instead of a gradient collective.
    """
    levels = reducer.levels
    mine = (_fingerprint(reducer.name, tuple(levels)) if ending_epoch is None
            else END_EPOCH_MARK + ending_epoch)
    largest, smallest = reducer.comm.max_and_min(mine)
    if largest == smallest:
        return
    rank = reducer.comm.rank
    if largest >= END_EPOCH_MARK:
        if smallest >= END_EPOCH_MARK:
            what = (f"ranks called Accordion.end_epoch with different epochs "
                    f"({smallest - END_EPOCH_MARK} and {largest - END_EPOCH_MARK})")
        elif ending_epoch is None:
            what = (f"another rank called Accordion.end_epoch({largest - END_EPOCH_MARK}) while "
                    f"rank {rank} went on training")
        else:
            what = (f"rank {rank} called Accordion.end_epoch({ending_epoch}) while another rank "
                    f"went on training")
        raise EpochMismatchError(f"{what}; call end_epoch on every rank at the end of every epoch")
    counts = ", ".join(f"{n} at {lv}" for lv, n in Counter(levels).most_common())
    raise LevelMismatchError(
        f"compression levels differ between ranks (rank {rank} has "
        f"{len(levels)} layers: {counts}); every rank must apply the same levels: "
        "Accordion.end_epoch broadcasts rank 0's decision, set_levels must be called alike "
        "on every rank")


class _Job:
    """One bucket's reduction: starts its first phase at once; `result` completes with it.

    `devices`: the CUDA device of the bucket, if any. The result Future is then CUDA-aware:
    set_result records events on the streams that ran the decompression, and DDP's wait() on
    it makes DDP's stream wait for them (torch.futures.Future's `devices`).
    """

    def __init__(self, steps: Generator[Phase, None, None], finish: Callable[[], torch.Tensor],
                 devices: Sequence[torch.device] = ()):
        self.steps = steps
        self.finish = finish  # local work once the reduction is done; returns the bucket buffer
        self.result: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=list(devices))
        self._enter(next(steps, None))

    def advance(self) -> None:
        """Wait for this phase's collectives, then run the next phase (it starts new ones)."""
        for work in self.phase.works:
            work.wait()
        self._enter(next(self.steps, None))

    def _enter(self, phase: Phase | None) -> None:
        self.phase = phase
        self.waiting = phase is not None and not phase.final  # a later phase has collectives
        if phase is None or (phase.final and not phase.works):  # nothing left to wait for
            self._complete()
        elif phase.final:
            futures = [w.get_future() for w in phase.works]
            torch.futures.collect_all(futures).then(lambda _: self._complete(futures))

    def _complete(self, futures: Sequence[torch.futures.Future] = ()) -> None:
        """Run the final, local part (decompression) and complete `result`.

        collect_all's Future holds futures, not tensors, and has no devices: its callback runs
        with no stream made to wait for NCCL's kernels. wait() on each (completed) work Future
        does that, without blocking the host: it makes the current stream wait for the events
        NCCL recorded, as then() on that very Future would (torch's powerSGD_hook chains
        get_future().then()). For gloo the Futures are complete, wait() returns at once.
        """
        try:
            for future in futures:
                future.wait()
            if next(self.steps, None) is not None:  # runs the final, local part of the reduction
                raise RuntimeError("a reduction started collectives after its final phase")
            self.result.set_result(self.finish())
        except BaseException as exc:  # the Future must complete, or DDP would wait forever
            self.result.set_exception(exc)


class BucketPipeline:
    """The reductions of one backward pass, started in bucket order, completed asynchronously.

    DDP hands us bucket after bucket while the backward pass goes on; we start each bucket's
    first phase at once and return a Future, and start a bucket's next phase (PowerSGD's Q,
    which needs the reduced P) at the following bucket's hook, after that bucket has started
    its own first phase: the earlier collectives have had the backward and the compression of
    that bucket to complete before the hook thread (the backward's) waits for them, and the
    new bucket's collectives are on the wire first. Every collective is started on the thread that
    runs DDP's hooks, in bucket order, so all ranks issue them in the same order (gloo and NCCL
    match collectives by the order they are issued). torch's powerSGD_hook issues its second
    all-reduce from a Future callback instead, whose order across buckets depends on which
    bucket's first all-reduce finished first. Only the final, local part of a reduction
    (decompression, the error memory, copying back) runs in the callback, on whichever thread
    completed the last collective.
    """

    def __init__(self):
        self._waiting: list[_Job] = []

    def submit(self, steps: Generator[Phase, None, None], finish: Callable[[], torch.Tensor],
               last: bool, devices: Sequence[torch.device] = ()) -> torch.futures.Future[torch.Tensor]:
        """Start one bucket's reduction, then move every earlier bucket one phase on; the last
        bucket of the backward also drives all of them to their final phase."""
        try:
            job = _Job(steps, finish, devices)
            self._advance()
            if job.waiting:
                self._waiting.append(job)
            while last and self._waiting:
                self._advance()
        except BaseException:
            self.reset()
            raise
        return job.result

    def _advance(self) -> None:
        for job in self._waiting:
            job.advance()
        self._waiting = [job for job in self._waiting if job.waiting]

    def reset(self) -> None:
        self._waiting = []


class ReducerState:
    """One reducer over all trainable parameters of a model, addressed by parameter name: what
    the DDP hook (AccordionHookState) and the FSDP comm (comm/fsdp.py) share.

    `detector` (optional, anything with accumulate_layers(layers, grads) and end_step()) is fed
    each bucket's local gradients of the compressible layers before they are reduced: under the
    hook, p.grad holds the averaged, decompressed gradient once backward() returns.
    `check_levels` spends one 16-byte all-reduce per step on check_agreement, a CPU tensor on
    the reducer's control group (made here, on every rank: build the state on every rank).
    """

    def __init__(self, named: list[tuple[str, torch.Tensor]], compressor: str, *, group,
                 check_levels: bool, **options):
        # before any work: the string "no" is truthy
        Options(type(self).__name__, {"check_levels": check_levels}).flag("check_levels")
        if not named:
            raise ValueError("the model has no trainable parameters")
        self.param_names = [name for name, _ in named]
        params = [p for _, p in named]
        self.dtype = compute_dtype(params)
        # The reducer reads only shape, dtype and device: stand-ins that allocate nothing (an
        # FSDP parameter is a DTensor whose shape is the whole, unsharded one).
        stand_ins = [torch.zeros((), dtype=self.dtype, device=p.device).expand(p.shape)
                     for p in params]
        self.reducer = build_reducer(compressor, stand_ins, group=group, **options)
        self._params = params
        self.detector = None
        self.stats = CommStats()
        self.check_levels = check_levels
        if self.check_levels:
            self.reducer.comm.control()

    @property
    def layer_names(self) -> list[str]:
        """Names of the compressible parameters, in the order set_levels expects."""
        return [self.param_names[i] for i in self.reducer.tensor_of_layer]

    @property
    def layer_params(self) -> list[torch.Tensor]:
        """The compressible parameters, in the order of layer_names."""
        return [self._params[i] for i in self.reducer.tensor_of_layer]

    @property
    def levels(self) -> list:
        return list(self.reducer.levels)

    def set_levels(self, levels) -> None:
        """One level per entry of layer_names (None = the compressor default), from the next
        step on. Call it alike on every rank (the level check stops a rank that did not)."""
        self.reducer.set_levels(levels)

    def set_level(self, param_name: str, level) -> None:
        if param_name not in self.param_names:
            close = difflib.get_close_matches(param_name, self.param_names, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"no trainable parameter named {param_name!r}{hint} (layer_names "
                             "lists the compressible ones)")
        layer = self.reducer.layer_of_tensor[self.param_names.index(param_name)]
        if layer is None:
            raise ValueError(f"{param_name!r} has fewer than 2 dimensions: it is always sent "
                             "dense and takes no level")
        levels = self.levels
        levels[layer] = level
        self.set_levels(levels)

    def pop_stats(self) -> CommStats:
        """Communication since the last call (summed over buckets and steps), then reset."""
        stats, self.stats = self.stats, CommStats()
        return stats


class AccordionHookState(ReducerState):
    """What accordion_hook needs: the reducer, the parameter positions, the detector tap
    (ReducerState says what `detector` and `check_levels` do)."""

    def __init__(self, model: torch.nn.Module, compressor: str = "powersgd", *, group=None,
                 async_op: bool = True, check_levels: bool = True, **options):
        Options("AccordionHookState", {"async_op": async_op}).flag("async_op")  # "no" is truthy
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        super().__init__(named, compressor, group=group, check_levels=check_levels, **options)
        # Per bucket the dense tensors ride at the end of P's buffer (ACP-SGD's factor's): 2
        # collectives per PowerSGD bucket, where torch's powerSGD_hook issues 3.
        self.reducer.fold_dense()
        self._position_of_ptr = {p.data_ptr(): i for i, p in enumerate(self._params)}
        self.async_op = async_op
        self._pipeline = BucketPipeline()
        self._step_stats: CommStats | None = None  # of the reduction in progress, if any

    # ---- one bucket -----------------------------------------------------------------------
    def reduce_bucket(self, bucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        grads = bucket.gradients()  # views into buffer: reducing them fills the buffer
        try:
            positions = [self._position_of_ptr[p.data_ptr()] for p in bucket.parameters()]
        except KeyError:
            raise ValueError("the DDP model's parameters are not those AccordionHookState was "
                             "built from (build the state from the model you wrap)") from None
        work_buffer = buffer.to(self.dtype)  # the buffer itself when it has the dtype already
        if work_buffer is not buffer:
            base = buffer.storage_offset()
            grads = [work_buffer[g.storage_offset() - base:][:g.numel()].view(g.shape)
                     for g in grads]
        try:
            if self._step_stats is None:  # the first bucket of a reduction
                self._step_stats = CommStats()
                self._pipeline.reset()
                if self.check_levels:  # before any compressed collective of the step
                    check_agreement(self.reducer)
            if self.detector is not None:
                layers = [(layer, g) for p, g in zip(positions, grads)
                          if (layer := self.reducer.layer_of_tensor[p]) is not None]
                if layers:
                    self.detector.accumulate_layers([l for l, _ in layers], [g for _, g in layers])
            # Every bucket adds to the step's stats as it starts its collectives: they are
            # complete once the last bucket has driven every reduction to its final phase.
            steps = self.reducer.reduce_steps(positions, grads, self._step_stats,
                                              self.reducer.levels,
                                              slot=bucket.index() if self.async_op else None)

            def finish() -> torch.Tensor:
                if work_buffer is not buffer:
                    buffer.copy_(work_buffer)
                return buffer

            last = bucket.is_last()
            if self.async_op:
                devices = [buffer.device] if buffer.device.type == "cuda" else []
                future = self._pipeline.submit(steps, finish, last, devices)
            else:
                for phase in steps:
                    for work in phase.works:
                        work.wait()
                future = torch.futures.Future()
                future.set_result(finish())
            if last:
                self.stats += self._step_stats
                self._step_stats = None
                if self.detector is not None:
                    self.detector.end_step()
            return future
        except BaseException:
            self._step_stats = None
            self._pipeline.reset()
            raise


def accordion_hook(state: AccordionHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket's gradients with the state's reducer."""
    return state.reduce_bucket(bucket)
