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
a Future at once, so DDP overlaps them with the rest of the backward pass (comm/overlap.py);
`async_op=False` reduces each bucket inside the hook. Both run the same operations.

Half-precision gradients (bf16 or fp16 parameters, or torch's fp16_compress_wrapper around
this hook) are compressed in float32: each bucket is copied to float32, reduced, and written
back in its own dtype, and the error memory, P and Q are float32. LAPACK's QR has no half
kernels, and an error memory in bf16 would lose most of what it is meant to keep.
"""

# No `from __future__ import annotations`: DDP checks the hook's return annotation object.
import difflib

import torch

from . import build_reducer
from .agreement import LevelAgreement
from .overlap import BucketPipeline
from .stats import CommStats

_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(params) -> torch.dtype:
    """float32 for fp32/bf16/fp16 parameters (in any mix), float64 for float64 ones."""
    dtypes = {p.dtype for p in params}
    if not all(d.is_floating_point for d in dtypes):
        raise ValueError(f"gradients must be floating point, got {sorted(map(str, dtypes))}")
    if dtypes <= {torch.float32, *_HALF}:
        return torch.float32
    if dtypes == {torch.float64}:
        return torch.float64
    raise ValueError(f"parameters mix {sorted(map(str, dtypes))}: one reducer computes in one "
                     "dtype; cast the model to one precision (float64 or float32/bf16/fp16)")


def _stand_ins(params, dtype: torch.dtype) -> list[torch.Tensor]:
    """Tensors with the parameters' shapes and device in `dtype`, allocating nothing (the
    reducer reads only shape, dtype and device from them)."""
    return [torch.zeros((), dtype=dtype, device=p.device).expand(p.shape) for p in params]


class AccordionHookState:
    """What accordion_hook needs: the reducer, the parameter positions, the detector tap.

    `detector` (optional, anything with accumulate_layers(layers, grads) and end_step()) is fed
    each bucket's local gradients of the compressible layers before they are reduced: under the
    hook, p.grad holds the averaged, decompressed gradient once backward() returns.
    `check_levels` spends one 16-byte all-reduce per step so that ranks holding different levels
    stop with LevelMismatchError instead of failing inside the backend.
    """

    def __init__(self, model: torch.nn.Module, compressor: str = "powersgd", *, group=None,
                 async_op: bool = True, check_levels: bool = True, **options):
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        if not named:
            raise ValueError("the model has no trainable parameters")
        self.param_names = [name for name, _ in named]
        params = [p for _, p in named]
        self.dtype = compute_dtype(params)
        self.compressor = compressor
        self.reducer = build_reducer(compressor, _stand_ins(params, self.dtype), group=group,
                                     **options)
        self._params = params
        self._position_of_ptr = {p.data_ptr(): i for i, p in enumerate(params)}
        self._position_of_name = {name: i for i, name in enumerate(self.param_names)}
        self.async_op = bool(async_op)
        self.detector = None
        self.stats = CommStats()
        self._agreement = (LevelAgreement(compressor, self.reducer.comm, self.reducer.device)
                           if check_levels else None)
        self._pipeline = BucketPipeline()
        self._step_stats: list[CommStats] = []
        self._in_step = False

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
        if param_name not in self._position_of_name:
            close = difflib.get_close_matches(param_name, self.param_names, n=3)
            hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
            raise ValueError(f"no trainable parameter named {param_name!r}{hint} (layer_names "
                             "lists the compressible ones)")
        layer = self.reducer.layer_of_tensor[self._position_of_name[param_name]]
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

    def positions(self, params) -> list[int]:
        try:
            return [self._position_of_ptr[p.data_ptr()] for p in params]
        except KeyError:
            raise ValueError("the DDP model's parameters are not those AccordionHookState was "
                             "built from (build the state from the model you wrap)") from None

    # ---- one bucket -----------------------------------------------------------------------
    def _begin_step(self) -> None:
        self._in_step = True
        self._step_stats = []
        self._pipeline.reset()
        if self._agreement is not None:
            self._agreement.check(self.reducer.levels)

    def _end_step(self) -> None:
        for stats in self._step_stats:
            self.stats += stats
        self._step_stats = []
        self._in_step = False
        if self.detector is not None:
            self.detector.end_step()

    def reduce_bucket(self, bucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        grads = bucket.gradients()  # views into buffer: reducing them fills the buffer
        positions = self.positions(bucket.parameters())
        if buffer.dtype != self.dtype:
            work_buffer = buffer.to(self.dtype)
            base = buffer.storage_offset()
            grads = [work_buffer[g.storage_offset() - base:][:g.numel()].view(g.shape)
                     for g in grads]
        else:
            work_buffer = buffer
        try:
            if not self._in_step:
                self._begin_step()
            if self.detector is not None:
                layers = [(self.reducer.layer_of_tensor[p], g) for p, g in zip(positions, grads)]
                layers = [(layer, g) for layer, g in layers if layer is not None]
                if layers:
                    self.detector.accumulate_layers([l for l, _ in layers],
                                                    [g for _, g in layers])
            stats = CommStats()
            self._step_stats.append(stats)
            slot = bucket.index() if self.async_op else None
            steps = self.reducer.reduce_steps(positions, grads, stats, self.reducer.levels,
                                              slot=slot)

            def finish() -> torch.Tensor:
                if work_buffer is not buffer:
                    buffer.copy_(work_buffer)
                return buffer

            last = bucket.is_last()
            if self.async_op:
                future = self._pipeline.submit(steps, finish, last)
            else:
                for phase in steps:
                    for work in phase.works:
                        work.wait()
                future = torch.futures.Future()
                future.set_result(finish())
            if last:
                self._end_step()
            return future
        except BaseException:
            self._in_step = False
            self._pipeline.reset()
            raise


def accordion_hook(state: AccordionHookState, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: average the bucket's gradients with the state's reducer."""
    return state.reduce_bucket(bucket)
