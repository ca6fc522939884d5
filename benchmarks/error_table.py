"""What one check of `schedule=auto` (or L-GreCo) costs rank 0: the error table of every layer.

The table is one `svdvals` per layer (PowerSGD ranks) or one `topk` of the squared entries
(Top-K fractions); the SVDs dominate, the widest layers most. Each configuration fills the
model's layer shapes with `torch.randn` and times the whole table (median of `--repeats`
interleaved rounds after one warm-up round), beside the SVD of the same matrices as given, the way
`lgreco.rank_errors` took it before it decomposed a wide matrix as its tall transpose
(-> results/bench/error_table.csv).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from accordion_repro.accordion.candidates import FractionCandidates, RankCandidates
from accordion_repro.models.factory import build_model
from accordion_repro.run_layout import PROJECT_ROOT as REPO

from .harness import write_csv



def layer_matrices(model_name: str, width: float, seed: int = 0) -> list[torch.Tensor]:
    """The model's compressible layers as (out, rest) matrices of standard normal entries."""
    model = build_model(model_name, num_classes=10, width=width)
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn((p.shape[0], p[0].numel()), generator=gen)
            for p in model.parameters() if p.dim() > 1]


def interleaved_seconds(works: dict, repeats: int) -> dict[str, float]:
    """Median wall seconds of each `works` entry over `repeats` rounds that time every entry in
    turn (after one untimed round), so a change of the machine's load reaches all alike."""
    times: dict[str, list[float]] = {name: [] for name in works}
    for round_ in range(repeats + 1):
        for name, work in works.items():
            start = time.perf_counter()
            work()
            if round_:
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--width", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--max-rank", type=int, default=16)
    parser.add_argument("--world-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench" / "error_table.csv")
    args = parser.parse_args(argv)
    ranks = RankCandidates("powersgd", args.max_rank)
    fractions = FractionCandidates("topk", args.world_size, 0.001)
    rows = []
    for width in args.width:
        mats = layer_matrices(args.model, width)
        timed = {
            "powersgd ranks table": lambda: [ranks.errors(m, ranks.levels) for m in mats],
            "svdvals as given (before)": lambda: [torch.linalg.svdvals(m.to(torch.float64))
                                                  for m in mats],
            "topk fractions table": lambda: [fractions.errors(m, fractions.levels) for m in mats],
        }
        for name, median in interleaved_seconds(timed, args.repeats).items():
            rows.append({"model": args.model, "width": width, "layers": len(mats), "table": name,
                         "median_s": round(median, 3),
                         "repeats": args.repeats, "threads": torch.get_num_threads(),
                         "load_avg_1m": round(os.getloadavg()[0], 2), "cpus": os.cpu_count()})
            print(rows[-1])
    write_csv(rows, args.out)
