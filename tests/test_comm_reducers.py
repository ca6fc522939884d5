"""Single-process behaviour of the reducers (one worker: same compression path, no collectives)."""

import io

import pytest
import torch

from accordion_repro.comm import build_reducer
from accordion_repro.comm.topk import topk_indices

torch.set_num_threads(1)


def shapes_params(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen) for s in shapes]


SHAPES = [(6, 4, 3, 3), (6,), (10, 12), (3,), (16, 8)]


def test_rank_that_cannot_compress_sends_dense_and_reproduces_the_gradient():
    grads = shapes_params(*SHAPES)
    reducer = build_reducer("powersgd", grads, rank=2)
    levels = [6, 10, 8]  # = min(n, m) of each layer
    out = [g.clone() for g in grads]
    stats = reducer.reduce(out, levels)
    assert all(torch.equal(a, b) for a, b in zip(out, grads))
    assert stats.floats_sent == sum(g.numel() for g in grads) == reducer.floats_per_step(levels)


def test_low_rank_gradient_is_reproduced_by_a_rank_that_covers_it():
    gen = torch.Generator().manual_seed(1)
    low_rank = torch.randn(20, 2, generator=gen) @ torch.randn(2, 30, generator=gen)
    reducer = build_reducer("powersgd", [low_rank], rank=2, error_feedback=False)
    out = [low_rank.clone()]
    reducer.reduce(out)
    torch.testing.assert_close(out[0], low_rank, rtol=1e-5, atol=1e-5)


def test_error_feedback_running_sums_track_and_memory_stays_bounded():
    grads = shapes_params(*SHAPES, seed=2)
    reducer = build_reducer("powersgd", grads, rank=1)
    sent = [torch.zeros_like(g) for g in grads]
    memory_norms = []
    for step in range(1, 61):
        out = [g.clone() for g in grads]
        reducer.reduce(out)
        for s, o in zip(sent, out):
            s.add_(o)
        memory_norms.append(sum(m.norm() ** 2 for m in reducer.memory).sqrt().item())
    for layer, index in enumerate(reducer.tensor_of_layer):
        # sum of outputs = sum of inputs - what is still in memory (error feedback identity)
        expected = 60 * grads[index] - reducer.memory[layer].view_as(grads[index])
        torch.testing.assert_close(sent[index], expected, rtol=1e-4, atol=1e-3)
        relative_drift = (sent[index] / 60 - grads[index]).norm() / grads[index].norm()
        assert relative_drift < 0.1
    total_norm = sum(g.norm() ** 2 for g in grads).sqrt().item()
    assert max(memory_norms[30:]) < 10 * total_norm
    assert max(memory_norms[30:]) <= 1.5 * max(memory_norms[:30])


def test_level_switch_changes_floats_next_step_and_keeps_memory():
    grads = shapes_params(*SHAPES, seed=3)
    reducer = build_reducer("powersgd", grads, rank=2)
    stats = reducer.reduce([g.clone() for g in grads])
    assert stats.floats_sent == reducer.floats_per_step() == 6 * 2 + 36 * 2 + 6 + 22 * 2 + 3 + 24 * 2
    memory_before = [m.clone() for m in reducer.memory]
    q_unchanged = reducer.q[1]
    new_levels = [1, 2, 3]
    reducer.set_levels(new_levels)
    assert all(torch.equal(a, b) for a, b in zip(memory_before, reducer.memory))
    assert reducer.q[0] is None and reducer.q[1] is q_unchanged  # only layer 0 and 2 redraw
    out = [g.clone() for g in grads]
    stats = reducer.reduce(out, new_levels)
    assert stats.floats_sent == reducer.floats_per_step(new_levels)
    assert stats.floats_sent == 6 * 1 + 36 * 1 + 6 + 22 * 2 + 3 + 24 * 3
    assert reducer.q[0].shape == (1, 36) and reducer.q[2].shape == (3, 8)
    for layer, index in enumerate(reducer.tensor_of_layer):  # g + old memory = out + new memory
        torch.testing.assert_close(
            grads[index] + memory_before[layer].view_as(grads[index]),
            out[index] + reducer.memory[layer].view_as(grads[index]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, option, levels", [("powersgd", "rank", [1, 2, 3]),
                                                   ("acp_powersgd", "rank", [1, 2, 3]),
                                                   ("topk", "ratio", [0.5, 0.1, 1.0])])
def test_a_reducer_without_its_own_level_reduces_only_at_levels_given_to_every_layer(
        name, option, levels):
    """rank=None / ratio=None: a schedule sets each layer's level (the config's null under
    schedule=accordion); the reducer computes exactly as one built with a level, once told."""
    grads = shapes_params(*SHAPES, seed=3)
    unset = build_reducer(name, grads, **{option: None})
    for missing in (None, [levels[0], None, levels[2]]):
        with pytest.raises(ValueError, match=f"has no {option}: this reducer was built with "
                                             f"{option}=None"):
            unset.reduce([g.clone() for g in grads], missing)
    given = build_reducer(name, grads, **{option: levels[0]})
    for _ in range(2):
        a, b = [g.clone() for g in grads], [g.clone() for g in grads]
        assert unset.reduce(a, levels) == given.reduce(b, levels)
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_topk_keeps_exactly_the_largest_entries_and_remembers_the_rest():
    grads = shapes_params((50, 40), (7,), seed=4)
    reducer = build_reducer("topk", grads, ratio=0.1)
    out = [g.clone() for g in grads]
    stats = reducer.reduce(out)
    flat = grads[0].view(-1)
    expected = torch.argsort(flat.abs(), descending=True)[:200]
    kept = out[0].view(-1).nonzero().view(-1)
    assert set(kept.tolist()) == set(expected.tolist())
    assert torch.equal(out[0].view(-1)[expected], flat[expected])
    assert torch.equal(out[1], grads[1])
    torch.testing.assert_close(reducer.memory[0].view(-1) + out[0].view(-1), flat)
    assert stats.floats_sent == 2 * 200 * 1 + 7


def test_topk_selection_matches_sorting():
    values = torch.randn(10_000, generator=torch.Generator().manual_seed(5))
    chosen = topk_indices(values, 990)
    assert set(chosen.tolist()) == set(torch.argsort(values.abs())[-990:].tolist())


def test_official_topk_keeps_no_memory_and_ratio_one_is_dense():
    grads = shapes_params((20, 10), (4, 5), seed=6)
    reducer = build_reducer("topk", grads, ratio=0.25, official_topk=True)
    out = [g.clone() for g in grads]
    stats = reducer.reduce(out, [0.25, 1.0])
    assert reducer.memory == [None, None]
    assert torch.equal(out[1], grads[1])
    assert stats.floats_sent == 2 * 50 + 20


@pytest.mark.parametrize("name,options,levels", [
    ("powersgd", {"rank": 2}, [[2, 1, 2], [1, 1, 3], [2, 2, 2]]),
    ("powersgd", {"rank": 1, "warm_start": False}, [[1, 1, 1], [2, 1, 1], [2, 1, 1]]),
    ("topk", {"ratio": 0.2}, [[0.2, 0.5, 0.2], [0.1, 0.5, 1.0], [0.2, 0.2, 0.2]]),
])
def test_state_survives_save_and_load_bit_for_bit(name, options, levels):
    grads = shapes_params(*SHAPES, seed=7)
    reducer = build_reducer(name, grads, **options)
    for step_levels in levels[:2]:
        reducer.reduce([g.clone() for g in grads], step_levels)
    blob = io.BytesIO()
    torch.save(reducer.state_dict(), blob)
    blob.seek(0)
    restored = build_reducer(name, grads, **options)
    restored.load_state_dict(torch.load(blob))
    for step_levels in levels[2:] * 2:
        a, b = [g.clone() for g in grads], [g.clone() for g in grads]
        reducer.reduce(a, step_levels)
        restored.reduce(b, step_levels)
        assert all(torch.equal(x, y) for x, y in zip(a, b))
    for x, y in zip(reducer.memory, restored.memory):
        assert torch.equal(x, y)


def test_dense_reducer_counts_every_float_and_needs_no_levels():
    grads = shapes_params(*SHAPES)
    reducer = build_reducer("none", grads)
    out = [g.clone() for g in grads]
    stats = reducer.reduce(out)
    assert all(torch.equal(a, b) for a, b in zip(out, grads))
    assert stats.floats_sent == sum(g.numel() for g in grads) and stats.collectives == 0
    with pytest.raises(ValueError):
        reducer.reduce(out, [2, 2, 2])


def test_non_contiguous_gradients_are_reduced_in_place():
    base = torch.randn(8, 6, generator=torch.Generator().manual_seed(8))
    grads = [base.t()]  # (6, 8), not contiguous
    reducer = build_reducer("powersgd", [torch.empty(6, 8)], rank=6)
    reducer.reduce(grads)
    assert torch.equal(grads[0], base.t())


def test_resnet18_floats_per_step_match_the_paper_convention():
    from accordion_repro.models import build_model

    params = list(build_model("resnet18", num_classes=10).parameters())
    dense = build_reducer("none", params)
    assert dense.floats_per_step() == 11_173_962
    powersgd = build_reducer("powersgd", params, rank=2)
    assert powersgd.num_compressible == 21
    assert [powersgd.floats_per_step([r] * 21) for r in (1, 2, 4)] == [45_935, 82_260, 154_910]


@pytest.mark.parametrize("k", [1, 700, 50_000, 99_000, 99_999])
@pytest.mark.parametrize("kind", ["normal", "ties", "spiky"])
def test_sampled_topk_selection_is_exact_on_large_layers(k, kind):
    gen = torch.Generator().manual_seed(k)
    values = torch.randn(100_000, generator=gen)
    if kind == "ties":
        values = values.round()  # a handful of distinct magnitudes: ties at every threshold
    if kind == "spiky":
        values[torch.randperm(100_000, generator=gen)[:50]] *= 1e6
    chosen = topk_indices(values, k)
    assert chosen.numel() == k and chosen.unique().numel() == k
    expected = torch.topk(values.abs(), k).values
    torch.testing.assert_close(values.abs()[chosen].sort().values, expected.sort().values)


def test_resumed_powersgd_matches_bit_for_bit_on_real_layer_shapes():
    """BLAS results can depend on where Q sits in memory: a restored reducer must still agree."""
    from accordion_repro.models import build_model

    shapes = [p.shape for p in build_model("resnet18", num_classes=10, width=0.125).parameters()]
    gen = torch.Generator().manual_seed(9)
    steps = [[torch.randn(s, generator=gen) for s in shapes] for _ in range(3)]
    original = build_reducer("powersgd", steps[0], rank=1)
    original.reduce([g.clone() for g in steps[0]])
    blob = io.BytesIO()
    torch.save(original.state_dict(), blob)
    blob.seek(0)
    restored = build_reducer("powersgd", steps[0], rank=1)
    restored.load_state_dict(torch.load(blob))
    for grads in steps[1:]:
        a, b = [g.clone() for g in grads], [g.clone() for g in grads]
        original.reduce(a)
        restored.reduce(b)
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def _capture_sent(reducer) -> list[int]:
    """Sizes of the buffers the reducer hands to its all-gather (one worker: the gather is free)."""
    sizes, gather = [], reducer.comm.all_gather

    def recording(local, stats):
        sizes.append(local.numel())
        return gather(local, stats)

    reducer.comm.all_gather = recording
    return sizes


@pytest.mark.parametrize("official", [False, True])
def test_topk_ratio_below_one_entry_per_layer(official):
    """ratio 0.005: int(0.005 * 120) = 0 for the (10, 12) layer, 10 for the (50, 40) one. Ours
    still sends that layer's largest entry; the released code (official_topk) sends nothing."""
    grads = shapes_params((50, 40), (7,), (10, 12), seed=10)
    reducer = build_reducer("topk", grads, ratio=0.005, official_topk=official)
    sent = _capture_sent(reducer)
    out = [g.clone() for g in grads]
    stats = reducer.reduce(out)
    small = grads[2].view(-1)
    if official:
        assert sent == [2 * 10]
        assert stats.floats_sent == reducer.floats_per_step() == 2 * 10 + 7
        assert torch.equal(out[2], torch.zeros_like(grads[2]))
        assert reducer.memory == [None, None]
    else:
        assert sent == [2 * (10 + 1)]
        assert stats.floats_sent == reducer.floats_per_step() == 2 * 10 + 7 + 2 * 1
        largest = small.abs().argmax()
        assert out[2].view(-1).nonzero().view(-1).tolist() == [largest.item()]
        assert out[2].view(-1)[largest] == small[largest]
        torch.testing.assert_close(reducer.memory[1].view(-1) + out[2].view(-1), small)
    assert out[0].view(-1).count_nonzero() == 10 and torch.equal(out[1], grads[1])


def test_official_topk_with_every_layer_below_one_entry_sends_nothing():
    grads = shapes_params((10, 12), (4, 5), seed=11)
    reducer = build_reducer("topk", grads, ratio=0.001, official_topk=True)
    sent = _capture_sent(reducer)
    out = [g.clone() for g in grads]
    stats = reducer.reduce(out)
    assert sent == [] and stats.floats_sent == 0 == reducer.floats_per_step()
    assert all(torch.equal(o, torch.zeros_like(o)) for o in out)
