"""dist.strategy=fsdp in the trainer: how the model is sharded and how its state is saved.

The compression itself is comm/fsdp.py's (the same reducer as dist.strategy=ddp, inside FSDP2's
reduce-scatter); this module holds only what the trainer needs around it, so that trainer.py
reads the same under both strategies.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist


def shard_model(model: torch.nn.Module, device: torch.device, *,
                one_unit: bool = False) -> torch.nn.Module:
    """fully_shard each direct child that holds parameters of its own, then the root
    (`one_unit`: the root only, so one reduce-scatter sees the whole gradient); every unit's
    parameter all-gather is comm/fsdp.py's SegmentedAllGather (on gloo, in segments).

    A child that shares a parameter with another module (the LSTM's tied encoder and decoder)
    stays in the root unit: FSDP2 shards each parameter in one unit only.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from ..comm.fsdp import segment_all_gathers

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    uses = Counter(id(p) for _, p in model.named_parameters(remove_duplicate=False))
    for child in () if one_unit else model.children():
        params = list(child.parameters())
        if params and all(uses[id(p)] == 1 for p in params):
            fully_shard(child, mesh=mesh)
    root = fully_shard(model, mesh=mesh)
    segment_all_gathers(root)
    return root


def _options(**kwargs):
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kwargs)


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Collective: the whole (unsharded) model and optimizer state, on rank 0 only (the others
    get empty dicts), in torch's distributed state-dict form (keys are parameter names)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, optimizer, options=_options(cpu_offload=True))


def load_full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict,
                    optimizer_state: dict) -> None:
    """Every rank loads the whole state (each keeps its own shard of it)."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, optimizer, model_state_dict=model_state,
                   optim_state_dict=optimizer_state, options=_options())
