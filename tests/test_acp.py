"""ACP-SGD (comm/acp.py) against its published algorithm: at full rank the compressed path is
dense averaging (2 real gloo ranks), and it sends half of PowerSGD's floats per step. Each
property is checked once on the real reducer and once on a deliberately broken variant, which
the same check must reject."""

from __future__ import annotations

import functools

import pytest
import torch

from accordion_repro.comm import acp, build_reducer
from accordion_repro.comm.acp import ACPPowerSGDReducer
from test_comm_distributed import dense_average, local_grads, run_workers

# Square layers (8x8, a conv viewed as 6x6) and a bias: at rank n = m both factors are square,
# so every turn, P's and Q's, must give back M exactly.
SQUARE = [(8, 8), (6, 2, 1, 3), (5,)]
FULL = [8, 6]
STEPS = 4


class FullRankACP(ACPPowerSGDReducer):
    """The reducer with its dense shortcut off: a rank >= min(n, m) still takes the compressed
    path, which is the one whose algebra is under test."""

    def _sends_dense(self, layer, level):
        return False


def _full_rank_worker(rank, mutate):
    if mutate:  # the broken variant: the kept factor is used without orthonormalising it
        acp.orthonormalize_ = lambda batch: batch
    reducer = FullRankACP(local_grads(rank, shapes=SQUARE), rank=1, error_feedback=True, seed=3)
    outputs = []
    for step in range(STEPS):
        grads = local_grads(rank, seed=step, shapes=SQUARE)
        reducer.reduce(grads, FULL)
        outputs.append(grads)
    return outputs


def _full_rank_worker_real(rank):
    return _full_rank_worker(rank, mutate=False)


def _full_rank_worker_broken(rank):
    return _full_rank_worker(rank, mutate=True)


def check_full_rank_is_dense_averaging(results):
    """Every step, both turns, on both ranks: the dense average of the two ranks' gradients."""
    for rank_outputs in results:
        for step, grads in enumerate(rank_outputs):
            for got, want in zip(grads, dense_average(seed=step, shapes=SQUARE)):
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
def test_acp_at_full_rank_equals_dense_averaging_on_two_gloo_ranks(tmp_path):
    for name in ("real", "broken"):
        (tmp_path / name).mkdir()
    check_full_rank_is_dense_averaging(run_workers(_full_rank_worker_real, tmp_path / "real"))
    with pytest.raises(AssertionError):
        check_full_rank_is_dense_averaging(run_workers(_full_rank_worker_broken,
                                                       tmp_path / "broken"))


# ---- floats: half of PowerSGD's per step ------------------------------------------------------
RECT = [(16, 3, 3, 3), (10, 40), (32, 6)]  # n != m, so the two turns send different amounts


class CountsBothFactors(ACPPowerSGDReducer):
    """Broken: books (n + m) * r per step, as if it sent PowerSGD's P and Q."""

    def _compressed_floats(self, layer, level):
        return sum(self.matrix_shapes[layer]) * level


def _sent_per_step(name: str, steps: int, reducer=None, **options) -> list[tuple[int, int]]:
    """(floats counted, floats really packed into collectives) of each step."""
    params = [torch.zeros(s) for s in RECT]
    reducer = reducer(params, rank=2, error_feedback=True, seed=1) if reducer else \
        build_reducer(name, params, rank=2, **options)
    packed = []
    original = reducer.comm.all_reduce_sum

    def counting(buffer, stats):
        packed.append(buffer.numel())
        return original(buffer, stats)

    reducer.comm.all_reduce_sum = counting
    per_step = []
    for step in range(steps):
        before = len(packed)
        stats = reducer.reduce(local_grads(0, seed=step, shapes=RECT))
        per_step.append((stats.floats_sent, sum(packed[before:])))
    return per_step


def check_half_of_powersgd(acp_steps, powersgd_steps):
    """Over every two consecutive steps ACP sends what PowerSGD sends in one (P + Q); ACP packs
    what it counts, PowerSGD pads each of RECT's 3 P and 3 Q blocks to 64 bytes (16 floats,
    comm/powersgd.py PACKING); ACP's mean per step is half of PowerSGD's."""
    for floats, packed in acp_steps:
        assert floats == packed
    for floats, packed in powersgd_steps:
        assert 0 <= packed - floats < 16 * 2 * len(RECT)
    for first in range(0, len(acp_steps), 2):
        pair = acp_steps[first][0] + acp_steps[first + 1][0]
        assert pair == powersgd_steps[first // 2][0]
    mean = sum(f for f, _ in acp_steps) / len(acp_steps)
    assert mean == powersgd_steps[0][0] / 2


def test_acp_float_count_is_half_of_powersgds_per_step():
    powersgd = _sent_per_step("powersgd", 2, seed=1)
    acp_steps = _sent_per_step("acp_powersgd", 4, seed=1)
    want = [sum(n * 2 for n in (16, 10, 32)), sum(m * 2 for m in (27, 40, 6))] * 2
    assert [f for f, _ in acp_steps] == want  # P's on even steps, Q's on odd ones
    check_half_of_powersgd(acp_steps, powersgd)
    with pytest.raises(AssertionError):
        check_half_of_powersgd(_sent_per_step("", 4, reducer=CountsBothFactors), powersgd)


def test_acp_resumes_bit_for_bit_and_its_outputs_are_finite():
    shapes = [(16, 3, 3, 3), (16,), (10, 40)]
    first = build_reducer("acp_powersgd", [torch.zeros(s) for s in shapes], rank=2, seed=5)
    for step in range(3):
        first.reduce(local_grads(0, seed=step, shapes=shapes), [2, 1] if step == 2 else None)
    state = first.state_dict()
    second = build_reducer("acp_powersgd", [torch.zeros(s) for s in shapes], rank=2, seed=5)
    second.load_state_dict(state)
    for step in range(3, 6):
        a, b = local_grads(0, seed=step, shapes=shapes), local_grads(0, seed=step, shapes=shapes)
        first.reduce(a)
        second.reduce(b)
        assert all(torch.equal(x, y) and torch.isfinite(x).all() for x, y in zip(a, b))


def test_acp_level_change_restarts_the_layer_with_a_p_turn():
    reducer = build_reducer("acp_powersgd", [torch.zeros(10, 40)], rank=2, seed=0)
    reducer.reduce(local_grads(0, shapes=[(10, 40)]))
    assert reducer.turn == [acp.Q_TURN] and reducer.floats_per_step() == 40 * 2
    reducer.set_levels([1])
    assert reducer.turn == [acp.P_TURN] and reducer.floats_per_step([1]) == 10 * 1
    assert reducer.memory[0] is not None  # the error memory is kept across the change


# ---- below full rank the error memory is the local factor's residual (issue 59) -------------------
RECT_LOW = [(10, 40), (16, 3, 3, 3)]


def _local_memory_worker(rank, averaged_memory):
    """One P turn then one Q turn at rank 2 (below both layers' full rank). Returns, per step,
    each layer's memory after the step, the M it was made from, the local residual
    M - P_local Q^T recomputed here from the kept factor, and the averaged output P Q^T."""
    reducer = ACPPowerSGDReducer(local_grads(rank, shapes=RECT_LOW), rank=2, error_feedback=True,
                                 seed=7)
    if averaged_memory:  # the defect: memory from the all-reduced factor (M - avg P Q^T)
        original = reducer._compressed_steps

        def averaged(items, stats, carried=()):
            matrices = {layer: reducer._memory(layer).clone() + g.view(reducer.matrix_shapes[layer])
                        for layer, g in items}
            yield from original(items, stats, carried)
            for layer, g in items:
                reducer.memory[layer].copy_(matrices[layer] - g.view(reducer.matrix_shapes[layer]))
        reducer._compressed_steps = averaged
    steps = []
    for step in range(2):
        grads = local_grads(rank, seed=10 + step, shapes=RECT_LOW)
        before = [reducer._memory(layer).clone() for layer in range(2)]
        kept = [None if k is None else k.clone() for k in reducer.kept]
        turns = list(reducer.turn)
        local = []
        for layer in range(2):
            m = before[layer] + grads[layer].view(reducer.matrix_shapes[layer])
            factor = kept[layer] if kept[layer] is not None else reducer._fresh_q(layer, 2)
            if kept[layer] is None:
                reducer.draws[layer] -= 1  # the reducer draws this same Q itself
            q, _ = torch.linalg.qr(factor.t(), mode="reduced")  # the kept factor, orthonormal
            if turns[layer] == acp.P_TURN:
                local.append(m - (m @ q) @ q.t())  # M - P Q^T with P = M Q
            else:
                local.append(m - q @ (q.t() @ m))  # M - P Q^T with Q = M^T P
        reducer.reduce(grads)
        steps.append({"memory": [reducer.memory[layer].clone() for layer in range(2)],
                      "local": local, "output": [g.clone() for g in grads]})
    return steps


@pytest.mark.parametrize("averaged_memory", [False, True], ids=["released", "averaged_factor"])
def test_below_full_rank_the_memory_is_the_local_factors_residual(tmp_path, averaged_memory):
    """At rank 2 on a 10x40 and a 16x27 layer, on 2 ranks with different gradients: after a P
    turn and a Q turn each rank's memory is its own M - P_local Q^T, as the released code
    computes it, not M - (average P) Q^T (indistinguishable at full rank, where both are 0).
    The averaged-factor variant must fail the same check."""
    results = run_workers(functools.partial(_local_memory_worker,
                                            averaged_memory=averaged_memory), tmp_path)
    agree = all(torch.allclose(got, want, atol=1e-5)
                for steps in results for step in steps
                for got, want in zip(step["memory"], step["local"]))
    assert agree != averaged_memory
