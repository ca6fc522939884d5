"""The network cost model against hand-computed alpha-beta cases."""

import pytest

from accordion_repro.costmodel import (ALLGATHER, ALLREDUCE, NETWORKS, Network,
                                                allgather_time, allreduce_time,
                                                predict_epoch_time)
from accordion_repro.errors import ConfigError


def test_named_networks_have_documented_bandwidth_and_latency():
    assert NETWORKS["1gbit"] == Network(1e9, 50e-6)
    assert NETWORKS["10gbit"] == Network(10e9, 50e-6)
    assert NETWORKS["25gbit"] == Network(25e9, 10e-6)
    assert NETWORKS["100gbit"] == Network(100e9, 10e-6)


def test_ring_allreduce_by_hand():
    # 1 MB on 4 workers over 10 Gbit/s, 50 us: 2*3*50us + 2*(3/4)*8e6 bit / 1e10 bit/s
    assert allreduce_time(1e6, 4, "10gbit") == pytest.approx(3e-4 + 1.2e-3, rel=1e-12)
    # three collectives pay the latency three times, the bandwidth term once
    assert allreduce_time(1e6, 4, "10gbit", collectives=3) == pytest.approx(9e-4 + 1.2e-3)


def test_allgather_by_hand():
    # each of 4 workers contributes 1 MB over 1 Gbit/s: 3*50us + (3/4)*(4*8e6 bit)/1e9 bit/s
    assert allgather_time(1e6, 4, "1gbit") == pytest.approx(1.5e-4 + 0.024, rel=1e-12)


def test_custom_network_and_two_workers():
    link = Network(bandwidth_bps=8e9, latency_s=1e-3)   # 1 GB/s
    assert allreduce_time(2e9, 2, link) == pytest.approx(2 * 1e-3 + 2 * 0.5 * 2.0)
    assert allgather_time(2e9, 2, link) == pytest.approx(1e-3 + 0.5 * 4.0)


def test_predict_epoch_time_by_hand():
    # 10 steps of 0.1 s compute, 1 MB in 2 all-reduces per step, 4 workers on 10 Gbit/s
    expected = 10 * (0.1 + 2 * 3e-4 + 1.2e-3)
    got = predict_epoch_time(compute_s_per_step=0.1, steps=10, bytes_per_step=1e6,
                             collectives_per_step=2, op=ALLREDUCE, net="10gbit", workers=4)
    assert got == pytest.approx(expected, rel=1e-12)
    gathered = predict_epoch_time(0.1, 10, 1e6, 2, ALLGATHER, NETWORKS["10gbit"], 4)
    assert gathered == pytest.approx(10 * (0.1 + 2 * 3 * 50e-6 + 3 * 8e6 / 1e10))


def test_one_worker_costs_only_compute():
    assert predict_epoch_time(0.25, 8, 1e9, 5, ALLREDUCE, "1gbit", 1) == pytest.approx(2.0)


def test_more_bandwidth_is_never_slower():
    times = [predict_epoch_time(0.01, 100, 5e6, 3, ALLREDUCE, name, 8)
             for name in ("1gbit", "10gbit", "25gbit", "100gbit")]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


def test_each_compressor_names_how_its_bytes_travel():
    from accordion_repro.comm.registry import compressor

    assert compressor("topk").WIRE_OP == ALLGATHER
    assert [compressor(n).WIRE_OP for n in ("powersgd", "acp_powersgd", "none")] == [ALLREDUCE] * 3


def test_bad_inputs_name_the_problem():
    with pytest.raises(ConfigError, match="net"):
        allreduce_time(1.0, 2, "56k")
    with pytest.raises(ConfigError, match="workers"):
        allreduce_time(1.0, 0, "1gbit")
    with pytest.raises(ValueError, match="op"):
        predict_epoch_time(0.1, 1, 1.0, 1, "broadcast", "1gbit", 2)
    with pytest.raises(ValueError, match="bandwidth"):
        Network(0.0, 1e-6)


def test_a_step_exchange_adds_up_to_the_whole_steps_time():
    """StepExchange splits step_comm_time into a fixed latency and per-layer bandwidth times
    (schedule=auto prices each layer's candidates with it): the parts add up to the whole."""
    from accordion_repro.costmodel import StepExchange, step_comm_time

    link = Network(bandwidth_bps=1e9, latency_s=2e-4)
    exchange = StepExchange(link, workers=4, collectives=2, allgathers=1)
    gathered, reduced = [1200, 800], [5000, 300]  # floats, Top-K's counted over the 4 workers
    parts = exchange.fixed_seconds() + sum(exchange.layer_seconds(f, ALLGATHER) for f in gathered) \
        + sum(exchange.layer_seconds(f, ALLREDUCE) for f in reduced)
    allgather_bytes = 4 * sum(gathered) / 4
    whole = step_comm_time(allgather_bytes + 4 * sum(reduced), 2, allgather_bytes, 1, link, 4)
    assert parts == pytest.approx(whole, rel=1e-12)
    with pytest.raises(ValueError, match="op"):
        exchange.layer_seconds(1, "broadcast")
