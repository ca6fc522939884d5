"""Benchmark a real DDP training step on 2 gloo ranks: torch's hooks against ours.

One step is what a user's loop pays: zero_grad, forward, backward (with the DDP communication
hook), optimizer.step, on ResNet-18 for CIFAR-10 (`--width` scales its channels), batch 32 per
rank, SGD with momentum, DDP's default buckets. Configurations, interleaved in every round
(scripts/bench_compressors.py's harness, so machine noise hits all alike):
torch DDP dense (its built-in all-reduce), torch DDP + powerSGD_hook at ranks 1/2/4
(start_powerSGD_iter=2, min_compression_rate=1, error feedback and warm start, as in
bench_compressors.py; in one bucket, see below), our hook asynchronous (the default) and
synchronous at the same ranks, and ours with Top-K 10%. Each rank runs one thread; times are
rank 0's, after a barrier.

    python scripts/bench_ddp.py [--steps 20] [--warmup 3] [--width 1.0] [--only NAME]
                                [--out results/bench/ddp.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compressors import WORLD, interleave, quantile_rows, run_ranks, write_csv  # noqa: E402

RANKS = (1, 2, 4)
TOPK_RATIO = 0.1
BATCH = 32


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per configuration")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 2)")
    parser.add_argument("--width", type=float, default=1.0, help="ResNet-18 channel multiplier")
    parser.add_argument("--out", type=Path, default=Path("results/bench/ddp.csv"))
    parser.add_argument("--only", default="", help="run only configurations containing this")
    return parser.parse_args(argv)


def _worker(rank: int, port: int, args, queue):
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
    from torch.nn.parallel import DistributedDataParallel

    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook
    from accordion_repro.models import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(BATCH, 3, 32, 32, generator=gen)
    y = torch.randint(0, 10, (BATCH,), generator=gen)

    def ddp_model(register=None, one_bucket=False):
        torch.manual_seed(0)
        model = build_model("resnet18", num_classes=10, width=args.width)
        # DDP's default buckets (25 MB, the first 1 MB), or one bucket for every gradient.
        ddp = DistributedDataParallel(model, bucket_cap_mb=1024 if one_bucket else None)
        if register is not None:
            register(ddp, model)
        return ddp, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(target):
        ddp, optimizer = target
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        optimizer.step()
        return time.perf_counter() - start

    def torch_hook(r):
        def register(ddp, model):
            state = torch_psgd.PowerSGDState(
                process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                min_compression_rate=1, use_error_feedback=True, warm_start=True)
            ddp.register_comm_hook(state, torch_psgd.powerSGD_hook)
        return register

    def ours(compressor, async_op, **options):
        def register(ddp, model):
            ddp.register_comm_hook(AccordionHookState(model, compressor, async_op=async_op,
                                                      **options), accordion_hook)
        return register

    configs = {"torch DDP dense": (step, ddp_model())}
    for r in RANKS:
        # One bucket: torch's hook starts its P and Q all-reduces from Future callbacks, whose
        # order across several buckets differs between ranks; gloo then stops with "Received
        # data size doesn't match expected size" (seen here at DDP's default buckets).
        configs[f"torch powerSGD_hook r{r}"] = (step, ddp_model(torch_hook(r), one_bucket=True))
        configs[f"ours async r{r}"] = (step, ddp_model(ours("powersgd", True, rank=r)))
        configs[f"ours sync r{r}"] = (step, ddp_model(ours("powersgd", False, rank=r)))
    configs[f"ours async topk {TOPK_RATIO:g}"] = (
        step, ddp_model(ours("topk", True, ratio=TOPK_RATIO)))
    configs[f"ours sync topk {TOPK_RATIO:g}"] = (
        step, ddp_model(ours("topk", False, ratio=TOPK_RATIO)))

    configs = {name: config for name, config in configs.items() if args.only in name}
    samples, seconds = interleave(configs, args.warmup, args.steps)
    if rank == 0:
        queue.put((samples, seconds))
    dist.barrier()
    dist.destroy_process_group()


def summarize(samples: dict[str, list[float]]) -> list[dict]:
    """Rows with the two ratios the README quotes, for each of our asynchronous configurations:
    torch's hook over ours (above 1: ours is faster) and our async over our sync step (below 1:
    the overlap pays). Each is the median over rounds of the ratio within a round, whose
    configurations ran back to back, so load that changes between rounds cancels; the ratio
    of the medians is kept too."""
    rows = quantile_rows(samples)
    by_name = {row["config"]: row for row in rows}

    def paired(num: str, den: str) -> float:
        return statistics.median(a / b for a, b in zip(samples[num], samples[den]))

    for row in rows:
        name = row["config"]
        for key in ("torch_over_ours", "torch_over_ours_of_medians", "async_over_sync",
                    "async_over_sync_of_medians"):
            row[key] = None
        if not name.startswith("ours async"):
            continue
        suffix = name.removeprefix("ours async ")
        torch_name, sync_name = f"torch powerSGD_hook {suffix}", f"ours sync {suffix}"
        if torch_name in by_name:
            row["torch_over_ours"] = paired(torch_name, name)
            row["torch_over_ours_of_medians"] = by_name[torch_name]["median_ms"] / row["median_ms"]
        row["async_over_sync"] = paired(name, sync_name)
        row["async_over_sync_of_medians"] = row["median_ms"] / by_name[sync_name]["median_ms"]
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.warmup < 2:
        raise SystemExit("--warmup must be >= 2: torch's hook compresses from its 2nd step on")
    samples, seconds = run_ranks(_worker, args, timeout=3600)
    rows = summarize(samples)
    print(f"{WORLD} gloo ranks, one thread each, ResNet-18 width {args.width:g}, batch {BATCH} "
          f"per rank, {args.steps} timed steps after {args.warmup} warm-up, interleaved; "
          f"measured loop {seconds:.0f} s")
    print(f"{'config':26s} {'median ms':>10s} {'IQR ms':>8s} {'torch/ours':>11s} "
          f"{'async/sync':>11s}   (medians of the per-round ratios)")
    for row in rows:
        ratios = [f"{row[k]:11.2f}" if row[k] is not None else " " * 11
                  for k in ("torch_over_ours", "async_over_sync")]
        print(f"{row['config']:26s} {row['median_ms']:10.1f} {row['iqr_ms']:8.1f} "
              + " ".join(ratios))
    write_csv(rows, args.out)
    args.out.with_suffix(".samples.json").write_text(json.dumps(samples))  # seconds, by round


if __name__ == "__main__":
    sys.exit(main())
