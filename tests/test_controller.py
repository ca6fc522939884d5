"""The end-of-epoch decision (accordion/controller.py), which the trainer and the own-code
objects both use: on 2 gloo ranks, rank 0 alone measures, and both ranks' schedules make the
same plans and end in the same state, for a schedule that measures (L-GreCo's error table,
Accordion's flags) and for one that does not (phase_rule: no collective at all)."""

from __future__ import annotations

import pytest
import torch

from test_comm_distributed import run_workers

SHAPES = [(8, 27), (32, 128), (10, 32)]
RUN = dict(compressor="powersgd", default_level=2, base_global_batch=16, world_size=2,
           layer_shapes=SHAPES)
SCHEDULES = {"lgreco": dict(r0=2), "accordion": dict(low=2, high=1, interval=1),
             "phase_rule": dict(boundaries=[2], splits=[1000], levels=[[2, 2], [1, 2]])}


def _worker(rank):
    import torch.distributed as dist

    from accordion_repro.accordion import build_schedule
    from accordion_repro.accordion.controller import AdaptController

    results = {}
    for name, options in SCHEDULES.items():
        schedule = build_schedule(name, num_layers=len(SHAPES), **RUN, **options)
        adapt = AdaptController(schedule, rank=rank, group=dist.group.WORLD)
        detector = adapt.detector
        gen = torch.Generator().manual_seed(7)
        plans, reports = [], []
        for epoch, (lr_now, lr_next) in enumerate([(0.1, 0.1), (0.1, 0.01), (0.01, 0.01)]):
            grads = [torch.randn(n * m, generator=gen) * (1 + epoch) for n, m in SHAPES]
            if detector is not None:
                detector.accumulate(grads)
            report = adapt.end_epoch(epoch, lr_now, lr_next)
            plan = adapt.plan
            plans.append(plan.to_dict())
            reports.append(sorted(report))
        results[name] = {"plans": plans, "state": schedule.state_dict(), "reports": reports}
    return results


@pytest.mark.slow
@pytest.mark.distributed
def test_every_rank_plans_alike_from_rank_0s_measurement(tmp_path):
    r0, r1 = run_workers(_worker, tmp_path, timeout=120)
    for name in SCHEDULES:
        assert r0[name]["plans"] == r1[name]["plans"], name
        assert r0[name]["state"] == r1[name]["state"], name
        assert r0[name]["reports"] == r1[name]["reports"], name
    assert r0["phase_rule"]["reports"] == [[]] * 3  # nothing measured, nothing sent
    assert "errors" in r0["lgreco"]["reports"][0] and "ratios" in r0["accordion"]["reports"][1]
    # the LR decay after epoch 1 sends every layer to Accordion's low level
    assert r0["accordion"]["plans"][1]["levels"] == [2, 2, 2]


def _run(adapt, epochs, grads_of, lrs):
    plans = []
    for epoch in epochs:
        if adapt.detector is not None:
            adapt.detector.accumulate(grads_of(epoch))
        adapt.end_epoch(epoch, *lrs[epoch])
        plans.append(adapt.plan.to_dict())
    return plans


def test_a_saved_controller_resumes_to_the_plans_of_the_straight_run():
    """One process (rank 0, no group): what the trainer's checkpoint and Accordion.state_dict
    both hold now, the schedule, the detector and the plan, through one state_dict."""
    from accordion_repro.accordion import build_schedule
    from accordion_repro.accordion.controller import AdaptController
    from accordion_repro.accordion.schedules import Plan

    def controller():
        return AdaptController(build_schedule("accordion", num_layers=len(SHAPES), **RUN, low=2,
                                              high=1, interval=1, eta=0.3), rank=0)

    def grads_of(epoch):
        gen = torch.Generator().manual_seed(epoch)
        base = torch.Generator().manual_seed(0)  # the same direction every epoch: small changes
        scale = 3.0 if epoch == 3 else 1.0 + 0.01 * epoch  # but a jump in epoch 3
        return [(torch.randn(n * m, generator=base) + 0.01 * torch.randn(n * m, generator=gen))
                * scale for n, m in SHAPES]

    lrs = [(0.1, 0.1), (0.1, 0.1), (0.1, 0.01), (0.01, 0.01), (0.01, 0.01)]
    straight = _run(controller(), range(5), grads_of, lrs)
    first = controller()
    _run(first, range(2), grads_of, lrs)
    saved = first.state_dict()
    resumed = controller()
    resumed.load_state_dict(saved)
    assert straight[2:] == _run(resumed, range(2, 5), grads_of, lrs)
    assert len({str(p) for p in straight}) > 1  # the plans change: the test sees a decision
    old = controller()  # a checkpoint written before the controller held the plan: a Plan
    old.load_state_dict({**saved, "plan": Plan.from_dict(saved["plan"])})
    assert straight[2:] == _run(old, range(2, 5), grads_of, lrs)
