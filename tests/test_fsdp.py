"""Accordion under FSDP2 (fully_shard): 2 real gloo ranks on the CPU, and one-process refusals.

What is checked (issue 40's acceptance): at levels that cannot compress, FSDP + Accordion gives
the very parameters of plain FSDP; with compression it equals DDP + Accordion on the same seed
and levels (PowerSGD and Top-K, a model of several FSDP units); a saved Accordion state resumes
bit for bit; the report and pop_stats state the error memory and the bytes against FSDP's own
reduce-scatter; bad set-ups stop with one line before training.

The DDP comparison holds bit for bit, with one FSDP unit or several against one DDP bucket or
several: PowerSGD starts every layer's P and Q block on 64 bytes wherever it is packed
(comm/powersgd.py PACKING), so the BLAS products of a layer do not depend on its neighbours.
"""

import re

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from test_comm_distributed import SmallNet, run_workers

distributed = pytest.mark.distributed
OPTIONS = {"powersgd": dict(low=2, high=1), "topk": dict(low=0.2, high=0.05),
           # tests/test_precision_compressor.py trains it through _train
           "precision": dict(low=16, high=8, stochastic_rounding=True, block_size=32)}


def _shard(model, units=("conv", "fc1", "fc2"), mesh=None, **kwargs):
    """fully_shard each named child, then the root (SmallNet's norm stays in the root unit)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = mesh if mesh is not None else init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for name in units:
        fully_shard(getattr(model, name), mesh=mesh, **kwargs)
    return fully_shard(model, mesh=mesh, **kwargs)


def _full(model) -> dict:
    """Every parameter, whole (an FSDP parameter is gathered from its shards)."""
    return {name: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()
            for name, p in model.named_parameters()}


def _batches(rank, steps):
    gen = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(8, 3, 8, 8, generator=gen), torch.randint(0, 10, (8,), generator=gen))
            for _ in range(steps)]


def _train(kind, compressor=None, *, levels=None, epochs=2, steps=3, units=("conv", "fc1", "fc2"),
           bucket_cap_mb=0.01, start=None, stop=None):
    """SmallNet for `epochs` x `steps`, plain FSDP (`compressor` None), FSDP or DDP with
    Accordion (interval 1, so levels move between epochs; `levels`: fixed levels, set after
    each end_epoch). `stop`: return the states after that many epochs; `start`: those states."""
    from accordion_repro.ddp import Accordion

    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = SmallNet()
    if kind == "ddp":
        net = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
    else:
        net = model = _shard(model, units)
    acc = None
    if compressor is not None:
        acc = Accordion(net, compressor, interval=1, **OPTIONS[compressor])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    first = 0
    if start is not None:
        _load(model, optimizer, acc, start)
        first = start["epoch"]
    data = _batches(rank, epochs * steps)
    history = []
    for epoch in range(first, epochs):
        if acc is not None and levels is not None:
            acc.set_levels(levels(acc))
        for x, y in data[epoch * steps:(epoch + 1) * steps]:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(net(x), y).backward()
            optimizer.step()
        if acc is not None:
            stats = acc.pop_stats()
            acc.end_epoch(epoch, lr_now=0.1, lr_next=0.1)
            history.append({"levels": acc.levels, "stats": stats, "report": acc.report})
        if stop is not None and epoch + 1 == stop:
            return _save(model, optimizer, acc, epoch + 1)
    return _full(model), history


def _save(model, optimizer, acc, epoch) -> dict:
    """This rank's training state, as docs/fsdp.md advises: torch's distributed state dict for
    the model and optimizer (whole tensors on every rank), Accordion's own state per rank."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer,
                                              options=StateDictOptions(full_state_dict=True))
    return {"epoch": epoch, "model": model_state, "optimizer": optim_state,
            "accordion": acc.state_dict()}


def _load(model, optimizer, acc, state) -> None:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"],
                   options=StateDictOptions(full_state_dict=True))
    acc.load_state_dict(state["accordion"])


def _whole_levels(acc):
    """A level per layer that cannot compress it (PowerSGD rank >= min(n, m); Top-K 1.0)."""
    reducer = acc.state.reducer
    if reducer.name == "topk":
        return [1.0] * reducer.num_compressible
    return [min(shape) for shape in reducer.matrix_shapes]


def _equivalence_worker(rank):
    import copy

    plain, _ = _train("fsdp")
    out = {"plain": plain}
    for compressor in ("powersgd", "topk"):
        out[f"{compressor}_whole"] = _train("fsdp", compressor, levels=_whole_levels)
        out[f"{compressor}_fsdp"] = _train("fsdp", compressor)
        out[f"{compressor}_ddp"] = _train("ddp", compressor)
    # packed alike: one FSDP unit (the root), one DDP bucket
    out["powersgd_fsdp_one_unit"] = _train("fsdp", "powersgd", units=())
    out["powersgd_ddp_one_bucket"] = _train("ddp", "powersgd", bucket_cap_mb=100)
    # exact resume: 2 of 3 epochs, the state saved and loaded into a fresh model
    for compressor in ("powersgd", "topk"):
        saved = copy.deepcopy(_train("fsdp", compressor, epochs=3, stop=2))
        out[f"{compressor}_straight"] = _train("fsdp", compressor, epochs=3)
        out[f"{compressor}_resumed"] = _train("fsdp", compressor, epochs=3, start=saved)
    # ranks that disagree on the levels: one line at the next training forward
    from accordion_repro.comm import LevelMismatchError
    from accordion_repro.ddp import Accordion

    torch.manual_seed(0)
    model = _shard(SmallNet())
    acc = Accordion(model, "powersgd", low=2, high=1)
    acc.set_level("fc1.weight", 1 + rank)
    x, y = _batches(rank, 1)[0]
    try:
        model(x)
        out["mismatch"] = None
    except LevelMismatchError as exc:
        out["mismatch"] = str(exc)
    # a trainable parameter the forward pass never uses: named when its unit reduces
    from accordion_repro.comm.fsdp import FSDPSetupError

    torch.manual_seed(0)
    net = SmallNet()
    net.fc1.unused = torch.nn.Parameter(torch.zeros(6))
    model = _shard(net)
    Accordion(model, "powersgd", low=2, high=1)
    try:
        torch.nn.functional.cross_entropy(model(x), y).backward()
        out["unused"] = None
    except FSDPSetupError as exc:
        out["unused"] = str(exc)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_workers(_equivalence_worker, tmp_path_factory.mktemp("fsdp"), timeout=300)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("compressor", ["powersgd", "topk"])
def test_non_compressing_levels_give_plain_fsdp_bit_for_bit(results, compressor):
    for out in results:
        params, history = out[f"{compressor}_whole"]
        assert _same(params, out["plain"])
        stats = history[0]["stats"]
        assert stats.uncompressed_layers == 3 * 3  # 3 layers, 3 steps
        assert stats.bytes_sent == stats.fsdp_reduce_scatter_bytes  # the same reduce-scatter
    assert _same(results[0]["plain"], results[1]["plain"])


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("compressor", ["powersgd", "topk"])
def test_fsdp_accordion_equals_ddp_accordion(results, compressor):
    for out in results:
        fsdp, fsdp_history = out[f"{compressor}_fsdp"]
        ddp, ddp_history = out[f"{compressor}_ddp"]
        assert [h["levels"] for h in fsdp_history] == [h["levels"] for h in ddp_history]
        assert fsdp_history[0]["levels"] != fsdp_history[-1]["levels"]  # the detector acted
        for f, d in zip(fsdp_history, ddp_history):
            assert f["stats"].floats_sent == d["stats"].floats_sent
            assert f["stats"].bytes_sent < f["stats"].fsdp_reduce_scatter_bytes
        assert _same(fsdp, ddp)
    assert _same(results[0][f"{compressor}_fsdp"][0], results[1][f"{compressor}_fsdp"][0])


@pytest.mark.slow
@distributed
def test_packed_alike_fsdp_and_ddp_powersgd_agree_bit_for_bit(results):
    for out in results:
        assert _same(out["powersgd_fsdp_one_unit"][0], out["powersgd_ddp_one_bucket"][0])


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("compressor", ["powersgd", "topk"])
def test_saved_state_resumes_fsdp_accordion_bit_for_bit(results, compressor):
    for out in results:
        straight, straight_history = out[f"{compressor}_straight"]
        resumed, resumed_history = out[f"{compressor}_resumed"]
        assert _same(straight, resumed)
        assert straight_history[-1]["levels"] == resumed_history[-1]["levels"]


@pytest.mark.slow
@distributed
def test_report_states_error_memory_and_pop_stats_the_fsdp_baseline(results):
    model = SmallNet()
    layers = {"conv.weight", "fc1.weight", "fc2.weight"}
    whole_layers = 4 * sum(p.numel() for n, p in model.named_parameters() if n in layers)
    # FSDP's reduce-scatter input: every parameter padded to an even split over 2 ranks
    padded = 4 * sum(-(-p.shape[0] // 2) * 2 * p[0].numel() for p in model.parameters())
    for out in results:
        for compressor in ("powersgd", "topk"):
            _, history = out[f"{compressor}_fsdp"]
            assert history[0]["report"]["error_memory_bytes"] == whole_layers
            assert history[0]["stats"].fsdp_reduce_scatter_bytes == 3 * padded
        assert out["powersgd_whole"][1][0]["report"]["error_memory_bytes"] == 0


@pytest.mark.slow
@distributed
def test_a_parameter_without_a_gradient_is_named_in_one_line(results):
    for rank in results:
        message = rank["unused"]
        assert message is not None and "\n" not in message, message
        assert message.startswith("trainable parameter(s) fc1.unused got no gradient"), message


@pytest.mark.slow
@distributed
def test_ranks_with_different_levels_stop_with_one_line(results):
    for out in results:
        message = out["mismatch"]
        assert message is not None and "compression levels differ between ranks" in message
        assert "\n" not in message


# ---- FSDP2's parameter all-gathers in segments (comm/fsdp.py SegmentedAllGather) ---------------
SEGMENT = 7  # elements: every SmallNet unit's all-gather travels in many pieces, one ragged


def _plain_fsdp(segmented: bool):
    """Plain FSDP, 2 epochs x 3 steps; `segmented`: every unit's all-gather a SegmentedAllGather
    in SEGMENT-element pieces. The parameters and the installed all-gather (or None)."""
    from accordion_repro.comm.fsdp import segment_all_gathers

    rank = torch.distributed.get_rank()
    torch.manual_seed(0)
    model = _shard(SmallNet())
    comm = None
    if segmented:
        comm = segment_all_gathers(model)
        comm.segment = SEGMENT
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for x, y in _batches(rank, 6):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return _full(model), comm


def _all_gather_worker(rank):
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    from accordion_repro.comm.fsdp import SegmentedAllGather, fsdp_units
    from accordion_repro.ddp import Accordion
    from accordion_repro.engine.sharding import shard_model

    def installed(model):  # each unit's all-gather (a unit holding no parameter has none)
        return [type(group._all_gather_comm).__name__ for unit in fsdp_units(model)
                for group in unit._get_fsdp_state()._fsdp_param_groups]

    out = {"default": _plain_fsdp(False)[0]}
    out["segmented"], comm = _plain_fsdp(True)
    out["segmented_stats"] = (comm.stats.allgathers, comm.stats.allgather_bytes)
    torch.manual_seed(0)
    out["trainer_units"] = installed(shard_model(SmallNet(), torch.device("cpu")))
    own = _shard(SmallNet())
    Accordion(own, "powersgd", low=2, high=1)
    out["own_code_units"] = installed(own)
    # the collective itself, as FSDP calls it: input = this rank's slice of the output buffer
    group, n = torch.distributed.group.WORLD, 100
    local = torch.arange(n, dtype=torch.float32) + 1000 * rank
    for name, comm, async_op in (("plain", DefaultAllGather(), False),
                                 ("segmented_sync", SegmentedAllGather(SEGMENT), False),
                                 ("segmented_async", SegmentedAllGather(SEGMENT), True)):
        output = comm.allocate((2 * n,), dtype=torch.float32, device=torch.device("cpu"))
        output[rank * n:(rank + 1) * n].copy_(local)
        work = comm(output, output[rank * n:(rank + 1) * n], group, async_op=async_op)
        if work is not None:
            assert isinstance(work, torch.distributed.distributed_c10d.Work)
            work.wait()
        out[name] = output
    return out


@pytest.fixture(scope="module")
def all_gather_results(tmp_path_factory):
    return run_workers(_all_gather_worker, tmp_path_factory.mktemp("fsdp_all_gather"))


@pytest.mark.slow
@distributed
def test_segmented_all_gather_leaves_plain_fsdp_bit_for_bit(all_gather_results):
    model = SmallNet()
    # per step each unit gathers its shards before its forward and again before its backward,
    # except the root (the norm), which FSDP keeps unsharded between the two
    shard = {name: sum(4 * -(-p.shape[0] // 2) * p[0].numel() for p in module.parameters())
             for name, module in (("conv", model.conv), ("fc1", model.fc1), ("fc2", model.fc2),
                                  ("root", model.norm))}
    calls, nbytes = 6 * 7, 6 * (2 * (shard["conv"] + shard["fc1"] + shard["fc2"]) + shard["root"])
    for out in all_gather_results:
        assert _same(out["default"], out["segmented"])
        assert out["segmented_stats"] == (calls, nbytes)


@pytest.mark.slow
@distributed
def test_trainer_and_own_code_install_the_segmented_all_gather_equal_to_plain(all_gather_results):
    expected = torch.cat([torch.arange(100.0), torch.arange(100.0) + 1000])
    for out in all_gather_results:
        assert out["trainer_units"] == ["SegmentedAllGather"] * 4  # conv, norm, fc1, fc2
        assert out["own_code_units"] == ["SegmentedAllGather"] * 4
        assert torch.equal(out["plain"], expected)
        assert torch.equal(out["segmented_sync"], expected)
        assert torch.equal(out["segmented_async"], expected)


# ---- one process: set-ups refused before training -----------------------------------------------
def _hybrid(model):
    from torch.distributed.device_mesh import init_device_mesh

    return _shard(model, mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("rep", "shard")))


def _fp16_reduction(model):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    return _shard(model, mp_policy=MixedPrecisionPolicy(param_dtype=torch.float16))


def _divide_factor(model):
    model = _shard(model)
    model.set_gradient_divide_factor(3.0)
    return model


def _fsdp1(model):
    from torch.distributed.fsdp import FullyShardedDataParallel

    return FullyShardedDataParallel(model, device_id=torch.device("cpu"))


REFUSED = {
    "fsdp1_wrapper": (_fsdp1, "not the FullyShardedDataParallel wrapper (FSDP1)"),
    "hybrid_sharding": (_hybrid, "hybrid sharding (HSDP, a 2-D mesh) is not supported"),
    "fp16_reduction": (_fp16_reduction, "float16 gradient reduction is not supported"),
    "divide_factor": (_divide_factor, "set_gradient_divide_factor"),
    "not_wrapped": (lambda model: model, "DistributedDataParallel-wrapped model or a model "
                                         "wrapped with fully_shard"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_unsupported_fsdp_setups_are_refused_with_one_line(one_rank_group, case):
    from accordion_repro.ddp import Accordion

    wrap, expected = REFUSED[case]
    with pytest.raises((ValueError, TypeError)) as caught:
        Accordion(wrap(SmallNet()), "powersgd", low=2, high=1)
    message = str(caught.value)
    assert expected in message and "\n" not in message, message


@pytest.mark.parametrize("backend, installed", [("gloo", True), ("nccl", False)])
def test_the_segmented_all_gather_goes_only_where_gloo_gathers(one_rank_group, monkeypatch,
                                                               backend, installed):
    """Over NCCL a custom all-gather gains nothing and breaks set_symm_mem_for_comm(); the
    backend is what the unit's all-gather group reports (NCCL pretended here)."""
    from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather

    from accordion_repro.comm import fsdp as comm_fsdp

    model = _shard(SmallNet())
    monkeypatch.setattr(comm_fsdp.dist, "get_backend", lambda group=None: backend)
    comm_fsdp.segment_all_gathers(model)
    kinds = {type(unit._get_fsdp_state()._fsdp_param_groups[0]._all_gather_comm)
             for unit in comm_fsdp.fsdp_units(model)}
    assert kinds == ({comm_fsdp.SegmentedAllGather} if installed else {DefaultAllGather})


def test_async_op_under_fsdp_is_refused_in_one_line(one_rank_group):
    from accordion_repro.ddp import Accordion

    with pytest.raises(TypeError) as caught:
        Accordion(_shard(SmallNet()), "powersgd", low=2, high=1, async_op=True)
    message = str(caught.value)
    assert "async_op=...) is DDP's only" in message and "\n" not in message


def test_a_one_rank_fsdp_model_is_named_as_compressing_nothing(one_rank_group):
    from accordion_repro.ddp import Accordion, AccordionWarning

    with pytest.warns(AccordionWarning, match="sharded over 1 rank, so no gradient is reduced"):
        Accordion(_shard(SmallNet()), "powersgd", low=2, high=1)


def test_a_child_unit_passed_instead_of_the_root_is_refused_at_the_first_forward(one_rank_group):
    import warnings

    from accordion_repro.comm.fsdp import FSDPSetupError
    from accordion_repro.ddp import Accordion

    model = _shard(SmallNet())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the one-rank warning
        Accordion(model.fc1, "powersgd", low=2, high=1)
    x, _ = _batches(0, 1)[0]
    with pytest.raises(FSDPSetupError) as caught:
        model(x)
    message = str(caught.value)
    assert "not the root of its model" in message and "\n" not in message


# ---- the trainer: dist.strategy=fsdp ------------------------------------------------------------
CONFIG_REFUSED = {
    "unknown_strategy": (["dist.strategy=hsdp"], "dist.strategy", "must be one of ddp, fsdp"),
    "one_rank": (["dist.strategy=fsdp", "dist.nproc_per_node=1"], "dist.strategy",
                 "fsdp needs 2 or more ranks"),
    "fp16_loss_scaling": (["dist.strategy=fsdp", "dist.nproc_per_node=2", "trainer.precision=fp16"],
                          "trainer.precision", "fp16 is not supported under dist.strategy=fsdp"),
}


@pytest.mark.parametrize("case", sorted(CONFIG_REFUSED))
def test_trainer_refuses_what_fsdp_cannot_shard_before_any_rank_starts(case):
    from accordion_repro.config import validate
    from accordion_repro.errors import ConfigError
    from conftest import compose_cfg

    overrides, key, expected = CONFIG_REFUSED[case]
    with pytest.raises(ConfigError) as caught:
        validate(compose_cfg(["dataset=synthetic_cifar10", *overrides]))
    assert caught.value.key == key and expected in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("version, refused", [("2.8.1", True), ("2.9.0", False)],
                         ids=["torch_2.8", "torch_2.9"])
def test_fsdp_on_a_torch_without_custom_collectives_is_refused_in_one_line(monkeypatch, version,
                                                                           refused):
    """A torch older than pytorch#155189 lacks what the compression inside FSDP plugs into:
    refused before any rank starts, naming the version it needs (not an AttributeError inside
    the ranks)."""
    from accordion_repro.config import validate
    from accordion_repro.errors import ConfigError
    from conftest import compose_cfg

    monkeypatch.setattr(torch, "__version__", version)
    cfg = compose_cfg(["dataset=synthetic_cifar10", "dist.strategy=fsdp", "dist.nproc_per_node=2"])
    if not refused:
        assert validate(cfg).dist.strategy == "fsdp"
        return
    with pytest.raises(ConfigError, match=r"^dist.strategy: fsdp .*needs torch >= 2.9; this is "
                                          r"torch 2.8.1: install a newer torch, or use "
                                          r"dist.strategy=ddp$"):
        validate(cfg)


def test_own_code_accordion_on_fsdp_with_a_torch_too_old_is_refused_in_one_line(one_rank_group,
                                                                                monkeypatch):
    from accordion_repro.comm.fsdp import FSDPSetupError
    from accordion_repro.ddp import Accordion

    model = _shard(SmallNet())
    monkeypatch.setattr(torch, "__version__", "2.8.1")
    with pytest.raises(FSDPSetupError, match=r"needs torch >= 2.9; this is torch 2.8.1: install "
                                              r"a newer torch, or wrap the model in DDP$"):
        Accordion(model, "powersgd", low=2, high=1)


TRAINER_RUN = ["model=resnet18", "model.width=0.25", "dataset=synthetic_cifar10",
               "dataset.train_size=48", "dataset.test_size=16", "trainer.batch_size=8",
               "trainer.eval_batch_size=16", "dist.nproc_per_node=2", "trainer.epochs=2",
               "trainer.max_steps_per_epoch=2", "trainer.max_eval_steps=1",
               "optim.warmup_epochs=0", "trainer.checkpoint=false"]
TIMES = ("epoch_time_s", "compute_time_s", "comm_time_s")


LSTM_RUN = ["model=lstm", "model.num_layers=1", "model.hidden_size=16", "model.embedding_size=16",
            "model.dropout=0.0", "optim=lstm", "dataset=synthetic_text", "dataset.vocab_size=50",
            "dataset.train_tokens=4000", "dataset.eval_tokens=400", "dataset.bptt=10",
            "dist.nproc_per_node=2", "trainer.batch_size=4", "trainer.epochs=2",
            "trainer.max_steps_per_epoch=3", "trainer.max_eval_steps=1", "optim.warmup_epochs=0",
            "optim.lr=0.5", "trainer.checkpoint=false"]
TRAINER_CASES = {
    "dense": [*TRAINER_RUN],
    "powersgd": [*TRAINER_RUN, "compressor=powersgd", "schedule=accordion", "schedule.low=2",
                 "schedule.high=1", "schedule.interval=1"],
    # optim=lstm clips each rank's local gradient (clip_point=local): one unit, clipped inside
    "lstm_clip_local": [*LSTM_RUN],
}


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("case", sorted(TRAINER_CASES))
def test_trainer_under_fsdp_logs_what_it_logs_under_ddp(tmp_path, case, rank_pool):
    """The same run under both strategies logs the same metrics to the last bit (issue 55): the
    reduce-scatter averages what the all-reduce averages; the rank that evaluates only because
    an FSDP forward needs every rank keeps its random streams; local clipping sees the same
    whole local gradient; PowerSGD packs its blocks alike on both paths (comm/powersgd.py
    PACKING: before, the trainer's DDP path packed them end to end and the two parted by 2.3e-3
    in train_loss after 6 steps). Only the collectives' count differs: one reduction per unit."""
    from conftest import read_metrics, train_in_pool

    runs = {strategy: read_metrics(train_in_pool(
                rank_pool, [*TRAINER_CASES[case], f"dist.strategy={strategy}"], tmp_path / strategy))
            for strategy in ("ddp", "fsdp")}
    assert len(runs["ddp"]) == len(runs["fsdp"]) == 2
    for ddp, fsdp in zip(runs["ddp"], runs["fsdp"]):
        assert fsdp["collectives"] >= ddp["collectives"]  # one reduction per unit, not per step
        for key in set(ddp) - set(TIMES) - {"collectives"}:
            assert ddp[key] == fsdp[key], key


# ---- docs/fsdp.md's own-code example, verbatim under torchrun -----------------------------------
def fsdp_example() -> str:
    """The python block of docs/fsdp.md's "In your own code" section."""
    from conftest import REPO

    text = (REPO / "docs" / "fsdp.md").read_text()
    section = text.split("## In your own code", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow
@distributed
def test_docs_example_runs_under_torchrun_and_resumes(tmp_path):
    import os
    import subprocess
    import sys

    from test_comm_distributed import free_port

    example = tmp_path / "fsdp_example.py"
    example.write_text(fsdp_example())

    def run(epochs):
        env = dict(os.environ, EPOCHS=str(epochs), STEPS="3", OMP_NUM_THREADS="1")
        done = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
             "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(example)],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
        return [line for line in done.stdout.splitlines() if line.startswith("epoch ")]

    first = run(2)
    assert [line.split(":")[0] for line in first] == ["epoch 0", "epoch 1"]
    sent, alone = (int(w) for w in re.findall(r"sent (\d+) bytes \(FSDP alone: (\d+)\)",
                                              first[0])[0])
    assert 0 < sent < alone
    assert "error memory 0 bytes" not in first[0]
    resumed = run(4)  # picks up the per-rank checkpoints of epoch 1
    assert [line.split(":")[0] for line in resumed] == ["epoch 2", "epoch 3"]


@pytest.mark.slow
@distributed
def test_an_fsdp_step_warns_no_deprecation(tmp_path):
    """torch 2.14 deprecates reduce_scatter_tensor with a FutureWarning that every FSDP run
    printed; the dense tensors' reduce-scatter now uses reduce_scatter_single."""
    out = run_workers(_deprecation_worker, tmp_path, timeout=240)
    assert out == [[], []]


def _deprecation_worker(rank):
    import warnings

    from accordion_repro.ddp import Accordion

    torch.manual_seed(0)
    model = _shard(SmallNet())
    Accordion(model, "powersgd", low=2, high=2)  # rank 2: SmallNet's small layers go dense
    x, y = _batches(rank, 1)[0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.nn.functional.cross_entropy(model(x), y).backward()
    return [str(w.message) for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))]
