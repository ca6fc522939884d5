"""Benchmark a real DDP training step on 2 gloo ranks: torch's hooks against ours.

One step is what a user's loop pays: zero_grad, forward, backward (with the DDP communication
hook), optimizer.step, on ResNet-18 for CIFAR-10 (`--width` scales its channels), batch 32 per
rank, SGD with momentum, DDP's default buckets. Arms, interleaved in every round
(benchmarks/harness.py, so machine noise hits all alike):
torch DDP dense (its built-in all-reduce), torch DDP + powerSGD_hook at ranks 1/2/4
(start_powerSGD_iter=2, min_compression_rate=1, error feedback and warm start, as in
compressors.py; in one bucket, see below), our hook asynchronous (the default) and
synchronous at the same ranks, ACP-SGD (`compressor=acp_powersgd`) through our hook, both
ways, at the same ranks, and ours with Top-K at each `--topk` ratio. Each rank runs one
thread; times are rank 0's, after a barrier.

`--compute` also times every arm's twin on a process group of one: the same model, hook,
optimizer and buckets, every collective (the hook's, DDP's buffer broadcast) local and moving
no byte, so the step's compute (forward, backward, compression, optimizer) without the network.
`--breakdown ARM` times the phases of that arm's step instead (benchmarks/ddp_phases.py).

By default it starts its 2 ranks on loopback. With `--env` it is one rank of a torchrun-style
launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from the environment) and rank 0 writes what
it measured to `--raw`: how benchmarks/ddp_network.py runs the same arms across a shaped link
(`python -m accordion_repro.benchmarks.ddp_step --env ...`).

    python scripts/bench_ddp.py [--steps 20] [--warmup 3] [--width 1.0] [--only TEXT ...]
                                [--topk 0.1 ...] [--compute] [--out results/bench/ddp.csv]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from . import harness
from .harness import WORLD, env_rank, interleave, quantile_rows, run_ranks, write_csv

RANKS = (1, 2, 4)
BATCH = 32
TORCH_START_ITER = 2  # torch's powerSGD_hook all-reduces uncompressed before this step


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20, help="timed steps per arm")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first (>= 2)")
    parser.add_argument("--width", type=float, default=1.0, help="ResNet-18 channel multiplier")
    parser.add_argument("--out", type=Path, default=Path("results/bench/ddp.csv"))
    parser.add_argument("--only", nargs="+", default=[""], metavar="TEXT",
                        help="run only arms whose name contains one of these")
    parser.add_argument("--topk", type=float, nargs="+", default=[0.1],
                        help="Top-K kept fractions of our Top-K arms")
    parser.add_argument("--compute", action="store_true",
                        help="also time each arm on a process group of one (its compute)")
    parser.add_argument("--breakdown", metavar="ARM", default=None,
                        help="time the phases of one arm's step instead")
    parser.add_argument("--env", action="store_true",
                        help="be one rank of a torchrun-style launch; rank 0 writes --raw")
    parser.add_argument("--raw", type=Path, default=None, help="with --env: rank 0's JSON")
    args = parser.parse_args(argv)
    if args.warmup < TORCH_START_ITER:
        parser.error(f"--warmup must be >= {TORCH_START_ITER}: torch's hook compresses from "
                     f"its step {TORCH_START_ITER} on")
    if args.env and args.raw is None:
        parser.error("--env needs --raw")
    return args


def arm_specs(topk: tuple[float, ...] = (0.1,)) -> dict[str, tuple[str, dict]]:
    """Every arm's name -> (kind, options), in the order they run in a round."""
    specs = {"torch DDP dense": ("dense", {})}
    for r in RANKS:
        specs[f"torch powerSGD_hook r{r}"] = ("torch", {"rank": r})
        specs[f"ours async r{r}"] = ("ours", {"compressor": "powersgd", "async_op": True, "rank": r})
        specs[f"ours sync r{r}"] = ("ours", {"compressor": "powersgd", "async_op": False, "rank": r})
    for r in RANKS:  # ACP-SGD: one factor per step (comm/acp.py), after every PowerSGD arm
        for mode, async_op in (("async", True), ("sync", False)):
            specs[f"ours {mode} acp r{r}"] = (
                "ours", {"compressor": "acp_powersgd", "async_op": async_op, "rank": r})
    for ratio in topk:
        for mode, async_op in (("async", True), ("sync", False)):
            specs[f"ours {mode} topk {ratio:g}"] = (
                "ours", {"compressor": "topk", "async_op": async_op, "ratio": ratio})
    return specs


class DdpArm(harness.Arm):
    """One arm's DDP model, hook, optimizer and inputs on one process group (harness.Arm); it
    counts what each step hands to the network (`traffic`)."""

    def __init__(self, kind: str, options: dict, *, width: float, group, warmup: int, seed: int,
                 wrap_hook=lambda hook: hook):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd
        from torch.nn.parallel import DistributedDataParallel

        from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook

        model = harness.resnet18(width)
        # One bucket for torch's hook: it starts its P and Q all-reduces from Future
        # callbacks, whose order across several buckets differs between ranks; gloo then
        # stops with "Received data size doesn't match expected size" (seen at DDP's default
        # buckets). Every other arm keeps DDP's default buckets (25 MB, the first 1 MB).
        ddp = DistributedDataParallel(model, process_group=group,
                                      bucket_cap_mb=1024 if kind == "torch" else None)
        super().__init__(ddp, model.parameters(), batch=BATCH, seed=seed, warmup=warmup)
        self.kind, self.hook_state, self._mark = kind, None, None
        if kind == "torch":
            self.hook_state = torch_psgd.PowerSGDState(
                process_group=group, matrix_approximation_rank=options["rank"],
                start_powerSGD_iter=TORCH_START_ITER, min_compression_rate=1,
                use_error_feedback=True, warm_start=True)
            ddp.register_comm_hook(self.hook_state, wrap_hook(torch_psgd.powerSGD_hook))
        elif kind == "ours":
            options = dict(options)
            compressor = options.pop("compressor")
            self.hook_state = AccordionHookState(model, compressor, group=group, **options)
            ddp.register_comm_hook(self.hook_state, wrap_hook(accordion_hook))

    def _stepped(self) -> None:
        if self.steps == self.warmup:
            self._mark = self._counters()

    def _counters(self) -> dict:
        """Totals so far of what the hook handed to its collectives."""
        if self.kind == "ours":
            stats = self.hook_state.stats
            return {"bytes": stats.bytes_sent, "collectives": stats.collectives,
                    "allgather_bytes": stats.allgather_bytes, "allgathers": stats.allgathers}
        if self.kind == "torch":  # its own count of the floats it all-reduces
            return {"bytes": 4 * self.hook_state.total_numel_after_compression}
        return {}

    def traffic(self) -> dict:
        """What one rank hands to the network per step after the warm-up: bytes and
        collectives, all-gathers among them (the cost model's step_comm_time inputs).

        Ours: its CommStats, plus the 16-byte level check. torch's hook: the floats it counts
        itself (total_numel_after_compression), in 3 all-reduces per bucket (uncompressed
        tensors, P, Q). Dense DDP: every gradient, one all-reduce per bucket. Every arm: DDP's
        broadcast of the module buffers (BatchNorm statistics) before each forward.
        """
        timed = self.steps - self.warmup
        now, mark = self._counters(), self._mark or {}
        per_step = {k: (now[k] - mark.get(k, 0)) / timed for k in now} if timed > 0 else {}
        logging = self.net._get_ddp_logging_data()
        buckets = len(str(logging.get("rebuilt_bucket_sizes") or logging["bucket_sizes"]).split())
        out = {"bytes": 0.0, "collectives": 0.0, "allgather_bytes": 0.0, "allgathers": 0.0}
        if self.kind == "ours":
            out.update(per_step)
            if self.hook_state.check_levels:
                out["bytes"] += 16
                out["collectives"] += 1
        elif self.kind == "torch":
            out["bytes"] = per_step.get("bytes", 0.0)
            out["collectives"] = 3 * buckets
        else:
            out["bytes"] = float(logging["total_parameter_size_bytes"])
            out["collectives"] = buckets
        if self.net.will_sync_module_buffers():
            out["bytes"] += sum(b.numel() * b.element_size() for b in self.net.module.buffers())
            out["collectives"] += 1
        return out


def measure(args, rank: int) -> dict:
    """Build the arms on this rank, run them interleaved (or break one down); rank 0's record:
    timed seconds per arm (and per compute twin), each arm's traffic per step, the loop's time."""
    import torch.distributed as dist

    world = dist.get_world_size()
    specs = {n: s for n, s in arm_specs(tuple(args.topk)).items()
             if any(text in n for text in args.only)}
    if args.breakdown is not None:
        if args.breakdown not in specs:
            raise SystemExit(f"--breakdown: no arm {args.breakdown!r}; arms: {', '.join(specs)}")
        specs = {args.breakdown: specs[args.breakdown]}
    if not specs:
        raise SystemExit(f"--only {' '.join(args.only)!r} matches no arm")
    # Every rank creates every group, in the same order; each keeps its own group of one.
    solo = [dist.new_group([r]) for r in range(world)][rank] if args.compute else None

    def arm(kind, options, group, **wrap):
        return DdpArm(kind, options, width=args.width, group=group, warmup=args.warmup,
                      seed=rank, **wrap)

    record = {"width": args.width, "world": world, "batch": BATCH, "steps": args.steps,
              "warmup": args.warmup}
    if args.breakdown is not None:
        from .ddp_phases import breakdown

        kind, options = specs[args.breakdown]
        record["breakdown"] = {args.breakdown: breakdown(
            lambda wrap_hook: arm(kind, options, None, wrap_hook=wrap_hook),
            args.warmup, args.steps)}
        return record
    arms, configs = {}, {}
    for name, (kind, options) in specs.items():
        arms[name] = configs[name] = arm(kind, options, None)
        if solo is not None:
            configs[f"{name} | compute"] = arm(kind, options, solo)
    samples, seconds = interleave({n: (DdpArm.step, a) for n, a in configs.items()},
                                  args.warmup, args.steps)
    record["seconds"] = seconds
    record["samples"] = {n: samples[n] for n in arms}
    record["compute"] = {n: samples[f"{n} | compute"] for n in arms if solo is not None}
    record["traffic"] = {n: a.traffic() for n, a in arms.items()}
    return record


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
        if sync_name in by_name:
            row["async_over_sync"] = paired(name, sync_name)
            row["async_over_sync_of_medians"] = row["median_ms"] / by_name[sync_name]["median_ms"]
    return rows


def main(argv=None):
    args = parse_args(argv)
    if args.env:
        return env_rank(measure, args, args.raw)
    record = run_ranks(measure, args, timeout=3600)
    if args.breakdown is not None:
        from .ddp_phases import table

        print(table(record["breakdown"]))
        return 0
    rows = summarize(record["samples"])
    for row in rows:
        if row["config"] in record["compute"]:
            row["compute_ms"] = 1e3 * statistics.median(record["compute"][row["config"]])
    print(f"{WORLD} gloo ranks, one thread each, ResNet-18 width {args.width:g}, batch {BATCH} "
          f"per rank, {args.steps} timed steps after {args.warmup} warm-up, interleaved; "
          f"measured loop {record['seconds']:.0f} s")
    print(f"{'config':26s} {'median ms':>10s} {'IQR ms':>8s} {'torch/ours':>11s} "
          f"{'async/sync':>11s}   (medians of the per-round ratios)")
    for row in rows:
        ratios = [f"{row[k]:11.2f}" if row[k] is not None else " " * 11
                  for k in ("torch_over_ours", "async_over_sync")]
        print(f"{row['config']:26s} {row['median_ms']:10.1f} {row['iqr_ms']:8.1f} "
              + " ".join(ratios))
    write_csv(rows, args.out)
    args.out.with_suffix(".samples.json").write_text(json.dumps(record["samples"]))  # seconds


if __name__ == "__main__":
    raise SystemExit(main())
