"""Bytes per rank and step under FSDP2: plain FSDP against FSDP + Accordion's PowerSGD.

ResNet-18 for CIFAR-10 at each `--width`, sharded as the trainer shards it (dist.strategy=fsdp,
engine/sharding.py), 2 gloo ranks on loopback, batch 8 per rank. Arms: plain FSDP (its own
reduce-scatter, counted by a pass-through custom reduce-scatter), and Accordion(model,
"powersgd") with every layer held at rank 1, 2 and 4 (set_levels). Each arm runs `--steps`
steps; a row is one rank's bytes per step, the bytes handed to collectives (the convention of
CommStats: a reduce-scatter's or all-reduce's input, an all-gather's send), with FSDP's own
reduce-scatter of the same steps beside it. Timings are not measured: gloo's reduce-scatter is
built on all-reduce, so CPU step times of FSDP say little (docs/fsdp.md); the shaped-link step
time of issue 40 is not part of this script.

    python scripts/bench_fsdp_traffic.py [--widths 1.0 0.25] [--steps 2]
                                         [--out results/bench/fsdp_traffic.csv]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compressors import RANKS, run_ranks, write_csv  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--steps", type=int, default=2, help="steps per arm")
    parser.add_argument("--out", type=Path, default=Path("results/bench/fsdp_traffic.csv"))
    return parser.parse_args(argv)


def _counting_reduce_scatter():
    """FSDP's default reduce-scatter, counting the bytes of its input."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp._fully_shard._fsdp_api import ReduceScatter

    class Counting(ReduceScatter):
        sent = 0

        def allocate(self, size, *, dtype, device):
            return torch.empty(*size, dtype=dtype, device=device)

        def __call__(self, output_tensor, input_tensor, group, op, async_op=False):
            Counting.sent += input_tensor.numel() * input_tensor.element_size()
            return dist.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                              async_op=async_op)

    return Counting


def _worker(rank: int, port: int, args, queue) -> None:
    import torch
    import torch.distributed as dist

    from accordion_repro.comm.fsdp import fsdp_units
    from accordion_repro.ddp import Accordion
    from accordion_repro.engine.sharding import shard_model
    from accordion_repro.models import build_model

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    world = dist.get_world_size()
    gen = torch.Generator().manual_seed(rank)
    rows = []
    for width in args.widths:
        for powersgd_rank in (None, *RANKS):
            torch.manual_seed(0)
            model = shard_model(build_model("resnet18", num_classes=10, width=width),
                                torch.device("cpu"))
            if powersgd_rank is None:
                counting = _counting_reduce_scatter()
                for unit in fsdp_units(model):
                    unit.set_custom_reduce_scatter(counting())
            else:
                acc = Accordion(model, "powersgd", low=powersgd_rank, high=powersgd_rank)
                acc.set_levels([powersgd_rank] * len(acc.layer_names))
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            for _ in range(args.steps):
                x = torch.randn(8, 3, 32, 32, generator=gen)
                y = torch.randint(0, 10, (8,), generator=gen)
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                optimizer.step()
            if powersgd_rank is None:
                sent = fsdp = counting.sent
                uncompressed = None
            else:
                stats = acc.pop_stats()
                sent, fsdp = stats.bytes_sent, stats.fsdp_reduce_scatter_bytes
                uncompressed = stats.uncompressed_layers // args.steps
            rows.append({
                "model": "resnet18", "width": width, "world_size": world,
                "method": "fsdp" if powersgd_rank is None else "fsdp_accordion_powersgd",
                "powersgd_rank": powersgd_rank if powersgd_rank is not None else "",
                "bytes_per_rank_step": sent // args.steps,
                "fsdp_reduce_scatter_bytes_per_rank_step": fsdp // args.steps,
                "fewer_bytes_x": round(fsdp / sent, 1),
                "uncompressed_layers": "" if uncompressed is None else uncompressed,
                "error_memory_bytes_per_rank": (
                    "" if powersgd_rank is None else acc.state.reducer.memory_bytes()),
            })
            dist.barrier()
    if rank == 0:
        queue.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None) -> int:
    args = parse_args(argv)
    rows = run_ranks(_worker, args)
    for row in rows:
        print(row)
    write_csv(rows, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
