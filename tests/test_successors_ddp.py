"""The successors as one object on a DistributedDataParallel model (ddp.py): LGreCo,
LGreCoAccordion, PhaseRule and AutoAccordion plan per-layer levels at the end of an epoch and resume exactly
from state_dict, with PowerSGD or ACP-SGD underneath."""

from __future__ import annotations

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from test_accordion_ddp import SmallNet, _batch

OBJECTS = {
    "lgreco": ("LGreCo", dict(r0=2)),
    "lgreco_accordion": ("LGreCoAccordion", dict(r0=2, low=2, high=1, interval=1)),
    "phase_rule": ("PhaseRule", dict(boundaries=[1], splits=[1000], levels=[[2, 2], [1, 2]],
                                     total_epochs=4)),
    "auto": ("AutoAccordion", dict(interval=1, max_rank=4, low_share=0.5)),  # issue 42
}


def _train(obj_name, options, compressor, epochs, state=None, seed=0):
    from accordion_repro import ddp as module

    torch.manual_seed(0)
    net = SmallNet()
    ddp = DistributedDataParallel(net)
    obj = getattr(module, obj_name)(ddp, compressor, **options)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    if state is not None:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        obj.load_state_dict(state["obj"])
    gen = torch.Generator().manual_seed(seed)
    if state is not None:
        gen.set_state(state["batches"])
    levels = []
    for epoch in epochs:
        for _ in range(2):
            x, y = _batch(gen)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
            optimizer.step()
        levels.append(obj.end_epoch(epoch, 0.1, 0.1).levels)
    saved = {"model": {k: v.clone() for k, v in net.state_dict().items()},
             "optimizer": optimizer.state_dict(), "obj": obj.state_dict(),
             "batches": gen.get_state()}
    return obj, levels, saved


@pytest.mark.parametrize("compressor", ["powersgd", "acp_powersgd"])
@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_successor_objects_plan_levels_and_resume_exactly(one_rank_group, name, compressor):
    obj_name, options = OBJECTS[name]
    obj, levels, _ = _train(obj_name, options, compressor, range(3))
    assert obj.layer_names == ["conv.weight", "fc1.weight", "fc2.weight"]
    assert all(len(lv) == 3 and all(isinstance(r, int) and r >= 1 for r in lv) for lv in levels)
    if name == "phase_rule":  # conv 8x27 and fc2 10x32 are small, fc1 32x128 is not
        assert levels == [[1, 2, 1]] * 3
    else:
        assert set(r for lv in levels for r in lv) <= {1, 2, 3, 4}
        assert "errors" in obj.report and len(obj.report["errors"]) == 3
    _check_resumes_exactly(obj_name, options, compressor)


def _check_resumes_exactly(obj_name, options, compressor):
    """Stop after epoch 0, resume in a new object: epochs 1, 2 bit for bit as if never stopped."""
    _, first, saved = _train(obj_name, options, compressor, range(1), seed=1)
    _, straight, end = _train(obj_name, options, compressor, range(3), seed=1)
    _, rest, resumed = _train(obj_name, options, compressor, range(1, 3), state=saved, seed=1)
    assert first + rest == straight
    assert all(torch.equal(end["model"][k], resumed["model"][k]) for k in end["model"])


def test_auto_accordion_chooses_topk_fractions_and_resumes_exactly(one_rank_group):
    """AutoAccordion with compressor="topk" (issue 42): its levels are kept fractions of the
    grid below the break-even 1 / (2 x world size), here 1/2 on one rank."""
    options = dict(interval=1, low_share=0.5, min_fraction=0.01)
    obj, levels, _ = _train("AutoAccordion", options, "topk", range(3))
    assert obj.schedule.ranks == [2**-6, 2**-5, 2**-4, 2**-3, 2**-2]
    assert all(level in obj.schedule.ranks for lv in levels for level in lv)
    assert len(obj.report["errors"]) == 3
    _check_resumes_exactly("AutoAccordion", options, "topk")


def test_successor_objects_name_their_own_arguments(one_rank_group):
    from accordion_repro.ddp import LGreCo, PhaseRule

    with pytest.raises(TypeError, match="it takes r0, gamma, beta, alpha, bins, no_plan, async_op"):
        LGreCo(DistributedDataParallel(SmallNet()), r0=2, eta=0.3)
    with pytest.raises(TypeError, match="takes no rank=: the schedule set"):
        LGreCo(DistributedDataParallel(SmallNet()), r0=2, rank=3)
    with pytest.raises(Exception, match="r0: "):
        LGreCo(DistributedDataParallel(SmallNet()), r0=0)
    with pytest.raises(Exception, match=r"levels\[1\]"):
        PhaseRule(DistributedDataParallel(SmallNet()), boundaries=[1], splits=[1000],
                  levels=[[2, 2], [1]])


# ---- what AdaptiveCompression gives every subclass (main's issues 37, 38 and 40) ------------
def test_successor_objects_check_the_compressor_and_flags_as_accordion_does(one_rank_group):
    from accordion_repro.ddp import LGreCo, PhaseRule
    from accordion_repro.errors import ConfigError

    with pytest.raises(ConfigError, match=r"LGreCo takes 'acp_powersgd', 'powersgd', 'precision' or "
                                          r"'topk' "
                                          r".*did you mean 'acp_powersgd'\?"):
        LGreCo(DistributedDataParallel(SmallNet()), "acp_powerSGD", r0=2)
    with pytest.raises(ConfigError, match="check_levels: must be true or false, got 'no'"):
        PhaseRule(DistributedDataParallel(SmallNet()), check_levels="no", **OBJECTS[
            "phase_rule"][1])


def test_lgreco_accordion_takes_the_relative_lr_drop_and_warns_on_a_continuous_schedule(
        one_rank_group):
    """The detector-driven successor has Accordion's lr_decay_rule: a drop under the threshold
    is no decay, and with True a drop at two epochs in a row warns once."""
    from accordion_repro.ddp import AccordionWarning, LGreCoAccordion

    options = dict(r0=2, low=2, high=1, interval=1)
    obj = LGreCoAccordion(DistributedDataParallel(SmallNet()), lr_decay_rule=0.5, **options)
    obj.end_epoch(0, 0.1, 0.09)
    assert obj.report["lr_rule_fired"] is False
    obj.end_epoch(1, 0.09, 0.009)
    assert obj.report["lr_rule_fired"] is True
    obj = LGreCoAccordion(DistributedDataParallel(SmallNet()), **options)
    with pytest.warns(AccordionWarning, match="LGreCoAccordion: the LR dropped at the end of "
                                              "epochs 0 and 1"):
        for epoch, lr in enumerate((0.1, 0.09, 0.08)):
            obj.end_epoch(epoch, lr, lr * 0.9)


def _successors_under_fsdp_and_across_ranks(rank):
    """Each successor on a fully_shard model (one epoch, levels planned on both ranks alike),
    and a successor whose ranks pass different arguments."""
    from test_fsdp import _shard

    from accordion_repro import ddp as module
    from accordion_repro.errors import ConfigError

    out = {}
    for name, (obj_name, options) in OBJECTS.items():
        torch.manual_seed(0)
        net = _shard(SmallNet(), units=("fc1",))
        obj = getattr(module, obj_name)(net, "powersgd", **options)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(2):
            x, y = _batch(gen)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
        out[name] = obj.end_epoch(0, 0.1, 0.1).levels
    try:
        module.LGreCo(DistributedDataParallel(SmallNet()), r0=2 + rank)
        out["r0"] = "no error"
    except ConfigError as exc:
        out["r0"] = str(exc)
    return out


@pytest.mark.slow
@pytest.mark.distributed
def test_successors_run_under_fsdp_and_refuse_ranks_that_disagree(tmp_path):
    from test_comm_distributed import run_workers

    r0, r1 = run_workers(_successors_under_fsdp_and_across_ranks, tmp_path)
    for name in OBJECTS:
        assert r0[name] == r1[name] and len(r0[name]) == 3
    assert r0["phase_rule"] == [1, 2, 1]
    for rank, out in enumerate((r0, r1)):
        assert out["r0"] == (f"r0: the ranks passed LGreCo different values; rank {rank} "
                             f"passed {2 + rank}: every rank must pass the same arguments")
