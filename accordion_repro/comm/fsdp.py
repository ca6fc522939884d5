"""Accordion's reducers inside FSDP2's gradient reduce-scatter (`fully_shard`).

FSDP2 reduces the gradients of one unit (one `fully_shard` call's parameter group) in one
collective: it copies every parameter's unsharded local gradient into a flat buffer, rank-major
(rank 0's dim-0 chunk of each parameter, each chunk padded to ceil(rows / world) rows, then rank
1's, ...), and reduce-scatters it, so each rank receives the average of its own chunks.
`FSDPModule.set_custom_reduce_scatter` replaces that collective, per unit; the replacement gets
the flat input, this rank's output part, the group and the reduce op (docs/fsdp.md names the
torch APIs and versions relied on).

Here the flat input is split back into each parameter's whole local gradient; the reducer's own
split (Reducer.split_dense) sends 1-D tensors and layers at non-compressing levels dense, in one
reduce-scatter of just those (the bytes plain FSDP would send for them, the same numbers), and
compresses the rest as the DDP path does (PowerSGD: P all-reduce, orthonormalise, Q all-reduce;
Top-K: one all-gather) with error feedback. Only this rank's chunk of each averaged gradient is
written out. The precision compressor reduce-scatters instead (Reducer.REDUCE_SCATTERS): an
all-to-all of each rank's low-precision chunks of FSDP's own layout and an fp32 sum of the chunk
this rank keeps, no all-gather. A compressed layer's error memory is the whole layer on every rank: compression
needs the whole local gradient, which is the part of FSDP's gradient-memory saving it gives back
(Reducer.memory_bytes says how much).

One reducer covers all trainable parameters of the model, as under DDP, so per-layer state (error
memory, warm-start Q, level) does not depend on how the model is split into units.

FSDP2's parameter all-gathers are not compressed, but they travel as Communicator's all-gathers
do (SegmentedAllGather, through `FSDPModule.set_custom_all_gather`): gloo sends one all-gather
as one message, at about 0.6 of a shaped link's rate, where 256 KiB segments reach its
all-reduce's 0.9 (results/bench/fsdp_traffic.csv). The gathered bytes are the same.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

from .collectives import GLOO_ALLGATHER_SEGMENT, Communicator
from .ddp_hook import ReducerState, check_agreement
from .stats import CommStats

try:  # the interfaces the custom collectives implement (torch >= 2.9; private module)
    from torch.distributed.fsdp._fully_shard._fsdp_api import AllGather, ReduceScatter
except ImportError:  # pragma: no cover - an older torch has no custom collectives at all
    AllGather = ReduceScatter = object


class FSDPSetupError(ValueError):
    """An FSDP set-up the Accordion comm cannot serve (said in one line, before training)."""


class _UnitLayout:
    """Where each parameter of one FSDP unit sits in its flat rank-major reduce-scatter input.

    Parameter j occupies columns offset[j] : offset[j] + chunk_numel[j] of each rank's row of the
    input viewed as (world, per_rank); its whole padded gradient is those columns stacked over the
    rows, (world * chunk_rows[j], *rest), and its true gradient the first rows[j] rows of that.
    """

    def __init__(self, positions: list[int], fsdp_params, world_size: int):
        self.positions = positions
        self.shapes = [tuple(fp._orig_size) for fp in fsdp_params]
        self.chunk_shapes = [tuple(fp.padded_sharded_param_size) for fp in fsdp_params]
        self.chunk_numels = [fp.padded_sharded_param_size.numel() for fp in fsdp_params]
        self.offsets, offset = [], 0
        for numel in self.chunk_numels:
            self.offsets.append(offset)
            offset += numel
        self.per_rank = offset
        self.world_size = world_size

    def whole_gradients(self, flat: torch.Tensor, dtype: torch.dtype) -> list[torch.Tensor]:
        """Each parameter's padded whole local gradient, a fresh contiguous (dtype) copy."""
        rows = flat.view(self.world_size, self.per_rank)
        return [rows[:, off:off + n].to(dtype, copy=True)
                .view(self.world_size * chunk[0], *chunk[1:])
                for off, n, chunk in zip(self.offsets, self.chunk_numels, self.chunk_shapes)]

    def chunk(self, padded: torch.Tensor, j: int, rank: int) -> torch.Tensor:
        """Rank `rank`'s part of parameter j's padded whole gradient, flat."""
        return padded.view(self.world_size, self.chunk_numels[j])[rank]


class AccordionReduceScatter(ReduceScatter):
    """The custom reduce-scatter of one FSDP unit: hands the flat input to the shared state."""

    def __init__(self, state: "FSDPReducerState", layout: _UnitLayout):
        self.state, self.layout = state, layout

    def allocate(self, size, *, dtype, device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        self.state.reduce_unit(self.layout, output_tensor, input_tensor, group, op)
        return None  # done: FSDP uses output_tensor right after this call returns


class _AllDone(dist.Work):
    """One work handle for the pieces of a segmented all-gather: FSDP waits on one."""

    def __init__(self, handles: list):
        super().__init__()
        self.handles = handles

    def wait(self, timeout=None) -> bool:
        for handle in self.handles:
            handle.wait()
        return True


class SegmentedAllGather(AllGather):
    """FSDP2's parameter all-gather as Communicator.all_gather_async (the one implementation):
    on gloo in segments of `segment` elements, on NCCL one call. Into FSDP's own output
    buffer, in its rank-major layout, so the gathered parameters are the same bit for bit.

    `stats` counts FSDP's all-gathers (calls, input bytes); they are not Accordion's traffic
    and are not in `Accordion.pop_stats()`.
    """

    def __init__(self, segment: int = GLOO_ALLGATHER_SEGMENT):
        self.segment = segment
        self.stats = CommStats()
        self._comms: dict = {}  # process group -> its Communicator

    def allocate(self, size, *, dtype, device) -> torch.Tensor:
        return torch.empty(*size, dtype=dtype, device=device)

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        comm = self._comms.get(group)
        if comm is None:
            comm = self._comms[group] = Communicator(group)
            comm.gloo_segment = self.segment
        _, handles = comm.all_gather_async(input_tensor, self.stats, out=output_tensor)
        if async_op:
            return _AllDone(handles)
        for handle in handles:
            handle.wait()
        return None


def fsdp_units(model: torch.nn.Module) -> list[FSDPModule]:
    """The modules of `model` (itself included) that fully_shard made units."""
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def segment_all_gathers(model: torch.nn.Module) -> SegmentedAllGather:
    """Give every FSDP unit of `model` that gathers over gloo and still has FSDP's default
    all-gather one shared SegmentedAllGather (a unit with its own custom all-gather keeps it);
    the one installed.

    Called by the trainer's shard_model and by Accordion(fsdp_model), so that a model sharded
    either way gathers its parameters as Communicator does. Only over gloo, where the segments
    are the gain: over NCCL SegmentedAllGather is one call, as FSDP's own, and a custom
    all-gather there only breaks what FSDP does with its default one (set_symm_mem_for_comm()
    asserts on it)."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    comm = SegmentedAllGather()
    for unit in fsdp_units(model):
        groups = unit._get_fsdp_state()._fsdp_param_groups
        if (len(groups) == 1 and type(groups[0]._all_gather_comm) is DefaultAllGather
                and dist.get_backend(groups[0]._all_gather_process_group) == "gloo"):
            unit.set_custom_all_gather(comm)
    return comm


def is_fsdp_model(model: torch.nn.Module) -> bool:
    """Whether `model` is an FSDP wrapper (fully_shard's, or FSDP1's, which is refused later)."""
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, (FSDPModule, FullyShardedDataParallel))


def check_fsdp_model(model: torch.nn.Module):
    """The process group the FSDP2 model shards over; raises FSDPSetupError (one line) for a
    model or set-up the Accordion comm cannot serve."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._fully_shard._fsdp_common import DDPMeshInfo, FSDPMeshInfo

    from accordion_repro.torch_apis import torch_too_old_for

    too_old = torch_too_old_for("fsdp")
    if too_old is not None:
        raise FSDPSetupError(f"Accordion inside FSDP2's reduce-scatter (pytorch#155189) "
                             f"{too_old}: install a newer torch, or wrap the model in DDP")
    if isinstance(model, FullyShardedDataParallel) or any(
            isinstance(m, FullyShardedDataParallel) for m in model.modules()):
        raise FSDPSetupError("Accordion supports FSDP2 (torch.distributed.fsdp.fully_shard), not "
                             "the FullyShardedDataParallel wrapper (FSDP1)")
    if not isinstance(model, FSDPModule):
        raise FSDPSetupError(f"expected a model wrapped with fully_shard, got "
                             f"{type(model).__name__}")
    groups = set()
    for unit in fsdp_units(model):
        state = unit._get_fsdp_state()
        if len(state._fsdp_param_groups) > 1:
            raise FSDPSetupError("FSDP units with several parameter groups (shard_placement_fn "
                                 "with per-parameter meshes) are not supported")
        reduce_dtype = state._mp_policy.reduce_dtype or state._mp_policy.param_dtype
        if reduce_dtype == torch.float16:
            raise FSDPSetupError("MixedPrecisionPolicy with float16 gradient reduction is not "
                                 "supported (FSDP pre/post-divides it); reduce in float32 or "
                                 "bfloat16")
        for group in state._fsdp_param_groups:
            info = group.mesh_info
            if isinstance(info, DDPMeshInfo) or not isinstance(info, FSDPMeshInfo):
                raise FSDPSetupError("hybrid sharding (HSDP, a 2-D mesh) is not supported: "
                                     "compression would have to span the replicate dimension's "
                                     "all-reduce, which FSDP runs outside the custom "
                                     "reduce-scatter; shard over a 1-D mesh")
            if group.gradient_divide_factor is not None or group.force_sum_reduction_for_comms:
                raise FSDPSetupError("set_gradient_divide_factor / set_force_sum_reduction_for"
                                     "_comms are not supported: Accordion averages over the ranks")
            for fp in group.fsdp_params:
                if fp.fsdp_placement.dim != 0:
                    raise FSDPSetupError(f"a parameter sharded on dim {fp.fsdp_placement.dim} "
                                         "(shard_placement_fn): only dim-0 sharding is supported")
            groups.add(group._reduce_scatter_process_group)
    if len(groups) != 1:
        raise FSDPSetupError(f"the FSDP units shard over {len(groups)} different process "
                             "groups; Accordion needs one")
    return groups.pop()


class FSDPReducerState(ReducerState):
    """The reducer of an FSDP2 model and the custom reduce-scatter of each of its units.

    Built from the root module after every fully_shard call. The detector (ReducerState) gets
    each unit's whole local gradients before they are reduced; a step ends with the backward
    pass (a final autograd callback), where its stats are added up and the detector counts it.
    """

    def __init__(self, model: torch.nn.Module, compressor: str = "powersgd", *,
                 check_levels: bool = True, clip_local: float | None = None,
                 **options):
        """`clip_local`: clip each rank's whole local gradient to this L2 norm before the
        detector and compression (the official LSTM's clipping, optim.clip_point=local); it
        needs the whole model in one unit (only the root fully_shard), where one call sees it."""
        group = check_fsdp_model(model)
        named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
        super().__init__(named, compressor, group=group, check_levels=check_levels, **options)
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        position = {id(p): i for i, p in enumerate(self._params)}
        self.layouts: list[_UnitLayout] = []
        self._with_grad: set[int] = set()  # positions whose gradient this backward produced
        for unit in fsdp_units(model):
            watched = []
            for param_group in unit._get_fsdp_state()._fsdp_param_groups:
                fsdp_params = [fp for fp in param_group.fsdp_params
                               if fp.sharded_param.requires_grad]
                if not fsdp_params:
                    continue
                layout = _UnitLayout([position[id(fp.sharded_param)] for fp in fsdp_params],
                                     fsdp_params, self.world_size)
                self.layouts.append(layout)
                unit.set_custom_reduce_scatter(AccordionReduceScatter(self, layout))
                watched += zip(layout.positions, fsdp_params)
            if watched:
                self._watch_gradients(unit, watched)
        segment_all_gathers(model)  # own code's fully_shard: gather as the trainer's model does
        if clip_local and len(self.layouts) != 1:
            raise FSDPSetupError("clipping each rank's local gradient needs the whole model in "
                                 f"one FSDP unit (fully_shard the root only), not "
                                 f"{len(self.layouts)}")
        self.clip_local = clip_local
        self._step: CommStats | None = None  # of the backward pass in progress, if any

    def _watch_gradients(self, unit: torch.nn.Module, watched: list) -> None:
        """Note which parameters of `unit` get a gradient in each backward pass, so that a unit
        that reduces fewer parameters than it holds names the ones that got none. FSDP2 passes
        the reduce-scatter only the flat gradients of the parameters that have one, and has
        cleared every unsharded .grad by then. The unsharded parameters exist once the unit
        first gathers, in FSDP's own forward pre-hook, which runs before this one."""
        def on_first_forward(module, args):
            for pos, fp in watched:
                fp.unsharded_param.register_post_accumulate_grad_hook(
                    lambda _, pos=pos: self._with_grad.add(pos))
            handle.remove()
        handle = unit.register_forward_pre_hook(on_first_forward)

    # ---- one unit ---------------------------------------------------------------------------
    def reduce_unit(self, layout: _UnitLayout, output: torch.Tensor, flat: torch.Tensor,
                    group, op) -> None:
        """Average one unit's flat rank-major gradient into this rank's `output` part."""
        if op != dist.ReduceOp.AVG:
            raise FSDPSetupError(f"FSDP asked for a {op} reduce-scatter; Accordion averages "
                                 "(float32/bfloat16 reduction, no custom divide factor)")
        if flat.numel() != layout.per_rank * self.world_size:
            missing = [self.param_names[pos] for pos in layout.positions
                       if pos not in self._with_grad]
            raise FSDPSetupError(f"trainable parameter(s) {', '.join(missing) or '(unknown)'} got "
                                 "no gradient this step (unused in the forward pass); Accordion "
                                 "under FSDP needs every trainable parameter used in each step: "
                                 "use it, or set requires_grad=False before fully_shard")
        if self._step is None:  # the first unit of this backward pass
            self._step = CommStats()
            if self.check_levels:  # before any compressed collective of the step
                check_agreement(self.reducer)
            torch.autograd.Variable._execution_engine.queue_callback(self._end_step)
        step = self._step
        step.fsdp_reduce_scatter_bytes += flat.numel() * flat.element_size()
        padded = layout.whole_gradients(flat, self.dtype)
        grads = [whole[:shape[0]] for whole, shape in zip(padded, layout.shapes)]
        reducer = self.reducer
        if self.clip_local:  # as clip_grad_norm_ on the model's parameters, in their order
            ordered = [grads[j] for j in sorted(range(len(grads)), key=layout.positions.__getitem__)]
            torch.nn.utils.clip_grads_with_norm_(
                [SimpleNamespace(grad=g) for g in ordered], self.clip_local,
                torch.nn.utils.get_total_norm(ordered))
        if self.detector is not None:
            layers = [(layer, g) for pos, g in zip(layout.positions, grads)
                      if (layer := reducer.layer_of_tensor[pos]) is not None]
            if layers:
                self.detector.accumulate_layers([l for l, _ in layers], [g for _, g in layers])
        dense_at, compressed = reducer.split_dense(layout.positions, grads, step)
        if dense_at:  # plain FSDP's reduce-scatter, over the dense tensors only
            parts = torch.cat([padded[j].view(self.world_size, -1) for j in dense_at], dim=1)
            averaged = torch.empty(parts.shape[1], dtype=parts.dtype, device=parts.device)
            reducer.comm.reduce_scatter(averaged, parts.view(-1), op, step)
            sizes = [layout.chunk_numels[j] for j in dense_at]
            for j, part in zip(dense_at, averaged.split(sizes)):
                output[layout.offsets[j]:][:part.numel()].copy_(part)
        dense = set(dense_at)
        scattered = [j for j in range(len(grads)) if j not in dense]
        if reducer.REDUCE_SCATTERS and compressed:  # only this rank's chunk of each average
            for j in scattered:  # FSDP's padding rows: zeros whatever FSDP left there (scales)
                padded[j][layout.shapes[j][0]:].zero_()
            pieces = [(reducer.layer_of_tensor[layout.positions[j]],
                       padded[j].view(self.world_size, layout.chunk_numels[j]))
                      for j in scattered]
            chunks = reducer.reduce_scatter_compressed(pieces, step)
        else:  # each whole average on every rank, then this rank's chunk of it
            reducer.average_compressed(compressed, step)
            chunks = [layout.chunk(padded[j], j, self.rank) for j in scattered]
        for j, chunk in zip(scattered, chunks):
            output[layout.offsets[j]:][:layout.chunk_numels[j]].copy_(chunk)

    def _end_step(self) -> None:
        """After the backward pass: every unit has reduced (FSDP's own final callback, queued
        before this one, reduces the units whose post-backward did not run)."""
        step, self._step = self._step, None
        self._with_grad.clear()
        if step is None:
            return
        self.stats += step
        if self.detector is not None:
            self.detector.end_step()
