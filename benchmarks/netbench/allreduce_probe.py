"""One shaped gloo all-reduce, timed: the check that the link delivers the bandwidth it claims.

Run as a module inside each namespace (rank from the environment); rank 0 writes a JSON file.
With two workers gloo's ring all-reduce sends every rank's whole buffer once across the link
(half in the reduce-scatter, half in the all-gather), so the expected time is size / bandwidth.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from .netns import NamespacePair
from .ranks import python_argv, run_two_ranks


@dataclass(frozen=True)
class AllreduceMeasurement:
    numel: int
    bytes: int
    times_s: list[float]

    @property
    def median_s(self) -> float:
        return statistics.median(self.times_s)

    @property
    def mean_s(self) -> float:
        return statistics.fmean(self.times_s)


def measure_shaped_allreduce(pair: NamespacePair, *, numel: int, repeats: int, work_dir: Path,
                             timeout_s: float = 60.0, op: str = "allreduce"
                             ) -> AllreduceMeasurement:
    """Start the probe in both namespaces of an already created (and shaped) pair.

    op="allgather" times an all-gather where each rank contributes `numel` floats, issued as the
    Top-K reducer issues it (Communicator.all_gather); each rank then also sends its whole
    buffer once across the link.
    """
    out = Path(work_dir) / f"{op}.json"
    argv = python_argv(f"{__package__}.allreduce_probe", "--numel", str(numel),
                       "--repeats", str(repeats), "--out", str(out), "--op", op)
    run_two_ranks(pair, argv, log_dir=Path(work_dir), timeout_s=timeout_s)
    return AllreduceMeasurement(**json.loads(out.read_text()))  # numel, bytes, times_s


def _probe(numel: int, repeats: int, out: Path, op: str) -> None:
    import torch
    import torch.distributed as dist

    from accordion_repro.comm.collectives import Communicator
    from accordion_repro.comm.stats import CommStats

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    try:
        buffer = torch.ones(numel, dtype=torch.float32)
        communicator = Communicator()

        def collective():
            if op == "allgather":  # as the Top-K reducer issues it (in segments on gloo)
                communicator.all_gather(buffer, CommStats())
            else:
                dist.all_reduce(buffer)

        collective()  # warm-up: connections and TCP windows open before timing
        times = []
        for _ in range(repeats):
            dist.barrier()
            start = time.perf_counter()
            collective()
            times.append(time.perf_counter() - start)
        if dist.get_rank() == 0:
            out.write_text(json.dumps({"numel": numel, "bytes": numel * buffer.element_size(),
                                       "times_s": times}))
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--numel", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--op", choices=("allreduce", "allgather"), default="allreduce")
    _probe(**vars(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
