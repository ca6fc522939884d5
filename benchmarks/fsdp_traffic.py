"""Bytes per rank and step under FSDP2, plain FSDP against FSDP + Accordion's PowerSGD, and
(with --bandwidth) the whole step's time through a shaped link against its bound.

ResNet-18 for CIFAR-10 at each `--width`, sharded as the trainer shards it (dist.strategy=fsdp,
engine/sharding.py), 2 gloo ranks, batch 8 per rank, SGD with momentum, one thread per rank.
Arms: plain FSDP (its own reduce-scatter, counted by a pass-through custom reduce-scatter) and
Accordion(model, "powersgd") with every layer held at each `--ranks` (set_levels); all arms of a
width interleaved in every round (benchmarks/harness.py), so load hits them alike.

Bytes, two conventions:
- `bytes_per_rank_step`, `fsdp_reduce_scatter_bytes_per_rank_step`: what one rank hands to its
  gradient collectives (CommStats: a reduce-scatter's or all-reduce's input). FSDP's is its
  flat padded gradient; Accordion's the P and Q it all-reduces plus the dense reduce-scatter.
- `wire_bytes_per_rank_step` (link runs only): what the rank's veth really transmitted per step,
  everything included (FSDP2's parameter all-gathers, which nobody compresses, the reduction,
  TCP/IP headers and acknowledgements); the larger of the two ranks.

With `--bandwidth 100mbit` (root, iproute2, tc: the namespaces and shaping of
benchmarks/netbench, docs/network_bench.md) the script runs its ranks twice, as rank 0 and
rank 1 of one veth pair each time: unshaped (the step's compute, its memory-speed transfers
included) and shaped, whose raw gloo collectives are probed first. Bound of a row: compute_ms +
8 * wire_bytes_per_rank_step / bandwidth; a second bound at the rates gloo reached (gloo_link_ms);
and the time in FSDP2's parameter all-gathers, counted and timed by a pass-through all-gather.
Every column: docs/fsdp.md.

    python scripts/bench_fsdp_traffic.py [--widths 1.0 0.25] [--ranks 1 2 4] [--steps 5]
        [--warmup 1] [--bandwidth 100mbit] [--out results/bench/fsdp_traffic.csv]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from pathlib import Path

from accordion_repro.run_layout import PROJECT_ROOT as REPO

from . import harness
from .harness import env_rank, interleave, quantile_rows, run_ranks


NAME = "bench-fsdp-traffic"
BATCH = 8
FSDP = "fsdp"
ACCORDION = "fsdp_accordion_powersgd"
COLUMNS = (
    "model", "width", "world_size", "method", "powersgd_rank",
    "bytes_per_rank_step", "fsdp_reduce_scatter_bytes_per_rank_step", "fewer_bytes_x",
    "uncompressed_layers", "error_memory_bytes_per_rank",
    "allgather_bytes_per_rank_step", "allgathers_per_step",
    "link", "bandwidth_bps", "wire_bytes_per_rank_step", "fewer_wire_bytes_x",
    "step_median_ms", "step_p25_ms", "step_p75_ms", "steps_timed", "compute_ms",
    "link_ms", "bound_ms", "step_over_bound", "allreduce_rate", "allgather_rate",
    "gloo_bound_ms", "step_over_gloo_bound", "allgather_ms", "allgather_rate_in_step",
    "largest_allgather_bytes", "largest_allgather_rate", "step_less_allgather_ms",
    "compute_less_allgather_ms",
    "load_avg_1m_start", "load_avg_1m_end", "cpus",
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", type=float, nargs="+", default=[1.0, 0.25])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4],
                        help="PowerSGD ranks of the Accordion arms")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per arm")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per arm first")
    parser.add_argument("--bandwidth", default=None,
                        help="time the step through a link shaped to this rate, e.g. 100mbit "
                             "(needs root); without it, bytes only, on loopback")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per launch")
    parser.add_argument("--out", type=Path, default=REPO / "results" / "bench" / "fsdp_traffic.csv")
    parser.add_argument("--env", action="store_true",
                        help="be one rank of a torchrun-style launch; rank 0 writes --raw")
    parser.add_argument("--raw", type=Path, default=None, help="with --env: rank 0's JSON")
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error(f"--steps must be >= 2 (quartiles), got {args.steps}")
    if args.env and args.raw is None:
        parser.error("--env needs --raw")
    return args


def tx_bytes_from(proc_net_dev: str, device: str) -> int:
    """The transmitted bytes of `device` in /proc/net/dev's text (the 9th number after the
    colon: 8 receive counters come first)."""
    for line in proc_net_dev.splitlines():
        name, sep, counters = line.partition(":")
        if sep and name.strip() == device:
            return int(counters.split()[8])
    raise ValueError(f"no device {device!r} in /proc/net/dev")


def _tx_bytes(device: str | None) -> int:
    """This process's network namespace's transmit counter of `device` (0 without one)."""
    if device is None:
        return 0
    with open("/proc/self/net/dev") as f:
        return tx_bytes_from(f.read(), device)


def _counting_all_gather():
    """The all-gather shard_model gives FSDP (comm/fsdp.py SegmentedAllGather: the parameters,
    before a unit's forward and, resharded after it, again before its backward), counting its
    calls, the bytes of its input and the seconds until it completes. It is waited for at once
    (FSDP's later wait finds it done), which costs no overlap here: ResNet-18 is sharded into
    3 units (stem, body, classifier) and the body's all-gather, nearly all the bytes, is needed
    at once in the forward and prefetched in the backward only behind the classifier's (tiny)
    backward."""
    import time

    from accordion_repro.comm.fsdp import SegmentedAllGather

    class Counting(SegmentedAllGather):
        sent = calls = 0
        seconds = 0.0
        largest: list[float] = []  # seconds of each call of the largest size seen

        @classmethod
        def _note_largest(cls, nbytes: int, seconds: float) -> None:
            if nbytes > getattr(cls, "largest_bytes", 0):
                cls.largest_bytes, cls.largest = nbytes, []
            if nbytes == cls.largest_bytes:
                cls.largest.append(seconds)

        def __call__(self, output_tensor, input_tensor, group, async_op=False):
            Counting.sent += input_tensor.numel() * input_tensor.element_size()
            Counting.calls += 1
            start = time.perf_counter()
            work = super().__call__(output_tensor, input_tensor, group, async_op=async_op)
            if work is not None:
                work.wait()
            elapsed = time.perf_counter() - start
            Counting.seconds += elapsed
            Counting._note_largest(input_tensor.numel() * input_tensor.element_size(), elapsed)
            return work

    return Counting


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


class FsdpArm(harness.Arm):
    """One arm's sharded model, optimizer and fixed batch on this rank (harness.Arm); it counts
    its collectives' input bytes and its veth's transmitted bytes over the timed steps (after
    `warmup`)."""

    def __init__(self, width: float, powersgd_rank: int | None, *, rank: int, warmup: int):
        import torch

        from accordion_repro.comm.fsdp import fsdp_units
        from accordion_repro.ddp import Accordion
        from accordion_repro.engine.sharding import shard_model

        model = shard_model(harness.resnet18(width), torch.device("cpu"))
        self.powersgd_rank, self.acc, self.counting = powersgd_rank, None, None
        self.gathers = _counting_all_gather()
        for unit in fsdp_units(model):
            unit.set_custom_all_gather(self.gathers())
        if powersgd_rank is None:
            self.counting = _counting_reduce_scatter()
            for unit in fsdp_units(model):
                unit.set_custom_reduce_scatter(self.counting())
        else:
            self.acc = Accordion(model, "powersgd", low=powersgd_rank, high=powersgd_rank)
            self.acc.set_levels([powersgd_rank] * len(self.acc.layer_names))
        super().__init__(model, model.parameters(), batch=BATCH, seed=rank, warmup=warmup)
        self.device = os.environ.get("GLOO_SOCKET_IFNAME")
        self.wire, self.gather_s = 0, []

    # The veth counter is read after the next barrier too: once it returns, the peer has
    # received everything this rank sent in the step, so every byte of it has left the veth.
    def _started(self) -> None:
        self._tx, self._gathering = _tx_bytes(self.device), self.gathers.seconds

    def _stepped(self) -> None:
        import torch.distributed as dist

        dist.barrier()
        if self.steps > self.warmup:
            self.wire += _tx_bytes(self.device) - self._tx
            self.gather_s.append(self.gathers.seconds - self._gathering)
        elif self.steps == self.warmup:
            self._counters()  # forget the warm-up's collectives
            self.gathers.largest = []

    def _counters(self) -> tuple[int, int, int, int, int]:
        """(bytes sent, FSDP's reduce-scatter bytes, uncompressed layers, all-gather bytes and
        calls) since the last call."""
        gathered, calls = self.gathers.sent, self.gathers.calls
        self.gathers.sent = self.gathers.calls = 0
        if self.acc is None:
            sent, self.counting.sent = self.counting.sent, 0
            return sent, sent, 0, gathered, calls
        stats = self.acc.pop_stats()
        return (stats.bytes_sent, stats.fsdp_reduce_scatter_bytes, stats.uncompressed_layers,
                gathered, calls)

    def traffic(self) -> dict:
        """Per timed step: gradient-collective input bytes, FSDP's own reduce-scatter's, its
        parameter all-gathers' (input bytes, calls), veth bytes (this rank)."""
        timed = self.steps - self.warmup
        sent, fsdp, uncompressed, gathered, calls = self._counters()
        return {"bytes": sent // timed, "fsdp_bytes": fsdp // timed,
                "uncompressed_layers": uncompressed // timed,
                "allgather_bytes": gathered // timed, "allgathers": calls // timed,
                "wire_bytes": self.wire / timed, "allgather_s": self.gather_s,
                "largest_allgather": [self.gathers.largest_bytes, self.gathers.largest],
                "error_memory_bytes": self.acc.state.reducer.memory_bytes() if self.acc else None}


def arm_name(powersgd_rank: int | None) -> str:
    return FSDP if powersgd_rank is None else f"{ACCORDION} r{powersgd_rank}"


def measure(args, rank: int) -> dict:
    """Every width's arms, interleaved; this rank's record: width -> arm -> samples, traffic."""
    import torch
    import torch.distributed as dist

    record = {"world": dist.get_world_size(), "batch": BATCH, "steps": args.steps,
              "warmup": args.warmup, "widths": {}}
    for width in args.widths:
        arms = {arm_name(r): FsdpArm(width, r, rank=rank, warmup=args.warmup)
                for r in (None, *args.ranks)}
        samples, _ = interleave({n: (FsdpArm.step, a) for n, a in arms.items()},
                                args.warmup, args.steps)
        traffic = {n: a.traffic() for n, a in arms.items()}
        wire = torch.tensor([t["wire_bytes"] for t in traffic.values()], dtype=torch.float64)
        dist.all_reduce(wire, op=dist.ReduceOp.MAX)  # the busier direction bounds the step
        for t, w in zip(traffic.values(), wire.tolist()):
            t["wire_bytes"] = w
        record["widths"][f"{width:g}"] = {n: {"samples": samples[n], **traffic[n]} for n in arms}
        del arms
        dist.barrier()
    return record


def gloo_link_ms(wire_bytes: float, allgather_bytes: float, allgathers: int,
                 calibration) -> tuple[float, float, float]:
    """(ms, all-reduce rate, all-gather rate): the link's time for one step's wire bytes at
    the fractions of line rate gloo's collectives reached on it (benchmarks/netbench/bench.py's
    probes): the parameter all-gathers at the all-gather rate of their mean size, the rest
    (the gradient reduction, headers, retransmissions) at the all-reduce rate."""
    per_call = allgather_bytes / allgathers if allgathers else 0.0
    ar, ag = calibration.rate(calibration.bulk), calibration.allgather_rate(per_call)
    seconds = 8 * (allgather_bytes / ag + (wire_bytes - allgather_bytes) / ar)
    return 1e3 * seconds / calibration.bandwidth_bps, ar, ag


def _largest(largest: list, bandwidth_bps: float) -> dict:
    """The largest all-gather (one rank's input bytes, one unit's) and the median
    fraction of line rate its calls reached."""
    nbytes, seconds = largest
    return {"largest_allgather_bytes": nbytes, "largest_allgather_rate": round(
        8 * nbytes / statistics.median(seconds) / bandwidth_bps, 3)}


def _median_less(arm: dict) -> float:
    """The median step less its time in FSDP's all-gathers (ms)."""
    return 1e3 * statistics.median(t - g for t, g in zip(arm["samples"], arm["allgather_s"]))


def rows_from(record: dict, *, shaped: dict | None = None, compute: dict | None = None,
              link: str = "", bandwidth_bps: float | None = None, calibration=None,
              load: tuple[float, float] | None = None, cpus: int | None = None) -> list[dict]:
    """One row per width and arm. `record` gives the bytes; with a link, `shaped` (the same
    launch's record through the shaped link, usually `record` itself) gives the step and the
    wire bytes, `compute` (the unshaped launch's) the compute, and the bound is
    compute_ms + 8 * wire_bytes / bandwidth_bps; with the link's `calibration` (a
    LinkCalibration) also the bound at the rates gloo reached on it (gloo_link_ms)."""
    rows = []
    for width, arms in record["widths"].items():
        fsdp_wire = shaped["widths"][width][FSDP]["wire_bytes"] if shaped else None
        for name, arm in arms.items():
            powersgd_rank = None if name == FSDP else int(name.rsplit(" r", 1)[1])
            row = {"model": "resnet18", "width": float(width), "world_size": record["world"],
                   "method": FSDP if powersgd_rank is None else ACCORDION,
                   "powersgd_rank": powersgd_rank, "bytes_per_rank_step": arm["bytes"],
                   "fsdp_reduce_scatter_bytes_per_rank_step": arm["fsdp_bytes"],
                   "fewer_bytes_x": round(arm["fsdp_bytes"] / arm["bytes"], 1),
                   "uncompressed_layers": None if powersgd_rank is None else arm["uncompressed_layers"],
                   "error_memory_bytes_per_rank": arm["error_memory_bytes"],
                   "allgather_bytes_per_rank_step": arm["allgather_bytes"],
                   "allgathers_per_step": arm["allgathers"]}
            if shaped is not None:
                timed = shaped["widths"][width][name]
                q = quantile_rows({name: timed["samples"]})[0]
                compute_ms = 1e3 * statistics.median(compute["widths"][width][name]["samples"])
                link_ms = 1e3 * 8 * timed["wire_bytes"] / bandwidth_bps
                bound = compute_ms + link_ms
                row.update({
                    "link": link, "bandwidth_bps": bandwidth_bps,
                    "wire_bytes_per_rank_step": round(timed["wire_bytes"]),
                    "fewer_wire_bytes_x": round(fsdp_wire / timed["wire_bytes"], 2),
                    "step_median_ms": round(q["median_ms"], 1), "step_p25_ms": round(q["p25_ms"], 1),
                    "step_p75_ms": round(q["p75_ms"], 1), "steps_timed": q["n"],
                    "compute_ms": round(compute_ms, 1), "link_ms": round(link_ms, 1),
                    "bound_ms": round(bound, 1), "step_over_bound": round(q["median_ms"] / bound, 3),
                    "load_avg_1m_start": load[0], "load_avg_1m_end": load[1], "cpus": cpus})
                unshaped = compute["widths"][width][name]
                gather_ms = 1e3 * statistics.median(timed["allgather_s"])
                row.update({
                    "allgather_ms": round(gather_ms, 1),
                    "allgather_rate_in_step": round(
                        8e3 * timed["allgather_bytes"] / gather_ms / bandwidth_bps, 3),
                    **_largest(timed["largest_allgather"], bandwidth_bps),
                    "step_less_allgather_ms": round(_median_less(timed), 1),
                    "compute_less_allgather_ms": round(_median_less(unshaped), 1)})
                if calibration is not None:
                    gloo_ms, ar, ag = gloo_link_ms(timed["wire_bytes"], timed["allgather_bytes"],
                                                   timed["allgathers"], calibration)
                    row.update({"allreduce_rate": round(ar, 3), "allgather_rate": round(ag, 3),
                                "gloo_bound_ms": round(compute_ms + gloo_ms, 1),
                                "step_over_gloo_bound": round(q["median_ms"] / (compute_ms + gloo_ms), 3)})
            rows.append(row)
    return rows


def _write(rows: list[dict], out: Path) -> None:
    from accordion_repro.utils import atomic_write_text
    from .netbench.report import csv_text

    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, csv_text(rows, COLUMNS))
    print(f"wrote {out}")


def _rank_argv(args, raw: Path) -> list[str]:
    from .netbench.ranks import python_argv

    return python_argv(f"{__package__}.fsdp_traffic", "--env", "--raw", str(raw),
                       "--widths", *(f"{w:g}" for w in args.widths),
                       "--ranks", *map(str, args.ranks),
                       "--steps", str(args.steps), "--warmup", str(args.warmup))


def measure_link(args, link, work: Path):
    """(unshaped record, shaped record, the shaped link's LinkCalibration): the same arms
    launched twice as rank 0 and rank 1 of a veth pair, first unshaped, then shaped to `link`,
    whose raw gloo collectives are probed first (benchmarks/netbench/bench.py)."""
    from .netbench.bench import calibrate, link_calibration, link_pair
    from .netbench.ranks import run_two_ranks

    records, calibration = {}, None
    for name, spec in (("unshaped", None), ("shaped", link)):
        pair, shaping = link_pair(spec, "fsdp")
        try:
            if shaping is not None:
                print(f"{NAME}: probing the link ...", flush=True)
                probes = calibrate(pair, work / "calibration")
                (work / "calibration.json").write_text(json.dumps(probes))
                calibration = link_calibration(shaping, probes)
            raw = work / name / "raw.json"
            print(f"{NAME}: {name} ...", flush=True)
            run_two_ranks(pair, _rank_argv(args, raw), log_dir=raw.parent, timeout_s=args.timeout)
            records[name] = json.loads(raw.read_text())
        finally:
            pair.teardown()
    return records["unshaped"], records["shaped"], calibration


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.env:
        return env_rank(measure, args, args.raw)
    if args.bandwidth is None:
        _write(rows_from(run_ranks(measure, args)), args.out)
        return 0
    from accordion_repro.errors import ConfigError
    from .netbench.netns import (LinkSpec, cleanup_leftovers, missing_requirement,
                                           parse_bandwidth, teardown_on_signals)
    from .netbench.ranks import run_reported

    reason = missing_requirement()
    if reason:
        print(f"{NAME}: {reason}", file=sys.stderr)
        return 2
    try:
        link = LinkSpec(parse_bandwidth(args.bandwidth, key="bandwidth"))
    except ConfigError as err:
        print(f"{NAME}: {err}", file=sys.stderr)
        return 2
    cleanup_leftovers()
    work = args.out.resolve().parent / "tmp" / args.out.stem
    command = " ".join(["python scripts/bench_fsdp_traffic.py", *map(shlex.quote, argv)])

    def run() -> list[dict]:
        start = os.getloadavg()[0]
        with teardown_on_signals():
            unshaped, shaped, calibration = measure_link(args, link, work)
        load = (round(start, 2), round(os.getloadavg()[0], 2))
        (work / "command.txt").write_text(command + "\n")
        return rows_from(shaped, shaped=shaped, compute=unshaped, link=calibration.label,
                         bandwidth_bps=link.bandwidth_bps, calibration=calibration, load=load,
                         cpus=os.cpu_count())

    code, rows = run_reported(NAME, run)
    if rows:
        for row in rows:
            print({k: row[k] for k in ("width", "method", "powersgd_rank", "bytes_per_rank_step",
                                       "wire_bytes_per_rank_step", "step_median_ms",
                                       "compute_ms", "bound_ms", "step_over_bound",
                                       "gloo_bound_ms", "step_over_gloo_bound", "allgather_ms",
                                       "allgather_rate_in_step", "largest_allgather_rate",
                                       "step_less_allgather_ms",
                                       "compute_less_allgather_ms")})
        _write(rows, args.out)
    return code


if __name__ == "__main__":
    sys.exit(main())
