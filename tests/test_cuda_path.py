"""The CUDA path's risks (issue 38), guarded on the CPU: the numbers stay those of the CPU path.

- Top-K sums the ranks' values in rank order, one index_add_ per rank (each with distinct
  indices: no atomic races on CUDA), bit for bit the single CPU index_add_ of before;
- Top-K off the CPU takes no torch.nonzero (a host read) on its way to the top k;
- the level check and rank 0's decision travel as CPU tensors on a gloo group (no GPU sync, no
  current device), also when the model's group is NCCL;
- torch.compile of the DDP model leaves the level check out, with no graph-break warning;
- checkpoint parts are on the CPU before they are gathered to rank 0;
- host-to-device copies are pinned and asynchronous for CUDA; the trainer's phase clock syncs
  once per epoch on CUDA and the trainer's step loop reads nothing back per step.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from accordion_repro.comm import collectives
from accordion_repro.comm.topk import add_in_rank_order, topk_indices
from accordion_repro.engine import checkpoint
from accordion_repro.engine.clock import PhaseClock
from accordion_repro.transfer import host_to_device
from conftest import REPO
from test_comm_distributed import SmallNet


# ---- Top-K ------------------------------------------------------------------------------------
@pytest.mark.parametrize("world", [2, 3, 4])
def test_topk_rank_order_sum_is_the_single_cpu_index_add_bit_for_bit(world):
    gen = torch.Generator().manual_seed(world)
    n, k = 1000, 300  # many shared indices between ranks
    indices = torch.stack([torch.randperm(n, generator=gen)[:k] for _ in range(world)]).int()
    values = torch.randn(world, k, generator=gen) * torch.logspace(-6, 6, k)
    before = torch.zeros(n).index_add_(0, indices.reshape(-1), values.reshape(-1))
    now = torch.zeros(n)
    add_in_rank_order(now, indices, values)
    assert torch.equal(before.view(torch.int32), now.view(torch.int32))


def test_topk_sums_a_shared_index_in_rank_order_one_distinct_set_per_call(monkeypatch):
    seen = []
    original = torch.Tensor.index_add_

    def recording(self, dim, index, source, **kw):
        seen.append(index.tolist())
        return original(self, dim, index, source, **kw)

    monkeypatch.setattr(torch.Tensor, "index_add_", recording)
    flat = torch.zeros(4)
    # float32: (1e8 + 1) - 1e8 = 0 in rank order; any other order gives 1
    add_in_rank_order(flat, torch.tensor([[2, 0], [2, 1], [2, 3]], dtype=torch.int32),
                      torch.tensor([[1e8, 5.0], [1.0, 6.0], [-1e8, 7.0]]))
    assert flat.tolist() == [5.0, 6.0, 0.0, 7.0]
    assert seen == [[2, 0], [2, 1], [2, 3]] and all(len(set(s)) == len(s) for s in seen)


def test_topk_off_the_cpu_takes_no_host_read(monkeypatch):
    # meta tensors have no data: torch.nonzero (a host read, a sync on CUDA) cannot run on them
    values = torch.empty(1 << 17, device="meta")
    assert topk_indices(values, 100).shape == (100,)
    assert topk_indices(values, (1 << 17) - 100).shape == ((1 << 17) - 100,)


# ---- the level check and the decision on a CPU group -------------------------------------------
class _NcclLooking:
    """torch.distributed as collectives.py sees it, with the model's group reporting NCCL."""

    def __init__(self, record):
        self.record = record

    def __getattr__(self, name):
        return getattr(dist, name)

    def get_backend(self, group=None):
        return "nccl"

    def new_group(self, *args, **kwargs):
        self.record.append(("new_group", args, kwargs))
        return dist.new_group(backend="gloo")

    def all_reduce(self, tensor, *args, **kwargs):
        self.record.append(("all_reduce", tensor.device.type, tensor.dtype, kwargs.get("group")))
        return dist.all_reduce(tensor, *args, **kwargs)

    def broadcast_object_list(self, payload, *args, **kwargs):
        self.record.append(("broadcast_object_list", kwargs.get("group"), kwargs.get("device")))
        return dist.broadcast_object_list(payload, *args, **kwargs)


def test_level_check_and_decision_use_cpu_tensors_on_a_gloo_group_under_nccl(one_rank_group,
                                                                           monkeypatch):
    from accordion_repro.ddp import Accordion

    record = []
    monkeypatch.setattr(collectives, "dist", _NcclLooking(record))
    torch.manual_seed(0)
    ddp = DistributedDataParallel(SmallNet())
    acc = Accordion(ddp, "powersgd", low=2, high=1)
    made = [r for r in record if r[0] == "new_group"]
    assert len(made) == 1 and made[0][2] == {"backend": "gloo"}  # once, when Accordion is built
    control = acc._control
    assert control is not None and control is not dist.group.WORLD
    record.clear()  # construction compared the arguments across the ranks once
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 10, (8,))
    for _ in range(3):
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
    acc.end_epoch(0, 0.1, 0.1)
    checks = [r for r in record if r[0] == "all_reduce" and r[2] == torch.int64]
    assert len(checks) == 4  # one per training forward, one in end_epoch
    assert all(r[1:] == ("cpu", torch.int64, control) for r in checks)
    assert [r for r in record if r[0] == "broadcast_object_list"] == [
        ("broadcast_object_list", control, None)]
    assert [r for r in record if r[0] == "new_group"] == []  # made once at construction, kept


def test_a_gloo_group_is_its_own_control_group(one_rank_group):
    # never None: the trainer reads None as "not distributed" and would skip its agreements
    assert collectives.control_group() is dist.group.WORLD


@pytest.mark.slow
def test_torch_compile_of_the_ddp_model_breaks_no_graph_at_the_level_check(tmp_path):
    script = textwrap.dedent(f"""
        import torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from accordion_repro.ddp import Accordion
        from accordion_repro.models import build_model
        dist.init_process_group("gloo", init_method="file://{tmp_path / 'store'}", rank=0,
                                world_size=1)
        ddp = DistributedDataParallel(build_model("resnet18", num_classes=10, width=0.125))
        acc = Accordion(ddp, "powersgd", low=2, high=1)
        compiled = torch.compile(ddp, backend="eager")
        for _ in range(2):
            compiled(torch.randn(4, 3, 32, 32)).sum().backward()
        print("trained")
        dist.destroy_process_group()
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0 and done.stdout.strip() == "trained", done.stderr[-2000:]
    for text in ("Graph break", "max_and_min", "check_agreement", "crc32"):
        assert text not in done.stderr, done.stderr[-3000:]


# ---- checkpoints, copies, the trainer's clock -----------------------------------------------
def test_checkpoint_parts_are_moved_to_the_cpu_before_they_are_gathered(one_rank_group,
                                                                      monkeypatch, tmp_path):
    gathered = []

    def gather_object(obj, parts, dst=0, **kw):
        gathered.append(obj)
        parts[0] = obj

    moved = []

    def cpu(self):  # a meta tensor stands in for rank k's CUDA memory
        moved.append(self.device.type)
        return torch.zeros(self.shape)

    monkeypatch.setattr(dist, "gather_object", gather_object)
    monkeypatch.setattr(torch.Tensor, "cpu", cpu)
    checkpoint.save(tmp_path, {"epoch": 0}, {"reducer": {"memory": [torch.empty(3, device="meta"),
                                                                   None, torch.ones(2)]}})
    [part] = gathered
    assert moved == ["meta"]
    assert [m.device.type for m in part["reducer"]["memory"] if m is not None] == ["cpu", "cpu"]


def test_host_to_device_pins_and_queues_cuda_copies_and_leaves_cpu_tensors_alone(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.Tensor, "pin_memory", lambda self: calls.append("pin") or self)
    monkeypatch.setattr(torch.Tensor, "to",
                        lambda self, *a, **kw: calls.append(("to", str(a[0]), kw)) or self)
    host_to_device(torch.zeros(2), torch.device("cuda", 1))
    assert calls == ["pin", ("to", "cuda:1", {"non_blocking": True})]
    calls.clear()
    host_to_device(torch.zeros(2), torch.device("cpu"))
    assert calls == [("to", "cpu", {})]


class _FakeEvent:
    synchronized = 0

    def __init__(self, enable_timing):
        assert enable_timing

    def record(self):
        pass

    def synchronize(self):
        _FakeEvent.synchronized += 1

    def elapsed_time(self, other):
        return 500.0


def test_phase_clock_on_cuda_records_events_and_syncs_once_when_asked(monkeypatch):
    syncs = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(a))
    _FakeEvent.synchronized = 0
    clock = PhaseClock(torch.device("cuda", 0))
    for _ in range(10):
        clock.timed("compute", lambda: None)
        clock.timed("comm", lambda: None)
    assert syncs == [] and _FakeEvent.synchronized == 0
    assert clock.totals() == {"compute": 5.0, "comm": 5.0}
    assert _FakeEvent.synchronized == 1 and syncs == []


def _host_reads_in_an_epoch(monkeypatch, tmp_path, steps: int) -> dict:
    """Host reads (.item(), int(), float(), bool(), .tolist()) and device syncs in one epoch of
    the real trainer, one process on the CPU."""
    from accordion_repro.config import validate
    from accordion_repro.engine import trainer as trainer_module
    from conftest import compose_cfg

    run = validate(compose_cfg([
        "model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10",
        "dataset.pipeline=device",  # the GPU's pipeline (the PIL one reads host tensors)
        "dataset.train_size=256", "dataset.test_size=64", "compressor=topk", "schedule=accordion",
        "schedule.low=0.1", "schedule.high=0.01",
        "trainer.epochs=1", "trainer.batch_size=8", f"trainer.max_steps_per_epoch={steps}",
        "trainer.max_eval_steps=1", "trainer.checkpoint=false", "logger.wandb.mode=disabled",
        "trainer.progress=never"]))
    counts = {}

    def counting(name, original):
        def wrapper(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return original(*args, **kwargs)
        return wrapper

    trainer = trainer_module.Trainer(run, tmp_path / f"run{steps}")
    for name in ("item", "tolist", "__int__", "__float__", "__bool__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, counting(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(trainer_module, "_sync", counting("sync", trainer_module._sync))
    trainer._train_epoch(0)
    monkeypatch.undo()
    return counts


def test_the_trainers_step_loop_reads_nothing_back_per_step(monkeypatch, tmp_path):
    two = _host_reads_in_an_epoch(monkeypatch, tmp_path, 2)
    five = _host_reads_in_an_epoch(monkeypatch, tmp_path, 5)
    assert two == five, f"host reads grow with the steps: {two} for 2 steps, {five} for 5"


# ---- the asynchronous hook's final phase ------------------------------------------------------
class _SyncLoggingFuture(torch.futures.Future):
    """A completed work Future whose wait() (a stream sync for CUDA futures) is logged."""

    def __init__(self, name, log):
        super().__init__()
        self.name, self.log = name, log
        self.set_result(None)

    def wait(self):
        self.log.append(f"sync {self.name}")
        return super().wait()


class _LoggingWork:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait(self):
        self.log.append(f"wait {self.name}")

    def get_future(self):
        return _SyncLoggingFuture(self.name, self.log)


def test_decompression_waits_on_each_final_collectives_future_first():
    """collect_all's callback has no stream synchronised with NCCL: the final phase's own work
    Futures are waited on (non-blocking on CUDA) before the local decompression runs."""
    from accordion_repro.comm.base import Phase
    from accordion_repro.comm.ddp_hook import BucketPipeline

    log = []

    def reduction():
        yield Phase([_LoggingWork("P", log)], False)
        yield Phase([_LoggingWork("Q", log), _LoggingWork("dense", log)], True)
        log.append("decompress")

    future = BucketPipeline().submit(reduction(), lambda: torch.zeros(1), last=True)
    assert future.done() and log == ["wait P", "sync Q", "sync dense", "decompress"]
