"""Benchmark the gradient reducers on 2 gloo ranks with CIFAR-10 ResNet-18 gradient shapes.

Compares per step, configurations interleaved within every round so machine noise hits all
alike: the dense all-reduce; our PowerSGD at ranks 1, 2, 4 against torch's DDP powerSGD_hook
(driven by a real DistributedDataParallel with one bucket holding every gradient, the hook's
own time measured around the call); our DDP hook in the same harness; Top-K at 99%, 10%, 1%
(the full reduce step, and the selection alone against an argsort-based selection, whose
one full sort per layer serves all three ratios since its cost does not depend on k).
Each rank runs OMP_NUM_THREADS=1. Prints medians, IQRs and ratios; writes a CSV.

    python scripts/bench_compressors.py [--steps 20] [--warmup 3] [--out results/bench/compressors.csv]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .harness import WORLD, interleave, quantile_rows, run_ranks, write_csv

RANKS = (1, 2, 4)
RATIOS = (0.99, 0.1, 0.01)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 2)")
    parser.add_argument("--out", type=Path, default=Path("results/bench/compressors.csv"))
    parser.add_argument("--no-argsort", action="store_true",
                        help="skip the (slow) argsort baseline")
    return parser.parse_args(argv)


def gradient_shapes():
    from accordion_repro.models import build_model

    return [tuple(p.shape) for p in build_model("resnet18", num_classes=10).parameters()]


def _shape_model(shapes, gradients):
    """A module whose parameters have `shapes` and whose backward yields `gradients`."""
    import torch

    class ShapeModel(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s)) for s in shapes)

        def forward(self):
            return sum((w * g).sum() for w, g in zip(self.weights, gradients))

    return ShapeModel()


def measure(args, rank: int) -> tuple[dict[str, list[float]], float]:
    """Every configuration on this rank, interleaved: (timed samples per name, loop seconds)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
    from torch.nn.parallel import DistributedDataParallel

    from accordion_repro.comm import build_reducer
    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook
    from accordion_repro.comm.topk import topk_indices

    shapes = gradient_shapes()
    gen = torch.Generator().manual_seed(rank)
    gradients = [torch.randn(s, generator=gen) for s in shapes]

    def reducer_step(reducer):
        grads = [g.clone() for g in gradients]
        dist.barrier()
        start = time.perf_counter()
        reducer.reduce(grads)
        return time.perf_counter() - start

    def ddp_setup(hook, make_state):
        model = _shape_model(shapes, gradients)
        state = make_state(model)
        ddp = DistributedDataParallel(model, bucket_cap_mb=100)  # one bucket for everything
        return _wrap_existing(ddp, state, hook)

    def ddp_step(ddp_and_elapsed):
        ddp, elapsed = ddp_and_elapsed
        ddp.zero_grad(set_to_none=False)
        dist.barrier()
        ddp().backward()
        return elapsed.pop()

    configs = {"dense all-reduce": (reducer_step, build_reducer("none", gradients))}
    for r in RANKS:
        configs[f"ours powersgd r{r}"] = (reducer_step, build_reducer("powersgd", gradients, rank=r))
        torch_state = torch_psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
            min_compression_rate=1, use_error_feedback=True, warm_start=True)
        configs[f"torch powersgd_hook r{r}"] = (
            ddp_step, ddp_setup(torch_psgd.powerSGD_hook, lambda model, s=torch_state: s))
        # async_op=False: the hook reduces inside the call, which is what this harness times.
        configs[f"ours ddp hook r{r}"] = (ddp_step, ddp_setup(
            accordion_hook,
            lambda model, r=r: AccordionHookState(model, "powersgd", rank=r, async_op=False)))
    for ratio in RATIOS:
        configs[f"ours topk {ratio:g}"] = (reducer_step, build_reducer("topk", gradients, ratio=ratio))

    compressible = [g.view(-1) for g in gradients if g.dim() >= 2]

    def selection_step(select, ratio):
        def step(_):
            start = time.perf_counter()
            for flat in compressible:
                select(flat, max(1, int(ratio * flat.numel())))
            return time.perf_counter() - start
        return step

    for ratio in RATIOS:
        configs[f"ours topk selection {ratio:g}"] = (selection_step(topk_indices, ratio), None)
    if not args.no_argsort:
        # One full argsort per layer serves every ratio: its cost does not depend on k.
        configs["argsort selection"] = (selection_step(
            lambda x, k: torch.argsort(x.abs(), descending=True)[:k], 1.0), None)

    return interleave(configs, args.warmup, args.steps)


def _wrap_existing(ddp, state, hook):
    """Register `hook` on `ddp` with the same timing wrapper the torch hook gets."""
    import torch

    elapsed = []

    def timed_hook(hook_state, bucket):
        start = time.perf_counter()
        future = hook(hook_state, bucket)
        future.wait()
        elapsed.append(time.perf_counter() - start)
        return future

    timed_hook.__annotations__ = {"return": torch.futures.Future[torch.Tensor]}
    ddp.register_comm_hook(state, timed_hook)
    return ddp, elapsed


def summarize(samples: dict[str, list[float]]):
    rows = quantile_rows(samples)
    by_name = {row["config"]: row for row in rows}
    for row in rows:
        name = row["config"]
        baseline = None
        if name.startswith("ours powersgd r") or name.startswith("ours ddp hook r"):
            baseline = by_name.get(f"torch powersgd_hook r{name.rsplit('r', 1)[1]}")
        elif name.startswith("ours topk selection"):
            baseline = by_name.get("argsort selection")
        row["baseline"] = baseline["config"] if baseline else ""
        row["ours_over_theirs"] = row["median_ms"] / baseline["median_ms"] if baseline else None
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.warmup < 2:
        raise SystemExit("--warmup must be >= 2: torch's hook compresses from its 2nd step on")
    samples, seconds = run_ranks(measure, args)
    rows = summarize(samples)

    print(f"{WORLD} gloo ranks, OMP_NUM_THREADS=1, ResNet-18 CIFAR-10 gradient shapes, "
          f"{args.steps} timed steps after {args.warmup} warm-up, interleaved; "
          f"measured loop {seconds:.0f} s")
    print(f"{'config':32s} {'median ms':>10s} {'IQR ms':>8s}  ours/theirs (baseline)")
    for row in rows:
        ratio = (f"{row['ours_over_theirs']:.3f} ({row['baseline']})"
                 if row["ours_over_theirs"] is not None else "")
        print(f"{row['config']:32s} {row['median_ms']:10.2f} {row['iqr_ms']:8.2f}  {ratio}")
    write_csv(rows, args.out)

