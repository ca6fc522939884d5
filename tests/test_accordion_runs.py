"""Accordion inside the real training loop: level switches, batch switches, one decision for all."""

from __future__ import annotations

import datetime
import os

import pytest
import torch
import torch.distributed as dist

from accordion_repro.comm import build_reducer
from accordion_repro.launch import free_port
from accordion_repro.models import build_model
from conftest import read_metrics, train, train_in_pool
from harness import forked_ranks

TINY = ["model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10", "dataset.train_size=128",
        "dataset.test_size=32", "trainer.batch_size=16", "trainer.eval_batch_size=32",
        "trainer.max_eval_steps=1", "optim.warmup_epochs=0", "optim.decay_at=[]"]


@pytest.mark.slow
def test_accordion_moves_layers_to_high_and_back_to_low_at_the_decay(tmp_path):
    run_dir = train([*TINY, "trainer.epochs=6", "compressor=powersgd",
                     "schedule=accordion", "schedule.low=2", "schedule.high=1", "schedule.interval=2",
                     "optim.decay_at=[4]"], tmp_path / "run")
    metrics = read_metrics(run_dir)
    levels = [m["layer_levels"] for m in metrics]
    assert levels[0] == levels[1] == levels[2] == [2] * 21           # epoch 0 and until the first check
    assert 1 in levels[3]                                             # the check at epoch 2 found calm layers
    assert levels[4] == [2] * 21                                      # the LR of epoch 4 is lower: all low
    assert metrics[2]["detector"]["checked"] and not metrics[3]["detector"]["checked"]
    assert metrics[4]["lr"] < metrics[3]["lr"]

    params = list(build_model("resnet18", num_classes=10, width=0.125).parameters())
    reducer = build_reducer("powersgd", params, rank=2)
    for m in metrics:
        assert m["floats_sent"] == m["steps"] * reducer.floats_per_step(m["layer_levels"]), m["epoch"]
    assert metrics[3]["floats_sent"] / metrics[3]["steps"] < metrics[2]["floats_sent"] / metrics[2]["steps"]


@pytest.mark.slow
@pytest.mark.distributed
def test_batch_accordion_switches_batch_and_lr_at_the_logged_epoch(tmp_path, rank_pool):
    run_dir = train_in_pool(rank_pool, [*TINY, "dist.nproc_per_node=2", "trainer.batch_size=8", "trainer.epochs=4",
                     "schedule=batch_accordion", "schedule.low=16", "schedule.high=64",
                     "schedule.mode=fixed_epoch", "schedule.switch_epoch=2"], tmp_path / "run")
    metrics = read_metrics(run_dir)
    assert [m["global_batch"] for m in metrics] == [16, 16, 64, 64]
    assert [m["steps"] for m in metrics] == [8, 8, 2, 2]              # 128 images / global batch
    assert metrics[2]["lr"] == pytest.approx(4 * metrics[1]["lr"])   # linear LR scaling
    assert metrics[2]["floats_sent"] == metrics[1]["floats_sent"] / 4  # fewer steps, fewer floats


@pytest.mark.slow
@pytest.mark.distributed
def test_joint_schedule_drives_levels_and_batch_from_one_detector(tmp_path, rank_pool):
    run_dir = train_in_pool(rank_pool, [*TINY, "dist.nproc_per_node=2", "trainer.batch_size=8", "trainer.epochs=4",
                     "compressor=powersgd", "schedule=joint", "schedule.low=2",
                     "schedule.high=1", "schedule.batch_low=16", "schedule.batch_high=64",
                     "schedule.interval=1", "schedule.eta=100"], tmp_path / "run")
    metrics = read_metrics(run_dir)
    # eta=100: nothing is ever critical after epoch 0, so from epoch 2 on (decided at the end
    # of epoch 1, the first epoch with a previous norm) every layer is high and the batch large.
    assert metrics[0]["global_batch"] == 16 and metrics[0]["layer_levels"] == [2] * 21
    assert metrics[-1]["global_batch"] == 64 and metrics[-1]["layer_levels"] == [1] * 21
    switch = next(m["epoch"] for m in metrics if m["global_batch"] == 64)
    assert metrics[switch]["lr"] == pytest.approx(4 * metrics[switch - 1]["lr"])
    assert metrics[switch]["layer_levels"] == [1] * 21


def _decide(rank: int, port: int, out) -> None:
    from accordion_repro.accordion import build_schedule
    from accordion_repro.accordion.controller import AdaptController

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))

    def schedule():
        return build_schedule("accordion", num_layers=2, compressor="powersgd", default_level=2,
                              base_global_batch=16, world_size=2, low=2, high=1, interval=1,
                              eta=0.5, lr_decay_rule=True, statistic="mean")

    applied_schedule, local = schedule(), schedule()
    adapt = AdaptController(applied_schedule, rank=rank)  # as the trainer decides
    detector, local_detector = adapt.detector, local.make_detector()
    for epoch, scale in enumerate([1.0, 1.0 if rank == 0 else 5.0]):  # rank 1's norms jump
        grads = [torch.full((4, 4), scale), torch.full((4, 4), scale)]
        if detector is not None:  # rank 0's alone, as in the trainer
            detector.accumulate(grads)
        local_detector.accumulate(grads)
        own = local.on_epoch_end(epoch, local_detector.end_epoch(epoch, 0.1, 0.1))
        adapt.end_epoch(epoch, 0.1, 0.1)
        applied = adapt.plan
    out.put((rank, own.levels, applied.levels))
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.distributed
def test_every_rank_applies_rank0_decision_when_local_gradients_differ():
    ctx = forked_ranks.context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_decide, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = dict((r, (own, applied)) for r, own, applied in (queue.get(timeout=120) for _ in procs))
    for p in procs:
        p.join(30)
    assert results[0][0] == [1, 1] and results[1][0] == [2, 2]   # their own views differ...
    assert results[0][1] == results[1][1] == [1, 1]               # ...both apply rank 0's


@pytest.mark.slow
def test_figure2b_arms_from_a_detect_run_put_rank1_in_its_critical_epochs_and_send_equal_floats(tmp_path):
    """Figure 2 (b) defined by the data: a static rank-2 run watches its critical regimes
    (schedule.detect=true, the levels never change); the inside arm then runs rank 1 in exactly
    the epochs it held critical, the outside arm in as many it did not, and both send the same
    floats (analysis/regime_plan.py)."""
    from accordion_repro.analysis.regime_plan import held_critical, plan_from_run

    common = [*TINY, "trainer.epochs=6", "compressor=powersgd", "optim.decay_at=[4]"]
    reference = train([*common, "compressor.rank=2", "schedule=static", "schedule.detect=true",
                       "schedule.interval=1", "schedule.eta=0.9"], tmp_path / "reference")
    metrics = read_metrics(reference)
    assert all(m["layer_levels"] == [2] * 21 for m in metrics)       # watched, never acted on
    assert all(m["detector"]["granularity"] == "layer+model" for m in metrics)
    held = held_critical(metrics)
    assert held[0] and held[4]       # epoch 0 starts critical; the first epoch of the decay is too
    plan = plan_from_run(reference)
    assert plan.critical_epochs == [e for e, flag in enumerate(held) if flag]
    assert len(plan.outside_epochs) == len(plan.critical_epochs)
    assert not set(plan.outside_epochs) & set(plan.critical_epochs)

    floats = {}
    for arm in ("inside", "outside"):
        run = train([*common, "experiment=fig2/resnet18_high_inside",
                     *plan.overrides(arm), "schedule.inside=1", "schedule.outside=2"], tmp_path / arm)
        arm_metrics = read_metrics(run)
        rank1 = [m["epoch"] for m in arm_metrics if m["layer_levels"] == [1] * 21]
        assert rank1 == (plan.critical_epochs if arm == "inside" else plan.outside_epochs)
        floats[arm] = sum(m["floats_sent"] for m in arm_metrics)
    assert floats["inside"] == floats["outside"]


@pytest.mark.parametrize("case", ["not_detect", "dense_static"])
def test_a_reference_without_detector_flags_is_refused_by_name(tmp_path, case):
    from accordion_repro.analysis.collect import RunDirectoryError
    from accordion_repro.analysis.regime_plan import plan_from_run

    extra = {"not_detect": ["compressor=powersgd"], "dense_static": []}[case]
    run = train([*TINY, "trainer.epochs=2", *extra], tmp_path / "run")
    with pytest.raises(RunDirectoryError, match="schedule.detect=true"):
        plan_from_run(run)
