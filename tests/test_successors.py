"""L-GreCo, L-GreCo + Accordion and the phase rule against their published algorithms.

One test per property; each runs its check on the real code and on a deliberately broken
variant, which the same check must reject (so the check can fail)."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from accordion_repro.accordion import build_schedule, lgreco
from accordion_repro.accordion.lgreco import (ErrorProbe, candidate_ranks, choose_ranks,
                                              layer_cost, rank_errors)
from accordion_repro.accordion.detector import CriticalRegimeDetector
from accordion_repro.accordion.successors import PhaseRuleSchedule
from accordion_repro.errors import ConfigError

RUN = dict(compressor="powersgd", default_level=2, base_global_batch=4, world_size=2)


def instances(count=60, seed=0):
    """Small random knapsacks: 1-4 layers, 2-4 candidates, costs rising and errors falling
    with the rank as they do for PowerSGD, budgets around the reference."""
    rng = random.Random(seed)
    for _ in range(count):
        layers, options = rng.randint(1, 4), rng.randint(2, 4)
        errors = [sorted((rng.uniform(0, 5) for _ in range(options)), reverse=True)
                  for _ in range(layers)]
        costs = [sorted(rng.sample(range(1, 50), options)) for _ in range(layers)]
        reference = sum(layer[rng.randrange(options)] for layer in errors)
        yield errors, costs, reference, rng.choice([0.5, 0.8, 1.0, 1.3, 2.0]), rng.choice([7, 50, 1000])


def units(error, reference, bins, capacity):
    """Written out again here, not imported: errors in grid steps, rounded down."""
    return min(math.floor(error / (reference / bins) + 1e-9), capacity + 1)


def brute_force(errors, costs, reference, alpha, bins):
    """The least total cost over every combination whose rounded-up errors fit the grid."""
    capacity = math.floor(alpha * bins + 1e-9)
    best = None
    for combo in itertools.product(*(range(len(layer)) for layer in errors)):
        used = sum(units(errors[l][c], reference, bins, capacity) for l, c in enumerate(combo))
        if used <= capacity:
            cost = sum(costs[l][c] for l, c in enumerate(combo))
            best = cost if best is None else min(best, cost)
    return best


def check_dp_equals_brute_force(choose):
    for errors, costs, reference, alpha, bins in instances():
        want = brute_force(errors, costs, reference, alpha, bins)
        chosen = choose(errors, costs, reference, alpha, bins)
        if want is None:  # nothing fits: the least-error candidates
            assert chosen == [min(range(len(l)), key=l.__getitem__) for l in errors]
            continue
        assert sum(costs[l][c] for l, c in enumerate(chosen)) == want
        # rounded down: over the real budget by less than one grid step per layer
        slack = len(errors) * reference / bins
        assert sum(errors[l][c] for l, c in enumerate(chosen)) <= alpha * reference + slack


def greedy(errors, costs, reference, alpha, bins):
    """Broken: each layer takes its cheapest candidate within an equal share of the budget."""
    share = alpha * reference / len(errors)
    return [min((c for c in range(len(l)) if l[c] <= share), key=costs[i].__getitem__,
                default=len(l) - 1) for i, l in enumerate(errors)]


def test_lgreco_dp_equals_brute_force_on_small_layer_sets():
    check_dp_equals_brute_force(choose_ranks)
    with pytest.raises(AssertionError):
        check_dp_equals_brute_force(greedy)


def check_monotone_in_budget(choose):
    alphas = [0.3, 0.5, 0.7, 0.9, 1.0, 1.2, 1.5, 2.0, 3.0]
    for errors, costs, reference, _, bins in instances(seed=1):
        totals = [sum(costs[l][c]
                      for l, c in enumerate(choose(errors, costs, reference, a, bins)))
                  for a in alphas]
        assert all(later <= earlier for earlier, later in zip(totals, totals[1:])), totals


def inverted_budget(errors, costs, reference, alpha, bins):
    """Broken: the budget divided by alpha instead of multiplied."""
    return choose_ranks(errors, costs, reference, 1 / alpha, bins)


def test_lgreco_dp_is_monotone_in_the_budget():
    check_monotone_in_budget(choose_ranks)
    with pytest.raises(AssertionError):
        check_monotone_in_budget(inverted_budget)


def test_lgreco_reference_plan_always_fits_so_alpha_one_never_sends_more():
    for errors, costs, _, _, bins in instances(seed=2):
        reference_choice = [len(layer) // 2 for layer in errors]
        reference = sum(layer[c] for layer, c in zip(errors, reference_choice))
        chosen = choose_ranks(errors, costs, reference, 1.0, bins)
        assert sum(costs[l][c] for l, c in enumerate(chosen)) \
            <= sum(costs[l][c] for l, c in enumerate(reference_choice))


# ---- the error table ---------------------------------------------------------------------------
SHAPES = [(6, 2, 3, 3), (10, 7), (3, 40)]  # matrices 6x18, 10x7, 3x40
MATRIX = [(6, 18), (10, 7), (3, 40)]


def direct_errors(matrix, ranks):
    """||M - U_r S_r V_r^T||_F from a full SVD, one rank at a time."""
    u, s, vh = torch.linalg.svd(matrix.to(torch.float64), full_matrices=False)
    return [float(torch.linalg.matrix_norm(matrix.to(torch.float64)
                                           - u[:, :r] @ torch.diag(s[:r]) @ vh[:r]))
            for r in ranks]


def probe_table(ranks):
    probe = ErrorProbe(CriticalRegimeDetector(len(SHAPES)), MATRIX, ranks)
    gen = torch.Generator().manual_seed(7)
    steps = [[torch.randn(s, generator=gen) for s in SHAPES] for _ in range(3)]
    for grads in steps:
        probe.accumulate(grads)
    sums = [sum(step[i] for step in steps).reshape(MATRIX[i]) for i in range(len(SHAPES))]
    return probe.end_epoch(0, 0.1, 0.1)["errors"], sums


def check_error_table(ranks):
    table, sums = probe_table(ranks)
    for errors, total in zip(table, sums):
        assert errors == pytest.approx(direct_errors(total, ranks), rel=1e-9, abs=1e-9)


def test_lgreco_error_table_equals_a_direct_svd_computation(monkeypatch):
    ranks = candidate_ranks(2, 0.5, 2.0) + [10]  # 1..4, and 10 >= min(n, m) for two layers
    assert ranks[:4] == [1, 2, 3, 4]
    check_error_table(ranks)
    table, _ = probe_table(ranks)
    assert table[1][-1] == 0.0 and table[2][-1] == 0.0  # a full rank loses nothing
    # broken: the tail from the r-th singular value on, one too many
    monkeypatch.setattr(lgreco, "rank_errors",
                        lambda m, rs: rank_errors(m, [max(r - 1, 0) for r in rs]))
    with pytest.raises(AssertionError):
        check_error_table(ranks)


# ---- the schedules -------------------------------------------------------------------------------
def test_lgreco_plans_the_dp_choice_within_the_uniform_rank_budget():
    shapes = [(64, 576), (64, 576), (10, 64), (128, 1152)]
    schedule = build_schedule("lgreco", num_layers=4, layer_shapes=shapes, r0=2, **RUN)
    assert schedule.ranks == [1, 2, 3, 4] and schedule.initial_plan().levels == [2] * 4
    gen = torch.Generator().manual_seed(0)
    errors = [rank_errors(torch.randn(s, generator=gen) @ torch.diag(torch.logspace(0, -2, s[1])),
                          schedule.ranks) for s in shapes]
    plan = schedule.on_epoch_end(0, {"critical": [True] * 4, "errors": errors})
    budget = sum(layer[1] for layer in errors)  # alpha 1 x the error of rank 2 everywhere
    assert sum(e[schedule.ranks.index(r)] for e, r in zip(errors, plan.levels)) <= budget
    cost = sum(layer_cost(s, r) for s, r in zip(shapes, plan.levels))
    assert cost <= sum(layer_cost(s, 2) for s in shapes)  # uniform r0 is one feasible plan
    with pytest.raises(ValueError, match="error table"):
        schedule.on_epoch_end(1, [True] * 4)


def test_lgreco_accordion_takes_its_budget_from_accordions_choice():
    shapes = [(16, 144)] * 3
    schedule = build_schedule("lgreco_accordion", num_layers=3, layer_shapes=shapes, r0=2,
                              low=2, high=1, **RUN)
    assert schedule.initial_plan().levels == [2, 2, 2]
    errors = [[4.0, 2.0, 1.0, 0.5]] * 3
    # all critical: budget 3 x 2.0 = 6 -> rank 2 everywhere is the cheapest that fits
    assert schedule.on_epoch_end(0, {"critical": [True] * 3, "errors": errors}).levels == [2, 2, 2]
    # none critical: budget 3 x 4.0 = 12 -> rank 1 everywhere
    assert schedule.on_epoch_end(1, {"critical": [False] * 3, "errors": errors}).levels == [1, 1, 1]
    assert schedule.info()["critical_layers"] == 0
    with pytest.raises(ConfigError, match="schedule.high"):
        build_schedule("lgreco_accordion", num_layers=3, layer_shapes=shapes, r0=2, low=2,
                       high=1, gamma=1.0, **RUN)  # candidates 2..4: Accordion's rank 1 is not one


def test_lgreco_needs_layer_shapes_and_a_rank_compressor():
    with pytest.raises(ValueError, match="layer_shapes"):
        build_schedule("lgreco", num_layers=2, r0=2, **RUN)
    with pytest.raises(ConfigError, match="chooses PowerSGD ranks"):
        build_schedule("lgreco", num_layers=1, layer_shapes=[(4, 4)], r0=2,
                       **{**RUN, "compressor": "topk", "default_level": 0.1})


# ---- the phase rule ------------------------------------------------------------------------------
PHASE = dict(boundaries=[0.25, 0.5], splits=[100, 5000], levels=[[4, 4, 2], [4, 2, 1], [2, 1, 1]])
PHASE_SHAPES = [(4, 24), (10, 10), (64, 78), (64, 79)]  # 96, 100, 4992 and 5056 entries
# What the table says for 8 epochs (phases start at epochs 2 and 4): size groups 0, 1, 1, 2.
PHASE_PLAN = [[4, 4, 4, 2]] * 2 + [[4, 2, 2, 1]] * 2 + [[2, 1, 1, 1]] * 4


def check_phase_table(cls):
    schedule = cls(4, build_schedule("phase_rule", num_layers=4, layer_shapes=PHASE_SHAPES,
                                     total_epochs=8, **RUN, **PHASE).settings,
                   layer_shapes=PHASE_SHAPES, default_level=2)
    plans = [schedule.initial_plan().levels]
    plans += [schedule.on_epoch_end(e, None).levels for e in range(7)]
    assert plans == PHASE_PLAN


class LateBoundary(PhaseRuleSchedule):
    """Broken: a phase starts one epoch after its boundary."""

    def phase_of(self, epoch):
        return sum(1 for start in self.settings.boundaries if epoch > start)


def test_phase_rule_reproduces_its_table():
    check_phase_table(PhaseRuleSchedule)
    with pytest.raises(AssertionError):
        check_phase_table(LateBoundary)


def test_phase_rule_refuses_a_table_of_the_wrong_shape():
    with pytest.raises(ConfigError, match=r"schedule.levels\[1\]"):
        build_schedule("phase_rule", num_layers=1, layer_shapes=[(4, 4)], total_epochs=8,
                       **RUN, **{**PHASE, "levels": [[4, 4, 2], [4, 2], [2, 1, 1]]})
    with pytest.raises(ConfigError, match="3 phases"):
        build_schedule("phase_rule", num_layers=1, layer_shapes=[(4, 4)], total_epochs=8,
                       **RUN, **{**PHASE, "levels": [[4, 4, 2]]})


@pytest.mark.parametrize("name, options", [
    ("lgreco", dict(r0=2)),
    ("lgreco_accordion", dict(r0=2, low=2, high=1, interval=1)),
    ("phase_rule", PHASE),
])
def test_successor_schedules_resume_exactly(name, options):
    shapes = [(16, 144), (32, 288), (10, 32)]
    make = lambda: build_schedule(name, num_layers=3, layer_shapes=shapes, total_epochs=8,
                                  **RUN, **options)
    first = make()
    detector = first.make_detector()
    gen = torch.Generator().manual_seed(3)

    def epoch(schedule, probe, e):
        if probe is not None:
            for _ in range(2):
                probe.accumulate([torch.randn(s, generator=gen) for s in shapes])
            decision = probe.end_epoch(e, 0.1, 0.1)
        else:
            decision = None
        return schedule.on_epoch_end(e, decision).levels

    for e in range(2):
        epoch(first, detector, e)
    second, probe2 = make(), (None if detector is None else first.make_detector())
    second.load_state_dict(first.state_dict())
    if detector is not None:
        probe2.load_state_dict(detector.state_dict())
    gen_state = gen.get_state()
    a = [epoch(first, detector, e) for e in range(2, 5)]
    gen.set_state(gen_state)
    b = [epoch(second, probe2, e) for e in range(2, 5)]
    assert a == b and second.plan == first.plan


# ---- the phase-rule preset sends Accordion's floats ----------------------------------------------
def test_phase_rule_preset_matches_accordions_committed_floats_at_cpu_long():
    """Mean floats per step of successors/resnet18_phase_rule at scale=cpu_long (its plan of
    each epoch, through the reducer's own count) within 1 % of the mean of the committed
    Accordion 2<->1 runs at that scale (total floats / total steps, over their seeds)."""
    import json
    from pathlib import Path

    from test_presets import build_pieces, composed

    runs = sorted(Path(__file__).resolve().parents[1].glob(
        "results/runs/cpu_long/table1/resnet18_powersgd_accordion/seed*/metrics.jsonl"))
    if not runs:
        pytest.skip("no committed Accordion runs at scale=cpu_long")
    per_run = []
    for path in runs:
        epochs = [json.loads(line) for line in path.read_text().splitlines() if line]
        per_run.append(sum(e["floats_sent"] for e in epochs) / sum(e["steps"] for e in epochs))
    accordion = sum(per_run) / len(per_run)
    c = composed("successors/resnet18_phase_rule", "cpu_long")
    _, reducer, schedule = build_pieces(c)
    epochs = c["trainer"]["epochs"]
    plans = [schedule.initial_plan().levels]
    plans += [schedule.on_epoch_end(e, None).levels for e in range(epochs - 1)]
    phase_rule = sum(reducer.floats_per_step(levels) for levels in plans) / epochs
    assert phase_rule == pytest.approx(accordion, rel=0.01), (phase_rule, accordion)
