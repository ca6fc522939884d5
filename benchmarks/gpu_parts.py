"""The measuring parts of benchmarks/gpu_check.py, each run in its own process with a time limit.

    python -m benchmarks.gpu_parts PART SIZES_JSON RESULT_JSON

PART is one of PARTS. Each part writes its result (plain JSON) to RESULT_JSON; gpu_check.py
starts them, stops any that runs past its limit, and writes the results. Nothing here imports
Hydra, omegaconf, submitit or wandb: the typical offline GPU node has torch and little else.

Every process group made here has a short timeout (sizes["pg_timeout_s"]), so a collective
that never completes raises instead of waiting torch's default 10 to 30 minutes. With
`ACCORDION_GPU_CHECK_HANG=PART` that part sleeps after its set-up (a stand-in for a hung
collective), so the suite can watch the check stop it and name it.
"""

from __future__ import annotations

import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from accordion_repro.engine.precision import autocast
from accordion_repro.models import build_model
from .harness import interleave

HANG_ENV = "ACCORDION_GPU_CHECK_HANG"
STEP_CONFIGS = ["dense", "ours powersgd r1", "ours powersgd r2", "ours powersgd r4",
                "torch powerSGD_hook r1", "torch powerSGD_hook r2", "torch powerSGD_hook r4",
                "ours topk 0.01", "ours topk 0.1", "ours topk 0.99"]
LAYOUTS = {"fp32": ("fp32", False), "bf16": ("bf16", False), "channels_last": ("fp32", True)}
CIFAR_MODELS = ("resnet18", "vgg19bn", "senet18", "googlenet", "densenet")


def _hang_here(part: str) -> None:
    if os.environ.get(HANG_ENV) == part:
        time.sleep(3600)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _init_group(s: dict, rank: int, world: int, store: str) -> torch.device:
    """A process group with a short timeout; this rank's device, made current."""
    device = torch.device(s["device"], rank) if s["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(s["backend"], init_method=f"file://{store}", rank=rank,
                            world_size=world,
                            timeout=datetime.timedelta(seconds=s["pg_timeout_s"]))
    return device


def _model(s: dict, name: str, device: torch.device, channels_last: bool = False):
    torch.manual_seed(0)
    model = build_model(name, num_classes=10, width=s["width"]).to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def _step_fn(model, forward, optimizer, x, y, device, precision, channels_last):
    """One timed step: zero_grad, forward, backward, SGD step; seconds, the device synced."""
    layout = torch.channels_last if channels_last else torch.contiguous_format

    def step(_):
        _sync(device)
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with autocast(device, precision):
            loss = F.cross_entropy(forward(x.contiguous(memory_format=layout)), y)
        loss.backward()
        optimizer.step()
        _sync(device)
        return time.perf_counter() - start
    return step


# ---- hook and step times: one rank, a real DDP step ---------------------------------------
def hook_and_steps(s: dict) -> dict:
    """The Accordion hook (asynchronous) under bf16, then DDP step times: DDP's all-reduce,
    our PowerSGD and Top-K hook, torch's powerSGD_hook, at fp32, bf16 and channels_last."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
    from torch.nn.parallel import DistributedDataParallel

    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook
    from accordion_repro.ddp import Accordion

    device = _init_group(s, 0, 1, tempfile.mktemp(prefix="gpu-check-store-"))
    _hang_here("hook and step times")
    x = torch.randn(s["batch"], 3, 32, 32, device=device)
    y = torch.randint(0, 10, (s["batch"],), device=device)
    ids = [device.index] if device.type == "cuda" else None

    def ddp_model(channels_last=False):
        model = _model(s, "resnet18", device, channels_last)
        return model, DistributedDataParallel(model, device_ids=ids)

    model, ddp = ddp_model()
    acc = Accordion(ddp, "powersgd", low=2, high=1, interval=1, async_op=True)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    losses = []
    for _ in range(s["hook_steps"]):
        optimizer.zero_grad()
        with autocast(device, "bf16"):
            loss = F.cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    acc.end_epoch(0, 0.01, 0.01)
    hook = {"losses": losses, "floats": acc.pop_stats().floats_sent,
            "dtype": str(next(model.parameters()).grad.dtype)}
    del acc, ddp

    def configuration(name: str, precision: str, channels_last: bool):
        model, ddp = ddp_model(channels_last)
        if name.startswith("ours"):
            _, compressor, level = name.split()
            options = {"rank": int(level[1:])} if compressor == "powersgd" else {"ratio": float(level)}
            ddp.register_comm_hook(AccordionHookState(model, compressor, **options), accordion_hook)
        elif name.startswith("torch"):
            state = torch_psgd.PowerSGDState(process_group=None, start_powerSGD_iter=2,
                                             matrix_approximation_rank=int(name[-1]),
                                             min_compression_rate=1)
            ddp.register_comm_hook(state, torch_psgd.powerSGD_hook)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        return _step_fn(model, ddp, optimizer, x, y, device, precision, channels_last), None

    configs = {f"{layout} | {name}": configuration(name, *LAYOUTS[layout])
               for layout in LAYOUTS for name in STEP_CONFIGS}
    samples, seconds = interleave(configs, s["warmup"], s["steps"])
    dist.destroy_process_group()
    return {"hook": hook, "steps": {name: statistics.median(v) for name, v in samples.items()},
            "step_loop_s": seconds}


# ---- images/s per CIFAR model --------------------------------------------------------------
def models(s: dict) -> dict:
    """images/s of one training step (no communication) per CIFAR model and layout."""
    device = torch.device(s["device"], 0) if s["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    _hang_here("models")
    x = torch.randn(s["batch"], 3, 32, 32, device=device)
    y = torch.randint(0, 10, (s["batch"],), device=device)
    rows = []
    for name in CIFAR_MODELS:
        configs = {}
        for layout, (precision, channels_last) in LAYOUTS.items():
            model = _model(s, name, device, channels_last)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            configs[layout] = (_step_fn(model, model, optimizer, x, y, device, precision,
                                        channels_last), None)
        samples, _ = interleave(configs, s["warmup"], s["model_steps"])
        for layout, values in samples.items():
            median = statistics.median(values)
            rows.append({"model": name, "layout": layout, "batch": s["batch"],
                         "median_ms": round(1e3 * median, 3),
                         "images_per_s": round(s["batch"] / median, 1)})
        del configs
    return {"rows": rows}


# ---- the device input pipeline against PIL -------------------------------------------------
def pipeline(s: dict) -> dict:
    """images/s of the loaders alone: the PIL pipeline (one image at a time, then copied to
    the device) against dataset.pipeline=device (augmentation per batch on the device)."""
    from accordion_repro.data import DeviceImages
    from .step_options import BATCH, _images, _pil_batches

    device = torch.device(s["device"], 0) if s["device"] == "cuda" else torch.device("cpu")
    _hang_here("pipeline")
    dataset = _images(BATCH * s["pipeline_batches"])
    order = list(range(len(dataset)))
    on_device = DeviceImages(dataset, device)

    def pil():
        for images, labels in _pil_batches(dataset, order):
            images.to(device), labels.to(device)

    def device_pipeline():
        for _ in on_device.batches(order, BATCH):
            pass

    rows = []
    for name, work in {"pil": pil, "device": device_pipeline}.items():
        work()  # warm-up
        times = []
        for _ in range(s["pipeline_rounds"]):
            _sync(device)
            start = time.perf_counter()
            work()
            _sync(device)
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        rows.append({"pipeline": name, "images": len(order), "median_s": round(median, 5),
                     "images_per_s": round(len(order) / median, 1)})
    return {"rows": rows}


# ---- equality on several devices -----------------------------------------------------------
def _flat(model) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def _train(s: dict, device, rank: int, wrap, steps: int) -> torch.Tensor:
    """`steps` SGD steps of a DDP ResNet-18 made by wrap(ddp) (rank-specific data, the same
    for every configuration); end_epoch halfway when wrap returns an Accordion (a switch)."""
    from torch.nn.parallel import DistributedDataParallel

    model = _model(s, "resnet18", device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    acc = wrap(ddp)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    gen = torch.Generator().manual_seed(1000 + rank)
    for step in range(steps):
        x = torch.randn(s["equality_batch"], 3, 32, 32, generator=gen).to(device)
        y = torch.randint(0, 10, (s["equality_batch"],), generator=gen).to(device)
        optimizer.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        if acc is not None and step == steps // 2:
            acc.end_epoch(0, 0.05, 0.05)
    return _flat(model)


def _equality_rank(rank: int, s: dict, world: int, store: str, out: str) -> None:
    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook
    from accordion_repro.ddp import Accordion

    device = _init_group(s, rank, world, store)
    _hang_here("multi-gpu equality")
    steps = s["equality_steps"]

    def accordion(async_op):
        return lambda ddp: Accordion(ddp, "powersgd", low=2, high=1, interval=1, async_op=async_op)

    def dense_levels(ddp):  # a PowerSGD rank above every layer's: every layer sent whole
        ddp.register_comm_hook(AccordionHookState(ddp.module, "powersgd", rank=10_000),
                               accordion_hook)

    results = {}
    a = _train(s, device, rank, accordion(True), steps)
    b = _train(s, device, rank, accordion(False), steps)
    results["async hook = sync hook, bit for bit"] = (torch.equal(a, b),
                                                      f"max |diff| {(a - b).abs().max().item():.3g}")
    c = _train(s, device, rank, dense_levels, steps)
    d = _train(s, device, rank, lambda ddp: None, steps)
    gap = ((c - d).abs().max() / d.abs().max()).item()
    # DDP divides each gradient by the world size before its all-reduce, the reducer after
    # the sum: the same average, rounded differently, so equal to float precision, not bits.
    results["non-compressing levels = plain DDP"] = (gap <= 1e-5,
                                                     f"largest difference {gap:.3g} of max |param|")
    e = _train(s, device, rank,
               lambda ddp: Accordion(ddp, "topk", low=0.1, high=0.01, interval=1), steps)
    everyone = [torch.empty_like(e) for _ in range(world)]
    dist.all_gather(everyone, e)
    same = all(torch.equal(everyone[0], other) for other in everyone[1:])
    results[f"Top-K replicas identical after {steps} steps"] = (
        same, f"{world} replicas; max |diff| to rank 0 "
              f"{max((o - everyone[0]).abs().max().item() for o in everyone):.3g}")
    # every rank's verdicts: a check passes only where it passed on all ranks
    verdicts = torch.tensor([ok for ok, _ in results.values()], dtype=torch.int64, device=device)
    dist.all_reduce(verdicts, op=dist.ReduceOp.MIN)
    if rank == 0:
        rows = [{"check": name, "ok": bool(v), "detail": detail + f" (rank 0; {world} ranks)"}
                for (name, (_, detail)), v in zip(results.items(), verdicts.tolist())]
        Path(out).write_text(json.dumps({"rows": rows, "world": world}))
    dist.barrier()
    dist.destroy_process_group()


def multi_gpu_equality(s: dict, out: Path) -> dict | None:
    """On 2+ GPUs (up to 4; --tiny: 3 gloo ranks on the CPU): the async hook equals the sync
    hook bit for bit, levels that compress nothing equal plain DDP, Top-K replicas stay equal."""
    import torch.multiprocessing as mp

    world = s["equality_world"] if s["device"] == "cpu" else min(torch.cuda.device_count(), 4)
    if world < 2:
        return {"skipped": f"{world} GPU: the multi-GPU checks need 2 or more", "rows": []}
    store = tempfile.mktemp(prefix="gpu-check-store-")
    mp.start_processes(_equality_rank, args=(s, world, store, str(out)), nprocs=world,
                       start_method="spawn")
    return None  # rank 0 wrote the result


PARTS = {"hook and step times": hook_and_steps, "models": models, "pipeline": pipeline,
         "multi-gpu equality": multi_gpu_equality}


def main(argv: list[str]) -> int:
    part, sizes_json, out = argv
    s = json.loads(sizes_json)
    torch.set_num_threads(s.get("threads") or torch.get_num_threads())
    fn = PARTS[part]
    result = fn(s, Path(out)) if fn is multi_gpu_equality else fn(s)
    if result is not None:
        Path(out).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
