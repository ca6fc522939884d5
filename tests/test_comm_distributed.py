"""Two real gloo workers: identical averaged gradients, collective counts, the DDP hook."""

import os
import socket
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from accordion_repro.comm import build_reducer
from accordion_repro.utils import adopt_environment
from harness import forked_ranks

pytestmark = pytest.mark.distributed

WORLD = 2
SHAPES = [(6, 4, 3, 3), (6,), (10, 12), (3,), (16, 8)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, fn, port, out_dir, environ):
    adopt_environment(environ)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    try:
        torch.save(fn(rank), os.path.join(out_dir, f"rank{rank}.pt"))
        # Every rank's last collective is done before any rank tears the group down (the README
        # example's sequence): a rank that destroys it while its peer still sends can end in a
        # gloo abort (SIGABRT), seen once in a suite run on a loaded machine.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_workers(fn, tmp_path, timeout=240):
    """Run fn(rank) on 2 gloo ranks; returns [result of rank 0, result of rank 1]. `timeout`
    only catches a hang: spawning two ranks took over 90 s on 2 cores under a load of 13."""
    forked_ranks.context()  # tests/harness/forked_ranks.py: the ranks fork from a preloaded server
    context = mp.start_processes(_entry, args=(fn, free_port(), str(tmp_path), dict(os.environ)),
                                 nprocs=WORLD, join=False, start_method="forkserver")
    try:
        import time

        deadline = time.monotonic() + timeout
        while not context.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail("distributed workers timed out")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


def local_grads(rank, seed=0, shapes=SHAPES):
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    return [torch.randn(*s, generator=gen) for s in shapes]


def dense_average(seed=0, shapes=SHAPES):
    per_rank = [local_grads(r, seed, shapes) for r in range(WORLD)]
    return [sum(parts) / WORLD for parts in zip(*per_rank)]


def _count_real_collectives(fn):
    """Run fn() and count the torch.distributed collectives it really issued."""
    from accordion_repro.comm import collectives

    calls = []
    originals = {name: getattr(dist, name) for name in ("all_reduce", "broadcast", "all_gather")}
    gather = collectives._all_gather_flat

    def counting(name, original):
        def wrapper(*args, **kwargs):
            calls.append(name)
            return original(*args, **kwargs)
        return wrapper

    try:
        for name, original in originals.items():
            setattr(dist, name, counting(name, original))
        collectives._all_gather_flat = counting("all_gather_flat", gather)
        fn()
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
        collectives._all_gather_flat = gather
    return calls


def _reducers_worker(rank):
    result = {}
    # Many layers, one PowerSGD step: still P, Q and one dense buffer only.
    many = [(8, 3, 3, 3), (8,)] * 6 + [(10, 20), (10,)]
    counted = build_reducer("powersgd", local_grads(rank, shapes=many), rank=2)
    result["counted"] = _count_real_collectives(
        lambda: counted.reduce(local_grads(rank, shapes=many)))
    # PowerSGD at a low rank: compressed, identical on both ranks, 3 collectives.
    reducer = build_reducer("powersgd", local_grads(rank), rank=1)
    for step in range(3):
        grads = local_grads(rank, seed=step)
        stats = reducer.reduce(grads, [1, 2, 1] if step == 2 else None)
    result["powersgd"] = (grads, stats, reducer.floats_per_step([1, 2, 1]))
    # PowerSGD whose ranks cover every layer: the dense average exactly (dense path).
    exact = build_reducer("powersgd", local_grads(rank), rank=2)
    grads = local_grads(rank)
    result["exact"] = (grads, exact.reduce(grads, [6, 10, 8]))
    # Low-rank gradients sharing their column space: a compressed rank-2 step is exact.
    gen = torch.Generator().manual_seed(42)
    basis = torch.randn(20, 2, generator=gen)
    mix = torch.randn(2, 30, generator=torch.Generator().manual_seed(rank))
    shared = build_reducer("powersgd", [basis @ mix], rank=2, error_feedback=False)
    grads = [basis @ mix]
    shared.reduce(grads)
    result["shared"] = (grads, basis @ mix)
    # Top-K averaging with error feedback, and the official quirk (sum, no memory).
    for name, official in (("topk", False), ("official", True)):
        topk = build_reducer("topk", local_grads(rank), ratio=0.1, official_topk=official)
        grads = local_grads(rank)
        stats = topk.reduce(grads)
        result[name] = (grads, stats, topk.memory)
    # The same Top-K step with its all-gather in segments of 7 entries: the same numbers.
    segmented = build_reducer("topk", local_grads(rank), ratio=0.1)
    segmented.comm.gloo_segment = 7
    grads = local_grads(rank)
    calls = _count_real_collectives(lambda: result.setdefault("segmented_stats",
                                                               segmented.reduce(grads)))
    result["segmented"] = (grads, calls)
    dense = build_reducer("none", local_grads(rank))
    grads = local_grads(rank)
    result["none"] = (grads, dense.reduce(grads))
    return result


@pytest.mark.slow
def test_reducers_on_two_gloo_ranks(tmp_path):
    r0, r1 = run_workers(_reducers_worker, tmp_path)
    average = dense_average()
    assert sorted(r0["counted"]) == ["all_reduce"] * 3
    for key in ("powersgd", "exact", "shared", "topk", "official", "none"):
        assert all(torch.equal(a, b) for a, b in zip(r0[key][0], r1[key][0])), key

    grads, stats, floats = r0["powersgd"]
    assert stats.collectives == 3 and stats.floats_sent == floats
    # float32 P's, Q's and the dense tensors, each P and Q block padded to 64 bytes (16 floats:
    # comm/powersgd.py PACKING); SHAPES' layers (6, 36), (10, 12), (16, 8) at ranks 1, 2, 1
    def padded(n): return -(-n // 16) * 16
    p_blocks, q_blocks, dense = (6 * 1, 10 * 2, 16 * 1), (36 * 1, 12 * 2, 8 * 1), 6 + 3
    assert floats == sum(p_blocks) + sum(q_blocks) + dense
    assert stats.bytes_sent == 4 * (sum(map(padded, p_blocks + q_blocks)) + dense)
    torch.testing.assert_close(grads[1], dense_average(seed=2)[1])  # 1-D tensors: exact

    grads, stats = r0["exact"]
    for got, want in zip(grads, average):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert stats.collectives == 1

    grads, target = r0["shared"]
    mean = (target + r1["shared"][1]) / 2
    torch.testing.assert_close(grads[0], mean, rtol=1e-4, atol=1e-4)

    for key, divisor in (("topk", WORLD), ("official", 1)):
        grads, stats, memory = r0[key]
        sums = [torch.zeros(s) for s in SHAPES]
        for rank in range(WORLD):
            local = local_grads(rank)
            for index, k in ((0, 21), (2, 12), (4, 12)):
                flat = local[index].view(-1)
                chosen = torch.argsort(flat.abs(), descending=True)[:k]
                sums[index].view(-1)[chosen] += flat[chosen]
        for index in (0, 2, 4):
            torch.testing.assert_close(grads[index], sums[index] / divisor)
        torch.testing.assert_close(grads[1], average[1])
        assert stats.collectives == 2  # one all-gather (values + indices) + one all-reduce
        assert stats.floats_sent == 2 * (21 + 12 + 12) * WORLD + 6 + 3
        assert stats.bytes_sent == 8 * (21 + 12 + 12) + 4 * 9
        assert (memory == [None, None, None]) == (key == "official")

    grads, calls = r0["segmented"]
    assert all(torch.equal(a, b) for a, b in zip(grads, r0["topk"][0]))
    assert all(torch.equal(a, b) for a, b in zip(grads, r1["segmented"][0]))
    # 2 x (21 + 12 + 12) packed entries in pieces of 7, counted as one collective
    assert sorted(calls) == ["all_gather"] * 13 + ["all_reduce"]
    assert r0["segmented_stats"].collectives == 2

    grads, stats = r0["none"]
    for got, want in zip(grads, average):
        torch.testing.assert_close(got, want)
    assert stats.collectives == 1 and stats.bytes_sent == 4 * sum(g.numel() for g in grads)


class SmallNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.norm = torch.nn.BatchNorm2d(8)
        self.fc1 = torch.nn.Linear(8 * 16, 32)
        self.fc2 = torch.nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        x = torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten(1)
        return self.fc2(torch.relu(self.fc1(x)))


def _train(rank, use_hook, compressor, options):
    from torch.nn.parallel import DistributedDataParallel

    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook

    torch.manual_seed(0)
    model = SmallNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    if use_hook:
        state = AccordionHookState(model, compressor=compressor, **options)
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)  # several buckets
        ddp.register_comm_hook(state, accordion_hook)
        net = ddp
    else:
        reducer = build_reducer(compressor, list(model.parameters()), **options)
        net = model
    floats = []
    for step in range(6):
        x, y = torch.randn(8, 3, 8, 8, generator=gen), torch.randint(0, 10, (8,), generator=gen)
        if step == 3:  # a per-layer level switch between steps
            low = 1 if compressor == "powersgd" else 0.05
            if use_hook:
                state.set_level("fc1.weight", low)
                levels = state.levels
            else:
                levels = list(reducer.levels)
                levels[1] = low
                reducer.set_levels(levels)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(net(x), y).backward()
        if use_hook:
            floats.append(state.pop_stats().floats_sent)
        else:
            stats = reducer.reduce([p.grad for p in model.parameters()], reducer.levels)
            floats.append(stats.floats_sent)
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()], floats


def _hook_worker(rank):
    return {name: (_train(rank, True, name, opts), _train(rank, False, name, opts))
            for name, opts in (("powersgd", {"rank": 2}), ("topk", {"ratio": 0.2}))}


@pytest.mark.slow
def test_ddp_hook_trains_like_the_reducer(tmp_path):
    r0, r1 = run_workers(_hook_worker, tmp_path)
    for name in ("powersgd", "topk"):
        (hook_params, hook_floats), (direct_params, direct_floats) = r0[name]
        assert hook_floats == direct_floats and hook_floats[3] < hook_floats[2], name
        for a, b, c in zip(hook_params, direct_params, r1[name][0][0]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
            assert torch.equal(a, c)  # both ranks hold the same model


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
