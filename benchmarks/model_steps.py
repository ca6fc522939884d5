"""Time one training step (forward, backward, SGD step) of every model on this machine's CPU.

One rank, no communication, batch 32 by default: the compute part of a step, which the
network cost model (accordion_repro.costmodel) adds communication to. Medians over
repeats after warm-up; writes results/bench/models.csv.

    python scripts/bench_models.py [--batch 32] [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from accordion_repro.models import MODEL_NAMES, build_model, count_parameters
from .harness import write_csv

WIKITEXT2_VOCAB = 33_278


def _step_fn(name: str, batch: int):
    if name == "lstm":
        model = build_model("lstm", vocab_size=WIKITEXT2_VOCAB)
        tokens = torch.randint(0, WIKITEXT2_VOCAB, (31, batch))

        def loss():
            logits, _ = model(tokens[:-1], model.init_hidden(batch))
            return F.cross_entropy(logits.reshape(-1, WIKITEXT2_VOCAB), tokens[1:].reshape(-1))
    else:
        model = build_model(name, num_classes=10)
        x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

        def loss():
            return F.cross_entropy(model(x), y)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        optimizer.step()
    return model, step


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--models", nargs="*", default=list(MODEL_NAMES))
    parser.add_argument("--out", default="results/bench/models.csv")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for name in args.models:
        model, step = _step_fn(name, args.batch)
        model.train()
        for _ in range(args.warmup):
            step()
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            step()
            times.append(time.perf_counter() - start)
        rows.append({"model": name, "params": count_parameters(model), "batch": args.batch,
                     "threads": args.threads, "median_s": statistics.median(times),
                     "min_s": min(times), "max_s": max(times), "repeats": args.repeats})
        r = rows[-1]
        print(f"{name:10s} {r['params']:>11,d} params  batch {args.batch}: median {r['median_s']:.3f} s/step "
              f"(min {r['min_s']:.3f}, max {r['max_s']:.3f}, {args.repeats} repeats, {args.threads} threads)",
              flush=True)
    write_csv(rows, Path(args.out))
