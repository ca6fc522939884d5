"""The precision compressor (comm/precision.py): per-layer fp32 / bf16 / fp8 on the wire, fp32 sums.

Not tests/test_precision.py, which is about the trainer's bf16/fp16 autocast. What is checked: the
fp32 level is plain DDP bit for bit (2 gloo ranks); bf16 and fp8 levels stay within their stated
bound of an fp64 mean and bf16 beats torch's bf16_compress_hook (4 gloo ranks); floats and bytes
are the formula; ranks that disagree on the levels stop in one line; a saved state resumes bit
for bit with stochastic rounding; the settings refuse bad levels naming the key.
"""

import io
import math
import os

import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from accordion_repro.comm import build_reducer, validate_compressor
from accordion_repro.comm.config import PrecisionBits, check_level
from accordion_repro.comm.registry import level_kind
from accordion_repro.comm.precision import FORMATS, decode, encode
from accordion_repro.errors import ConfigError
from accordion_repro.utils import adopt_environment
from harness import forked_ranks
from test_comm_distributed import SmallNet, free_port, run_workers

distributed = pytest.mark.distributed


# ---- one process: the level, the encodings, the formula --------------------------------------
def test_levels_are_bits_and_a_bad_one_is_refused_naming_the_key():
    assert level_kind("precision") is PrecisionBits
    assert [check_level(PrecisionBits, v, "k") for v in (32, 16, 8, "fp32", "BF16", "fp8")] == \
        [32, 16, 8, 32, 16, 8]
    for bad in (4, 12, 8.0, "fp16", True):
        with pytest.raises(ConfigError, match=r"^compressor\.bits: the precision level"):
            validate_compressor("precision", {"bits": bad})
    with pytest.raises(ConfigError, match=r"^compressor\.fp8_format: must be one of e4m3, e5m2"):
        validate_compressor("precision", {"bits": 8, "fp8_format": "e3m4"})
    reducer = build_reducer("precision", [torch.zeros(4, 4)], bits=16)
    with pytest.raises(ConfigError, match=r"^compressor\.bits: .* got 7"):
        reducer.set_levels([7])


def test_a_schedule_switches_between_any_two_levels_and_refuses_a_wider_high():
    from accordion_repro.accordion import build_schedule

    for low, high in ((32, 8), (16, 8), (32, 16), ("fp32", "bf16")):
        schedule = build_schedule("accordion", num_layers=3, compressor="precision",
                                  default_level=None, base_global_batch=None, world_size=2,
                                  low=low, high=high)
        assert schedule.initial_plan().levels == [check_level(PrecisionBits, low, "")] * 3
    with pytest.raises(ConfigError, match=r"^schedule\.high: 32 compresses less"):
        build_schedule("accordion", num_layers=3, compressor="precision", default_level=None,
                       base_global_batch=None, world_size=2, low=8, high=32)
    with pytest.raises(ConfigError, match="chooses PowerSGD ranks, but compressor 'precision'"):
        build_schedule("lgreco", num_layers=3, compressor="precision", default_level=None,
                       base_global_batch=None, world_size=2, r0=2,
                       layer_shapes=[(4, 4)] * 3)
    with pytest.raises(ConfigError, match=r"^schedule\.name: schedule 'auto' chooses PowerSGD "
                                          r"ranks or Top-K fractions .* 'precision' takes"):
        build_schedule("auto", num_layers=3, compressor="precision", default_level=None,
                       base_global_batch=None, world_size=2, layer_shapes=[(4, 4)] * 3)


@pytest.mark.parametrize("name", ["bf16", "e4m3", "e5m2"])
def test_nearest_rounding_is_the_casts_and_stochastic_rounding_is_unbiased(name):
    fmt = FORMATS[name]
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(2, 40, generator=gen) * torch.logspace(-3, 3, 40)
    values, scales = encode(rows, fmt, 16)
    if scales is None:
        assert torch.equal(values, rows.to(torch.bfloat16))
    else:  # each block's largest magnitude is the format's max, exactly representable
        assert scales.shape == (2, 3)
        assert torch.equal(values.float().abs().view(2, -1)[:, :16].amax(1),
                           torch.full((2,), fmt.max))
    nearest = decode(values, scales, 16)
    draws = []
    for seed in range(400):
        noise_gen = torch.Generator().manual_seed(seed)
        noise = (torch.randint(0, 1 << 16, rows.shape, generator=noise_gen, dtype=torch.int32)
                 if scales is None else torch.rand(2, 3, 16, generator=noise_gen))
        draws.append(decode(*encode(rows, fmt, 16, noise), 16))
    draws = torch.stack(draws)
    lower, upper = draws.amin(0), draws.amax(0)
    assert ((draws == lower) | (draws == upper)).all()  # one of two neighbours, every time
    assert ((lower == nearest) | (upper == nearest)).all()
    both = lower < upper  # elsewhere the value sits next to one neighbour: all 400 draws went there
    assert (lower[both] <= rows[both]).all() and (rows[both] <= upper[both]).all()
    bias = (draws.mean(0) - rows)[both].abs() / (upper - lower)[both]
    assert bias.max() < 0.12, bias.max()  # 400 draws: sd of the mean <= 0.025 of the gap


def _piece_floats(n: int, bits: int, world: int, block: int) -> int:
    p = math.ceil(n / world)
    return world * (math.ceil(p * bits / 32) + (math.ceil(p / block) if bits == 8 else 0))


def test_floats_per_step_are_half_and_a_quarter_plus_the_scales():
    shapes = [(64, 32), (32,), (128, 64), (5, 7)]
    reducer = build_reducer("precision", [torch.zeros(s) for s in shapes], bits=32,
                            block_size=64)
    dense = 64 * 32 + 32 + 128 * 64 + 35
    assert reducer.floats_per_step() == dense
    assert reducer.floats_per_step([16, 16, 16]) == 32 + (64 * 32 + 128 * 64) // 2 + 18
    assert reducer.floats_per_step([8, 8, 32]) == \
        32 + 35 + (64 * 32 + 128 * 64) // 4 + (64 * 32 + 128 * 64) // 64
    assert reducer.floats_per_step([8, 32, 8]) == 32 + 128 * 64 + 512 + 32 + 9 + 1
    assert reducer.memory_bytes() == 0


# ---- 2 gloo ranks: fp32 is plain DDP, the bytes, a mismatch, a resume ---------------------------
def _batch(gen, n=8):
    return torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 10, (n,), generator=gen)


def _step(net, optimizer, x, y):
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(net(x), y).backward()
    optimizer.step()


BYTES_SHAPES = [(6, 4, 3, 3), (6,), (10, 12), (3,), (16, 8), (33, 17)]
BYTES_LEVELS = [32, 16, 8, 8]


def _fp32_is_plain_ddp(rank):
    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook

    results = {}
    for how in ("plain", "hook", "hook small buckets", "reducer"):
        torch.manual_seed(0)
        model = SmallNet()
        cap = 0.002 if how == "hook small buckets" else None
        net = model if how == "reducer" else DistributedDataParallel(model, bucket_cap_mb=cap)
        if how.startswith("hook"):
            net.register_comm_hook(AccordionHookState(model, "precision", bits=32),
                                   accordion_hook)
        reducer = build_reducer("precision", list(model.parameters()), bits=32)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        gen = torch.Generator().manual_seed(rank)
        for _ in range(3):
            x, y = _batch(gen)
            if how == "reducer":  # the trainer's path: local gradients, then reducer.reduce
                optimizer.zero_grad()
                torch.nn.functional.cross_entropy(net(x), y).backward()
                reducer.reduce([p.grad for p in model.parameters()])
                optimizer.step()
            else:
                _step(net, optimizer, x, y)
        results[how] = [p.detach().clone() for p in model.parameters()]
    return results


def _bytes(rank):
    gen = torch.Generator().manual_seed(rank)
    grads = [torch.randn(s, generator=gen) for s in BYTES_SHAPES]
    reducer = build_reducer("precision", grads, bits=32, block_size=16)
    stats = reducer.reduce(grads, BYTES_LEVELS)
    return stats, reducer.floats_per_step(BYTES_LEVELS), grads


def _mismatch(rank):
    from accordion_repro.ddp import Accordion

    torch.manual_seed(0)
    ddp = DistributedDataParallel(SmallNet())
    acc = Accordion(ddp, "precision", low=32, high=8)
    if rank == 1:
        acc.set_level("fc1.weight", 8)  # only rank 1: the ranks now disagree
    try:
        torch.nn.functional.cross_entropy(ddp(_batch(torch.Generator())[0]),
                                          torch.zeros(8, dtype=torch.long)).backward()
    except Exception as exc:  # noqa: BLE001 (the test looks at what the user would see)
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _resume(rank):
    from accordion_repro.ddp import Accordion

    def build():
        torch.manual_seed(0)
        model = SmallNet()
        ddp = DistributedDataParallel(model, bucket_cap_mb=0.002)
        acc = Accordion(ddp, "precision", low=16, high=8, eta=10.0, interval=1,
                        stochastic_rounding=True, block_size=32, seed=5)
        return model, ddp, acc, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train(ddp, optimizer, acc, epochs, seed):
        gen = torch.Generator().manual_seed(seed)
        for epoch in epochs:
            for _ in range(2):
                _step(ddp, optimizer, *_batch(gen))
            acc.end_epoch(epoch, 0.1, 0.1)

    model, ddp, acc, optimizer = build()
    train(ddp, optimizer, acc, range(2), seed=rank)
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "accordion": acc.state_dict()}, buffer)
    train(ddp, optimizer, acc, range(2, 4), seed=100 + rank)
    runs = {"straight": ([p.detach().clone() for p in model.parameters()], acc.levels,
                         acc.report)}
    for how in ("resumed", "counts lost"):
        model, ddp, acc, optimizer = build()
        buffer.seek(0)
        saved = torch.load(buffer)  # weights_only: the state is plain tensors and containers
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        acc.load_state_dict(saved["accordion"])
        if how == "counts lost":  # what a resume without the reducer's state would draw
            acc.state.reducer.rounds = [0] * len(acc.state.reducer.rounds)
        train(ddp, optimizer, acc, range(2, 4), seed=100 + rank)
        runs[how] = [p.detach().clone() for p in model.parameters()], acc.levels, acc.report
    return runs


def _two_rank_worker(rank):
    return {"fp32": _fp32_is_plain_ddp(rank), "bytes": _bytes(rank),
            "mismatch": _mismatch(rank), "resume": _resume(rank)}


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    return run_workers(_two_rank_worker, tmp_path_factory.mktemp("precision2"))


@pytest.mark.slow
@distributed
def test_the_fp32_level_is_plain_ddp_bit_for_bit(two_ranks):
    """Acceptance 1: the fp32 level takes the exact dense path, under the hook (one bucket or
    several) and the trainer's reducer.reduce: every parameter as plain DDP's, bit for bit."""
    for result in two_ranks:
        plain = result["fp32"]["plain"]
        for how in ("hook", "hook small buckets", "reducer"):
            assert all(torch.equal(a, b) for a, b in zip(plain, result["fp32"][how])), how
    assert all(torch.equal(a, b) for a, b in zip(two_ranks[0]["fp32"]["hook"],
                                                 two_ranks[1]["fp32"]["hook"]))


@pytest.mark.slow
@distributed
def test_floats_and_bytes_per_step_are_the_formula(two_ranks):
    world, block = 2, 16
    dense = [s for s in BYTES_SHAPES if len(s) < 2] + [BYTES_SHAPES[0]]  # the 32-bit layer too
    dense_floats = sum(math.prod(s) for s in dense)
    layers = [(math.prod(s), bits) for s, bits in zip([BYTES_SHAPES[i] for i in (2, 4, 5)],
                                                      BYTES_LEVELS[1:])]
    compressed = sum(_piece_floats(n, bits, world, block) for n, bits in layers)
    row_bytes = 4 * compressed // world  # a rank's piece of every layer: one row of the buffer
    for stats, floats_per_step, _ in (r["bytes"] for r in two_ranks):
        assert stats.floats_sent == floats_per_step == dense_floats + compressed
        assert stats.bytes_sent == 4 * dense_floats + world * row_bytes + row_bytes
        assert stats.allgather_bytes == row_bytes
        assert (stats.collectives, stats.allgathers, stats.uncompressed_layers) == (3, 1, 1)
    # the replicas agree bit for bit: every rank decodes the same bytes
    for a, b in zip(two_ranks[0]["bytes"][2], two_ranks[1]["bytes"][2]):
        assert torch.equal(a, b)


@pytest.mark.slow
@distributed
def test_ranks_that_disagree_on_the_levels_stop_in_one_line(two_ranks):
    for result in (r["mismatch"] for r in two_ranks):
        assert result.startswith("LevelMismatchError: compression levels differ between ranks")
        assert "\n" not in result
    assert "rank 1 has 3 layers: 2 at 32, 1 at 8" in two_ranks[1]["mismatch"]


@pytest.mark.slow
@distributed
def test_a_saved_state_resumes_bit_for_bit_with_stochastic_rounding(two_ranks):
    for result in (r["resume"] for r in two_ranks):
        straight, levels, report = result["straight"]
        resumed, resumed_levels, _ = result["resumed"]
        assert levels == resumed_levels and set(levels) <= {16, 8}
        assert all(torch.equal(a, b) for a, b in zip(straight, resumed))
        lost = result["counts lost"][0]  # the draw counts are what makes it exact
        assert not all(torch.equal(a, b) for a, b in zip(straight, lost))
        assert report["error_memory_bytes"] == 0


# ---- 4 gloo ranks: the bounds, and bf16 against torch's bf16 ring sum ---------------------------
WORLD4 = 4
BOUND_SHAPES = [(48, 3, 3, 3), (96, 200), (10,)]
BOUND_CASES = [("bf16", False), ("bf16", True), ("e4m3", False), ("e4m3", True),
               ("e5m2", False), ("bf16_compress_hook", False)]


def _entry4(rank, fn, port, out_dir, environ):
    adopt_environment(environ)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD4)
    try:
        torch.save(fn(rank), os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run4(fn, tmp_path, timeout=240):
    import time

    import torch.multiprocessing as mp

    forked_ranks.context()  # the ranks fork from a preloaded server, as run_workers' do
    procs = mp.start_processes(_entry4, args=(fn, free_port(), str(tmp_path), dict(os.environ)),
                               nprocs=WORLD4, join=False, start_method="forkserver")
    try:
        deadline = time.monotonic() + timeout
        while not procs.join(timeout=1):
            if time.monotonic() > deadline:
                pytest.fail("distributed workers timed out")
    finally:
        for process in procs.processes:
            if process.is_alive():
                process.kill()
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD4)]


def local_gradients(rank):
    """Gradients whose rows span 6 orders of magnitude (so fp8's block scales matter)."""
    gen = torch.Generator().manual_seed(7000 + rank)
    return [torch.randn(s, generator=gen) * torch.logspace(-3, 3, s[0]).view(-1, *[1] * (len(s) - 1))
            for s in BOUND_SHAPES]


class _Given(torch.nn.Module):
    """Parameters whose gradient is the input: d/dp sum(p * t) = t, exactly."""

    def __init__(self):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s))
                                              for s in BOUND_SHAPES)

    def forward(self, *targets):
        return sum((p * t).sum() for p, t in zip(self.weights, targets))


def _bound_worker(rank):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook

    out = {}
    for case in BOUND_CASES:
        name, stochastic = case
        model = _Given()
        ddp = DistributedDataParallel(model)
        if name == "bf16_compress_hook":
            ddp.register_comm_hook(None, bf16_compress_hook)
        else:
            bits, fp8 = (16, "e4m3") if name == "bf16" else (8, name)
            state = AccordionHookState(model, "precision", bits=bits, fp8_format=fp8,
                                       block_size=64, stochastic_rounding=stochastic, seed=1)
            ddp.register_comm_hook(state, accordion_hook)
        ddp(*local_gradients(rank)).backward()
        out[case] = [p.grad.clone() for p in model.weights]
    return out


def _scale_term(x, fmt, tiny, block):
    """(W, p) pieces -> the subnormal term of each value: its block's scale s times `tiny`."""
    if fmt.max is None:
        return torch.zeros_like(x)
    w, p = x.shape
    blocks = math.ceil(p / block)
    padded = torch.nn.functional.pad(x.abs(), (0, blocks * block - p)).view(w, blocks, block)
    scales = padded.amax(2, keepdim=True) / fmt.max
    return (scales.expand_as(padded) * tiny).reshape(w, -1)[:, :p]


def _stated_bound(name, stochastic, block=64):
    """The elementwise bound docs/compressors.md states: the first rounding (each rank's, at most
    u |x_r| + the subnormal spacing term s_r 2^(e_min - m - 1) for round to nearest, twice that
    for stochastic rounding), averaged; the second (the mean's), at most u |mean| + its own
    subnormal term, with |mean| <= |exact mean| + the first error; fp32 sums and products add
    at most 2^-20 of mean_r |x_r|."""
    fmt = FORMATS[name]
    u = fmt.unit_roundoff(stochastic)
    tiny = 0.0 if fmt.max is None else 2.0 ** (fmt.min_exponent - fmt.mantissa
                                                - (0 if stochastic else 1))
    per_rank = [local_gradients(r) for r in range(WORLD4)]

    def scale_term(x):
        return _scale_term(x, fmt, tiny, block)

    bounds, means = [], []
    for j, shape in enumerate(BOUND_SHAPES):
        xs = [rank_grads[j].double().view(-1) for rank_grads in per_rank]
        mean = sum(xs) / WORLD4
        if len(shape) < 2:  # 1-D: the dense fp32 all-reduce
            bounds.append(2.0 ** -20 * sum(x.abs() for x in xs) / WORLD4)
            means.append(mean)
            continue
        p = math.ceil(mean.numel() / WORLD4)

        def pieces(v):
            return torch.nn.functional.pad(v, (0, WORLD4 * p - v.numel())).view(WORLD4, p)

        first = sum(u * x.abs() + scale_term(pieces(x)).reshape(-1)[:x.numel()] for x in xs)
        first = first / WORLD4 + 2.0 ** -20 * sum(x.abs() for x in xs) / WORLD4
        upper = mean.abs() + first
        second = u * upper + scale_term(pieces(upper)).reshape(-1)[:upper.numel()]
        bounds.append(first + second)
        means.append(mean)
    return bounds, means


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    return _run4(_bound_worker, tmp_path_factory.mktemp("precision4"))


def _relative_error(got, means):
    err = sum(float(((g.double().view(-1) - m) ** 2).sum()) for g, m in zip(got, means))
    return math.sqrt(err / sum(float((m ** 2).sum()) for m in means))


@pytest.mark.slow
@distributed
def test_low_precision_levels_are_within_their_stated_bound_of_the_fp64_mean(four_ranks):
    for case in BOUND_CASES[:-1]:
        bounds, means = _stated_bound(*case)
        for rank_result in four_ranks:  # every rank holds the same numbers
            assert all(torch.equal(a, b) for a, b in zip(rank_result[case], four_ranks[0][case]))
        used = 0.0
        for got, bound, mean in zip(four_ranks[0][case], bounds, means):
            error = (got.double().view(-1) - mean).abs()
            assert (error <= bound).all(), (case, float((error - bound).max()))
            used = max(used, float((error / bound.clamp_min(1e-300)).max()))
        print(f"{case}: largest error / its bound {used:.2f}")


@pytest.mark.slow
@distributed
def test_bf16_with_fp32_sums_beats_the_bf16_ring_sum_at_4_ranks(four_ranks):
    """The numbers of docs/compressors.md (relative L2 error of the averaged gradient against an
    fp64 mean, 4 ranks): bf16 with fp32 sums beats torch's bf16_compress_hook, which sums bf16
    around the ring, on the same gradients."""
    _, means = _stated_bound("bf16", False)
    errors = {case: _relative_error(four_ranks[0][case], means) for case in BOUND_CASES}
    print({f"{name}{' SR' if sr else ''}": f"{e:.3g}" for (name, sr), e in errors.items()})
    hook = errors[("bf16_compress_hook", False)]
    assert errors[("bf16", False)] < 0.85 * hook, errors  # measured: 0.75 of it
    assert errors[("bf16", True)] < 2 * hook, errors  # unbiased, a wider error per value


# ---- the trainer: each preset on 2 ranks, stopped and resumed ----------------------------------
CLI_BASE = ["scale=cpu", "dataset=synthetic_cifar10", "dataset.train_size=64",
            "dataset.test_size=16", "dataset.subset=null", "model.width=0.125",
            "logger.wandb.mode=disabled", "trainer.progress=never", "trainer.batch_size=8",
            "trainer.eval_batch_size=16", "trainer.max_steps_per_epoch=2",
            "trainer.max_eval_steps=1", "dist.nproc_per_node=2", "trainer.epochs=4",
            "schedule.interval=1", "schedule.lr_decay_rule=false"]
TIMING = {"epoch_time_s", "compute_time_s", "comm_time_s"}


def _cli(run_dir, *overrides):
    from conftest import REPO
    from harness.forked_cli import run_cli

    out = run_cli([*CLI_BASE, *overrides, f"hydra.run.dir={run_dir}"], cwd=REPO, timeout=240)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]


@pytest.mark.slow
@distributed
@pytest.mark.parametrize("preset, options", [
    ("precision/resnet18_accordion_fp32_fp8", []),
    ("precision/resnet18_accordion_bf16_fp8", ["compressor.stochastic_rounding=true"])])
def test_each_preset_trains_on_2_ranks_and_resumes_to_identical_metrics(preset, options,
                                                                        tmp_path):
    from conftest import read_metrics, read_summary

    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    _cli(whole, f"experiment={preset}", *options)
    _cli(stopped, f"experiment={preset}", *options, "trainer.stop_after_epoch=1")
    assert read_summary(stopped)["status"] == "stopped"
    _cli(stopped, f"experiment={preset}", *options)
    assert read_summary(stopped)["status"] == "completed"
    metrics = read_metrics(whole)
    assert [{k: v for k, v in m.items() if k not in TIMING} for m in metrics] == \
        [{k: v for k, v in m.items() if k not in TIMING} for m in read_metrics(stopped)]
    assert "8" in metrics[-1]["levels"]  # the last epochs send fp8: what the resume replays
    dense_floats = metrics[0]["floats_sent"]  # epoch 0 is all at low: fp32 or bf16
    assert metrics[-1]["floats_sent"] < dense_floats


# ---- FSDP2: the custom reduce-scatter, 2 gloo ranks ---------------------------------------------
FSDP_SHAPES = [(48, 3, 3, 3), (96, 200), (7, 30), (10,)]  # (7, 30): FSDP pads a row


class _GivenFSDP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s))
                                              for s in FSDP_SHAPES)

    def forward(self, *targets):
        return sum((p * t).sum() for p, t in zip(self.weights, targets))


def fsdp_gradients(rank):
    gen = torch.Generator().manual_seed(9000 + rank)
    return [torch.randn(s, generator=gen) * torch.logspace(-3, 3, s[0]).view(-1, *[1] * (len(s) - 1))
            for s in FSDP_SHAPES]


def _fsdp_worker(rank):
    import copy

    from torch.distributed.fsdp import fully_shard

    from accordion_repro.comm.fsdp import FSDPReducerState
    from test_fsdp import _train

    out = {"plain": _train("fsdp")[0]}
    out["fp32"] = _train("fsdp", "precision", levels=lambda acc: [32] * len(acc.levels))
    saved = copy.deepcopy(_train("fsdp", "precision", epochs=3, stop=2))
    out["straight"] = _train("fsdp", "precision", epochs=3)
    out["resumed"] = _train("fsdp", "precision", epochs=3, start=saved)
    for fmt, bits in (("bf16", 16), ("e4m3", 8)):
        model = fully_shard(_GivenFSDP())
        state = FSDPReducerState(model, "precision", bits=bits, block_size=64)
        model(*fsdp_gradients(rank)).backward()
        out[fmt] = ([p.grad.full_tensor() for p in model.weights], state.pop_stats(),
                    state.reducer.memory_bytes())
    return out


@pytest.fixture(scope="module")
def fsdp_ranks(tmp_path_factory):
    return run_workers(_fsdp_worker, tmp_path_factory.mktemp("precision_fsdp"), timeout=300)


@pytest.mark.slow
@distributed
def test_the_fp32_level_is_plain_fsdp_bit_for_bit(fsdp_ranks):
    from test_fsdp import _same

    for out in fsdp_ranks:
        params, history = out["fp32"]
        assert _same(params, out["plain"])
        stats = history[0]["stats"]
        assert stats.bytes_sent == stats.fsdp_reduce_scatter_bytes  # the same reduce-scatter


@pytest.mark.slow
@distributed
def test_fsdp_reduce_scatters_in_low_precision_with_one_rounding_and_resumes_exactly(fsdp_ranks):
    """qgZ under FSDP2: an all-to-all of each rank's bf16/fp8 chunks (FSDP's own layout) and an
    fp32 sum, no all-gather: each value is rounded once, within the first half of the bound the
    DDP path states; the bytes are the all-to-all's; a resumed run (stochastic rounding) is the
    run straight."""
    from test_fsdp import _same

    world = 2
    per_rank = [fsdp_gradients(r) for r in range(world)]
    for fmt, bits in (("bf16", 16), ("e4m3", 8)):
        spec = FORMATS[fmt]
        u = spec.unit_roundoff(False)
        tiny = 0.0 if spec.max is None else 2.0 ** (spec.min_exponent - spec.mantissa - 1)
        expected_a2a = 0
        for j, shape in enumerate(FSDP_SHAPES):
            xs = [g[j].double() for g in per_rank]
            mean = sum(xs) / world
            got = fsdp_ranks[0][fmt][0][j].double()
            assert torch.equal(got, fsdp_ranks[1][fmt][0][j].double())
            if len(shape) < 2:
                assert torch.equal(got, mean.float().double())  # dense, exact at 2 ranks
                continue
            rows = -(-shape[0] // world)  # FSDP's chunk: rows padded to a multiple of the ranks
            p = rows * math.prod(shape[1:])
            expected_a2a += world * 4 * (math.ceil(p * bits / 32)
                                         + (math.ceil(p / 64) if bits == 8 else 0))
            bound = 2.0 ** -20 * sum(x.abs() for x in xs) / world
            for x in xs:  # one rounding per value, by the rank that sent it, then averaged
                pieces = torch.nn.functional.pad(x.reshape(-1), (0, world * p - x.numel()))
                scale = _scale_term(pieces.view(world, p), spec, tiny, 64)
                bound = bound + (u * x.abs() + scale.reshape(-1)[:x.numel()].view_as(x)) / world
            assert ((got - mean).abs() <= bound).all(), (fmt, shape)
        for out in fsdp_ranks:
            _, stats, memory = out[fmt]
            dense = 4 * world * 5  # the 1-D tensor's reduce-scatter: 2 chunks of 5
            assert stats.bytes_sent == dense + expected_a2a and stats.allgathers == 0
            assert stats.collectives == 2 and memory == 0
            ratio = stats.bytes_sent / stats.fsdp_reduce_scatter_bytes
            assert ratio < (0.51 if bits == 16 else 0.27), ratio
    for out in fsdp_ranks:
        straight, straight_history = out["straight"]
        resumed, resumed_history = out["resumed"]
        assert {8, 16} & set(straight_history[-1]["levels"])
        assert _same(straight, resumed)
        assert straight_history[-1]["levels"] == resumed_history[-1]["levels"]
        assert straight_history[-1]["report"]["error_memory_bytes"] == 0
