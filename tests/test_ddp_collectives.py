"""Our DDP hook issues no more collectives per step than torch's powerSGD_hook (issue 41 item 6).

Counted on 2 gloo ranks by wrapping torch.distributed's collectives
(test_comm_distributed._count_real_collectives): every call that reaches the backend, the
level check included, over one training step after the warm-up. torch's hook runs in one
bucket (with several, its callback-issued all-reduces go out in a different order on each
rank and gloo stops, docs/compressors.md), and issues 3 per bucket: the uncompressed tensors,
P, Q. Ours, per step: the level check, then per bucket P with the dense tensors at the end of
its buffer and Q (PowerSGD), one factor with them (ACP-SGD), or the dense all-reduce and the
all-gather (Top-K, which has no torch counterpart and is held to the same count). Folding
must not change a number: at 2 ranks each element's sum is one addition wherever it sits.
"""

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from test_comm_distributed import SmallNet, _count_real_collectives, run_workers

distributed = pytest.mark.distributed

WARMUP = 3  # torch's hook compresses from its step 2 on; DDP rebuilds its buckets after step 1
VARIANTS = [(compressor, mode) for compressor in ("powersgd", "acp_powersgd", "topk")
            for mode in ("sync", "async")]
OPTIONS = {"powersgd": {"rank": 2}, "acp_powersgd": {"rank": 2}, "topk": {"ratio": 0.3}}
ONE_BUCKET, SMALL_BUCKETS = 1024, 0.002  # MB: every gradient in one bucket; one per tensor


def _batch(rank):
    gen = torch.Generator().manual_seed(rank)
    return torch.randn(8, 3, 8, 8, generator=gen), torch.randint(0, 10, (8,), generator=gen)


def _step(ddp, optimizer, x, y):
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    optimizer.step()


def _counted_step(rank, build_hook, bucket_cap_mb):
    """(collectives of step WARMUP + 1, per bucket the hook saw in it whether it holds a
    matrix and whether it holds a 1-D tensor, the parameters after it)."""
    torch.manual_seed(0)
    model = SmallNet()
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb, broadcast_buffers=False)
    state, hook = build_hook(model)
    buckets = []

    def counting_hook(state, bucket):
        dims = {g.dim() >= 2 for g in bucket.gradients()}
        buckets.append((True in dims, False in dims))
        return hook(state, bucket)

    ddp.register_comm_hook(state, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = _batch(rank)
    for _ in range(WARMUP):
        _step(ddp, optimizer, x, y)
    buckets.clear()
    calls = _count_real_collectives(lambda: _step(ddp, optimizer, x, y))
    return calls, buckets, [p.detach().clone() for p in model.parameters()]


def _ours(compressor, mode, fold=True):
    def build(model):
        from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook

        state = AccordionHookState(model, compressor, async_op=mode == "async",
                                   **OPTIONS[compressor])
        if not fold:  # the packing before item 6: the dense tensors in an all-reduce of their own
            state.reducer._fold_dense = False
        return state, accordion_hook
    return build


def _torch(model):
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as torch_psgd

    state = torch_psgd.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                     start_powerSGD_iter=2, min_compression_rate=1,
                                     use_error_feedback=True, warm_start=True)
    return state, torch_psgd.powerSGD_hook


def _worker(rank):
    results = {"torch": _counted_step(rank, _torch, ONE_BUCKET)[:2]}  # rank 2: all compressed
    for compressor, mode in VARIANTS:
        for cap in (ONE_BUCKET, SMALL_BUCKETS):
            folded = _counted_step(rank, _ours(compressor, mode), cap)
            separate = _counted_step(rank, _ours(compressor, mode, fold=False), cap)
            results[(compressor, mode, cap)] = (folded, separate)
    return results


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    return run_workers(_worker, tmp_path_factory.mktemp("collectives"), timeout=240)


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("compressor,mode", VARIANTS, ids=[f"{c}-{m}" for c, m in VARIANTS])
def test_our_hook_issues_no_more_collectives_per_step_than_torchs(counted, compressor, mode):
    torch_calls, torch_buckets = counted[0]["torch"]
    assert torch_buckets == [(True, True)] and torch_calls == ["all_reduce"] * 3  # 1-D, P, Q
    compressed = {"powersgd": 2, "acp_powersgd": 1, "topk": 1}[compressor]  # P, Q / factor
    carries_dense = compressor != "topk"  # Top-K's all-gather would send them to every rank
    for cap in (ONE_BUCKET, SMALL_BUCKETS):
        (calls, buckets, params), (_, _, separate_params) = counted[0][(compressor, mode, cap)]
        expected = 1 + sum(compressed * matrix + (vector and not (carries_dense and matrix))
                           for matrix, vector in buckets)  # the level check, then per bucket
        assert len(calls) == expected, (cap, buckets, calls)
        assert len(calls) <= len(torch_calls) * len(buckets), (cap, calls)  # torch's, as many
        assert len(buckets) == 1 if cap == ONE_BUCKET else len(buckets) > 1
        # The same numbers as with the dense tensors in their own all-reduce, on both ranks.
        assert all(torch.equal(a, b) for a, b in zip(params, separate_params)), cap
        assert all(torch.equal(a, b) for a, b in zip(params, counted[1][(compressor, mode, cap)][0][2]))
