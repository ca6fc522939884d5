"""The torch and torchvision APIs this package relies on, each with the release that added it.

pyproject.toml declares `torch>=` and `torchvision>=` ranges instead of pins, so that the suite
installs into a cluster's own CUDA build of torch without pip replacing it. The lower bounds
are the newest "added in" below (tests/test_torch_apis.py checks that, that each API exists in
the installed torch, and that each is still used where it says); the versions the suite is
tested with are pinned in constraints.txt, which `make install` and CI apply.

Only APIs that are younger than torch 1.10 or that the code cannot do without are listed: the
rest (tensors, nn layers, SGD, all_reduce) are far older than any bound worth declaring.
Sources: the torch release notes and the pull requests named in each entry.

An entry with a `feature` serves only that optional path (dist.strategy=fsdp, Accordion on a
fully_shard model): it is checked like the rest but does not raise the declared bound;
oldest_torch(feature) is that path's own oldest torch (docs/fsdp.md).
"""

from __future__ import annotations

from typing import NamedTuple


class TorchAPI(NamedTuple):
    api: str        # a dotted name the test resolves in the installed torch (or a Python keyword)
    keyword: str | None  # a keyword argument the API must accept, when that is the young part
    added: str      # the first torch (or torchvision) release that has it
    used_in: str    # a file under the repository that uses it
    marker: str     # text in that file that shows the use
    why: str
    feature: str | None = None  # the optional path that alone needs it; None: every run does


TORCH_APIS: tuple[TorchAPI, ...] = (
    TorchAPI("torch.nn.parallel.DistributedDataParallel.register_comm_hook", None, "1.8",
             "accordion_repro/ddp.py", "register_comm_hook", "the Accordion DDP hook"),
    TorchAPI("torch.distributed.GradBucket.buffer", None, "1.10", "accordion_repro/comm/ddp_hook.py",
             "bucket.buffer()", "GradBucket.buffer/gradients/parameters/index/is_last: the "
             "1.10 names (pytorch#62510 renamed get_tensor, get_per_parameter_tensors, ...)"),
    TorchAPI("torch.distributed.GradBucket.is_last", None, "1.10", "accordion_repro/comm/ddp_hook.py",
             "bucket.is_last()", "the last bucket of a backward drives every reduction to its end"),
    TorchAPI("torch.futures.collect_all", None, "1.6", "accordion_repro/comm/ddp_hook.py",
             "torch.futures.collect_all", "the asynchronous hook's final phase"),
    TorchAPI("torch.futures.Future.then", None, "1.6", "accordion_repro/comm/ddp_hook.py",
             ".then(", "decompression once the final phase's collectives are done"),
    TorchAPI("torch.autocast", None, "1.10", "accordion_repro/engine/precision.py",
             "torch.autocast(device_type", "bf16 autocast on the CPU and on CUDA"),
    TorchAPI("torch.linalg.vector_norm", None, "1.10", "accordion_repro/comm/powersgd.py",
             "torch.linalg.vector_norm", "PowerSGD's rank-1 normalisation, the detector's norms"),
    TorchAPI("torch.distributed.run", None, "1.10", "benchmarks/gpu_check.py",
             "torch.distributed.run", "torchrun, the launcher of the trainer's GPU check"),
    TorchAPI("torch.load", "weights_only", "1.13", "accordion_repro/engine/checkpoint.py",
             "weights_only=True", "checkpoints are read without unpickling code"),
    TorchAPI("torch.distributed.all_gather_into_tensor", None, "1.13",
             "accordion_repro/comm/collectives.py", "all_gather_into_tensor",
             "Top-K's one all-gather into one flat tensor"),
    TorchAPI("torch.distributed.get_global_rank", None, "1.13", "accordion_repro/ddp.py",
             "get_global_rank", "the group's rank 0 decides (public since pytorch#82134)"),
    TorchAPI("torch.distributed.new_group", "use_local_synchronization", "2.1",
             "accordion_repro/comm/collectives.py", "use_local_synchronization",
             "the CPU (gloo) group of the level check, made by the group's ranks only "
             "(pytorch#99931)"),
    TorchAPI("torch.compiler.disable", None, "2.1", "accordion_repro/ddp.py",
             "torch.compiler.disable", "torch.compile skips the level check instead of "
             "breaking the graph at its host read (issue 37 item 15)"),
    TorchAPI("torch.distributed.fsdp.FSDPModule.set_custom_reduce_scatter", None, "2.9",
             "accordion_repro/comm/fsdp.py", "set_custom_reduce_scatter(", "Accordion's "
             "reducers as each FSDP2 unit's gradient reduce-scatter (pytorch#155189, merged "
             "July 2025, after 2.8's branch cut)", "fsdp"),
    TorchAPI("torch.distributed.fsdp.FSDPModule.set_custom_all_gather", None, "2.9",
             "accordion_repro/comm/fsdp.py", "set_custom_all_gather(", "FSDP2's parameter "
             "all-gathers as Communicator's, in segments on gloo (SegmentedAllGather; "
             "pytorch#155189)", "fsdp"),
    TorchAPI("torch.distributed.fsdp._fully_shard._fsdp_api.AllGather", None, "2.9",
             "accordion_repro/comm/fsdp.py", "import AllGather, ReduceScatter", "the private "
             "interfaces the two custom collectives implement (pytorch#155189)", "fsdp"),
)

# torchvision releases in step with torch: the one that goes with each torch minor release.
TORCHVISION_FOR_TORCH = {"1.8": "0.9", "1.10": "0.11", "1.13": "0.14", "2.0": "0.15",
                         "2.1": "0.16"}
# torchvision: datasets.CIFAR10/CIFAR100 and transforms' RandomCrop, RandomHorizontalFlip,
# RandomRotation, ToTensor, Normalize, Compose, all far older than the torch bound's partner.
TORCHVISION_APIS = ("torchvision.datasets.CIFAR10", "torchvision.datasets.CIFAR100",
                    "torchvision.transforms.RandomCrop", "torchvision.transforms.RandomRotation",
                    "torchvision.transforms.Normalize")


def version_tuple(version: str) -> tuple[int, ...]:
    """'2.14.1+cu130' -> (2, 14, 1): release numbers only, local and pre-release tags dropped."""
    parts = []
    for piece in version.split("+")[0].split("."):
        digits = "".join(c for c in piece if c.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
        if not piece.isdigit():
            break
    return tuple(parts)


def oldest_torch(feature: str | None = None) -> str:
    """The newest 'added' of the TORCH_APIS every run needs (and, with `feature`, of that
    optional path's): the oldest torch that has all of them."""
    return max((a.added for a in TORCH_APIS if a.feature in (None, feature)), key=version_tuple)


def torch_too_old_for(feature: str) -> str | None:
    """None if the installed torch has every API of `feature`'s path; else one line saying
    which torch it needs (config.validate and comm/fsdp.py refuse with it before any work)."""
    import torch

    need = oldest_torch(feature)
    if version_tuple(torch.__version__) >= version_tuple(need):
        return None
    return f"needs torch >= {need}; this is torch {torch.__version__}"
