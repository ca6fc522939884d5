"""Predict training time on a network we did not measure on.

The paper's speedups depend on the cluster's bandwidth, which the released material does not
state. A run measures its compute time per step and logs exactly what it handed to its
collectives, so a latency-bandwidth (alpha-beta) model turns those into an epoch time on any
named network and worker count. Formulas and assumptions are in docs/analysis.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from accordion_repro.errors import ConfigError

ALLREDUCE = "allreduce"
ALLGATHER = "allgather"
OPS = (ALLREDUCE, ALLGATHER)


@dataclass(frozen=True)
class Network:
    """A link: bandwidth in bits per second (so 10 Gbit/s is 10e9) and per-message latency.

    `allreduce_rate` and `allgather_rate` are the fractions of the line rate the backend's
    collectives reach on it (1.0: an ideal ring). gloo's all-gather reaches ~0.6 of a shaped
    100 Mbit/s or 1 Gbit/s link where its all-reduce reaches ~0.92 (docs/network_bench.md), so
    a model that means to predict gloo measures them once per link.
    """

    bandwidth_bps: float
    latency_s: float
    allreduce_rate: float = 1.0
    allgather_rate: float = 1.0

    def __post_init__(self):
        if not self.bandwidth_bps > 0:
            raise ValueError(f"bandwidth_bps must be positive, got {self.bandwidth_bps}")
        if self.latency_s < 0:
            raise ValueError(f"latency_s must be >= 0, got {self.latency_s}")
        for name in ("allreduce_rate", "allgather_rate"):
            if not 0 < getattr(self, name) <= 1.5:
                raise ValueError(f"{name} must be in (0, 1.5], got {getattr(self, name)}")

    def seconds_for_bytes(self, nbytes: float) -> float:
        return 8.0 * nbytes / self.bandwidth_bps


# Latencies: typical one-way MPI/NCCL small-message latency of TCP Ethernet (1 and 10 Gbit/s)
# and of RDMA-class 25/100 Gbit/s fabrics.
NETWORKS: dict[str, Network] = {
    "1gbit": Network(bandwidth_bps=1e9, latency_s=50e-6),
    "10gbit": Network(bandwidth_bps=10e9, latency_s=50e-6),
    "25gbit": Network(bandwidth_bps=25e9, latency_s=10e-6),
    "100gbit": Network(bandwidth_bps=100e9, latency_s=10e-6),
}


def resolve_network(net: str | Network) -> Network:
    if isinstance(net, Network):
        return net
    if net not in NETWORKS:
        raise ConfigError("net", f"unknown network {net!r}; choose one of {sorted(NETWORKS)}")
    return NETWORKS[net]


def allreduce_time(nbytes: float, workers: int, net: str | Network, collectives: float = 1.0) -> float:
    """Ring all-reduce of `nbytes` in total, split over `collectives` calls, on `workers` ranks:
    collectives * 2(p-1) * latency + 2 (p-1)/p * nbytes / bandwidth."""
    network = resolve_network(net)
    p = check_workers(workers)
    return collectives * 2 * (p - 1) * network.latency_s \
        + 2 * (p - 1) / p * network.seconds_for_bytes(nbytes) / network.allreduce_rate


def allgather_time(nbytes_per_worker: float, workers: int, net: str | Network,
                   collectives: float = 1.0) -> float:
    """Ring all-gather where every rank contributes `nbytes_per_worker` (the result holds
    p * nbytes_per_worker): collectives * (p-1) * latency + (p-1)/p * p * n / bandwidth."""
    network = resolve_network(net)
    p = check_workers(workers)
    return collectives * (p - 1) * network.latency_s \
        + (p - 1) / p * network.seconds_for_bytes(p * nbytes_per_worker) / network.allgather_rate


def step_comm_time(bytes_sent: float, collectives: float, allgather_bytes: float,
                   allgathers: float, net: str | Network, workers: int) -> float:
    """One step's communication from what a worker handed to its collectives (the trainer's
    per-epoch `bytes_sent`, `collectives`, `allgather_bytes_sent` and `allgathers`, divided by
    its steps): the all-gathers as a ring all-gather, the rest as a ring all-reduce."""
    return (allreduce_time(bytes_sent - allgather_bytes, workers, net, collectives - allgathers)
            + allgather_time(allgather_bytes, workers, net, allgathers))


@dataclass(frozen=True)
class StepExchange:
    """One step's gradient exchange split the way a per-layer choice of levels needs it:
    `fixed_seconds()`, the latency of the step's collectives (the same whatever the levels),
    plus `layer_seconds(floats, op)` per layer, its bandwidth time. Under the alpha-beta model
    the parts add up to step_comm_time of the whole step, so a plan's predicted time is
    additive over layers (schedule=auto's step-time budget, accordion/auto.py).

    `floats` are in the reducers' convention (comm/base.py floats_per_step): elements a layer
    adds to an all-reduce, or for an all-gather the total over the workers (Top-K's 2 k p), of
    `bytes_per_float` each.
    """

    network: Network
    workers: int
    collectives: int
    allgathers: int = 0
    bytes_per_float: int = 4

    def fixed_seconds(self) -> float:
        return step_comm_time(0.0, self.collectives, 0.0, self.allgathers, self.network,
                              self.workers)

    def layer_seconds(self, floats: float, op: str) -> float:
        nbytes = self.bytes_per_float * floats
        if op == ALLGATHER:
            return allgather_time(nbytes / self.workers, self.workers, self.network, 0)
        if op == ALLREDUCE:
            return allreduce_time(nbytes, self.workers, self.network, 0)
        raise ValueError(f"op must be one of {OPS}, got {op!r}")


def predict_epoch_time(compute_s_per_step: float, steps: int, bytes_per_step: float,
                       collectives_per_step: float, op: str, net: str | Network,
                       workers: int) -> float:
    """Epoch time with communication not overlapped with compute (the reducers run after
    backward, as in the official code): steps * (compute + communication per step)."""
    collective = {ALLREDUCE: allreduce_time, ALLGATHER: allgather_time}.get(op)
    if collective is None:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    return steps * (compute_s_per_step + collective(bytes_per_step, workers, net, collectives_per_step))


def check_workers(workers: int) -> int:
    if int(workers) != workers or workers < 1:
        raise ConfigError("workers", f"must be a positive integer, got {workers!r}")
    return int(workers)
