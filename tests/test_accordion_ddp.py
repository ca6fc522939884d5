"""The one-object API (accordion_repro.ddp.Accordion) and the asynchronous hook, 2 gloo ranks.

What is checked: the own-code example (docs/api.md, "A complete script") runs verbatim under
torchrun and its detector sees the local gradients; Accordion updates the parameters exactly as the trainer's reducer path; the
asynchronous hook equals the synchronous one (level switches, no_sync, unused parameters, any
bucket size); ranks that disagree on the levels stop with one line; bf16/fp16 train; a saved
state resumes bit for bit.
"""

import functools
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from accordion_repro.comm.base import Phase
from accordion_repro.comm.ddp_hook import BucketPipeline
from conftest import REPO
from test_comm_distributed import SmallNet, free_port, run_workers

distributed = pytest.mark.distributed


def _batch(gen, n=8, dtype=torch.float32):
    return torch.randn(n, 3, 8, 8, generator=gen).to(dtype), torch.randint(0, 10, (n,),
                                                                            generator=gen)


def _step(net, optimizer, x, y):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(net(x).float(), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


# ---- the own-code example --------------------------------------------------------------------
def readme_example() -> str:
    """The python block of docs/api.md's "A complete script" (the README points to it)."""
    text = (REPO / "docs" / "api.md").read_text()
    section = text.split("## A complete script", 1)[1].split("\n## ", 1)[0]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


# What the own-code example passes to Accordion (kept in step with it by the first assertion).
EXAMPLE_SETTINGS = 'compressor="powersgd", low=2, high=1, eta=0.5, interval=1'


def _trainer_path_worker(rank, example_file):
    """The own-code example's training, driven as engine/trainer.py drives it: local gradients
    into rank 0's detector, reducer.reduce, optimizer.step; rank 0's measurement broadcast."""
    from accordion_repro.accordion import build_schedule
    from accordion_repro.comm import build_reducer
    from accordion_repro.accordion.controller import AdaptController

    spec = importlib.util.spec_from_file_location("readme_example", example_file)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model = example.make_model()
    params = [p for p in model.parameters() if p.requires_grad]
    reducer = build_reducer("powersgd", params, rank=2)
    compressible = [i for i, c in enumerate(reducer.compressible) if c]
    schedule = build_schedule("accordion", num_layers=len(compressible), compressor="powersgd",
                              default_level=2, base_global_batch=None, world_size=2, low=2,
                              high=1, eta=0.5, interval=1, lr_decay_rule=True, statistic="mean")
    adapt = AdaptController(schedule, rank=rank)  # as engine/trainer.py decides
    detector = adapt.detector
    averaged = schedule.make_detector() if rank == 0 else None  # the README's old advice
    plan = schedule.initial_plan()
    optimizer = torch.optim.SGD(params, lr=example.lr_at(0), momentum=0.9)
    reports, averaged_reports = [], []
    for epoch in range(example.EPOCHS):
        for group in optimizer.param_groups:
            group["lr"] = example.lr_at(epoch)
        for x, y in example.batches(rank, epoch):
            for p in params:
                p.grad = None
            torch.nn.functional.cross_entropy(model(x), y).backward()
            grads = [p.grad for p in params]
            if detector is not None:
                detector.accumulate([grads[i] for i in compressible])
            reducer.reduce(grads, plan.levels)
            if averaged is not None:
                averaged.accumulate([grads[i] for i in compressible])
            optimizer.step()
        lrs = example.lr_at(epoch), example.lr_at(epoch + 1)
        report = adapt.end_epoch(epoch, *lrs)
        plan = adapt.plan
        if averaged is not None:
            averaged.end_epoch(epoch, *lrs)
            reports.append(report)
            averaged_reports.append(averaged.report)
    return {"params": [p.detach().clone() for p in params], "reports": reports,
            "averaged": averaged_reports}


def _torchrun(example_file, **env) -> str:
    """Run the example on 2 ranks in its own folder; its stdout."""
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
         "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(example_file)],
        cwd=example_file.parent, env=dict(os.environ, OMP_NUM_THREADS="1", **env),
        capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    return run.stdout


def _logged(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "accordion_log.jsonl").read_text().splitlines()]


@pytest.mark.slow
@distributed
def test_readme_example_runs_under_torchrun_and_its_detector_sees_local_gradients(tmp_path,
                                                                                monkeypatch):
    code = readme_example()
    assert f"Accordion(model, {EXAMPLE_SETTINGS})" in code
    example_file = tmp_path / "accordion_example.py"
    example_file.write_text(code)
    assert "epoch 3:" in _torchrun(example_file, EPOCHS="4", STEPS="4")
    logged = _logged(tmp_path)
    assert [r["epoch"] for r in logged] == [0, 1, 2, 3]

    monkeypatch.setenv("EPOCHS", "4")  # the spawned reference reads the same sizes
    monkeypatch.setenv("STEPS", "4")
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    direct, _ = run_workers(functools.partial(_trainer_path_worker, example_file=str(example_file)),
                            reference_dir)
    levels_seen = set()
    for got, local, avg in zip(logged, direct["reports"], direct["averaged"]):
        torch.testing.assert_close(got["norms"], local["norms"], rtol=1e-5, atol=0)
        assert got["critical"] == local["critical"]
        # The averaged, compressed p.grad would have given other norms (the trap the API avoids).
        assert max(abs(a / b - 1) for a, b in zip(avg["norms"], local["norms"])) > 0.05
        levels_seen.add(tuple(got["critical"]))
    assert len(levels_seen) > 1  # the run switched levels at least once

    saved = torch.load(tmp_path / "accordion_checkpoints" / "rank0.pt")
    for got, want in zip(saved["model"].values(), direct["params"]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@distributed
def test_the_readme_example_resumes_only_when_asked_and_saves_on_every_rank(tmp_path):
    """A rerun with more epochs starts afresh (it used to continue the old checkpoint_rank*.pt
    in the working directory); RESUME=1 continues from every rank's own file."""
    code = readme_example()
    assert 'the usual "save on rank 0" leaves ranks 1.. nothing to resume' in code
    example_file = tmp_path / "accordion_example.py"
    example_file.write_text(code)
    _torchrun(example_file, EPOCHS="2", STEPS="2")
    again = _torchrun(example_file, EPOCHS="3", STEPS="2")
    assert "epoch 0:" in again and [r["epoch"] for r in _logged(tmp_path)] == [0, 1, 2]
    assert not list(tmp_path.glob("*.pt"))  # nothing in the working directory
    saved = sorted(p.name for p in (tmp_path / "accordion_checkpoints").iterdir())
    assert saved == ["rank0.pt", "rank1.pt"]
    resumed = _torchrun(example_file, EPOCHS="4", STEPS="2", RESUME="1")
    assert "epoch 0:" not in resumed and "epoch 3:" in resumed
    assert [r["epoch"] for r in _logged(tmp_path)] == [0, 1, 2, 3]


# ---- Accordion = the trainer's reducer path --------------------------------------------------
def _accordion_vs_trainer_worker(rank):
    from accordion_repro.accordion import build_schedule
    from accordion_repro.comm import build_reducer
    from accordion_repro.ddp import Accordion
    from accordion_repro.accordion.controller import AdaptController

    results = {}
    # eta=10: no ratio reaches it, so epoch 1's check sends every layer to `high` (a switch).
    for name, low, high in (("powersgd", 2, 1), ("topk", 0.5, 0.05)):
        out = {}
        for path in ("accordion", "trainer"):
            torch.manual_seed(0)
            model = SmallNet()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            gen = torch.Generator().manual_seed(rank)
            if path == "accordion":
                ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
                acc = Accordion(ddp, name, low=low, high=high, eta=10.0, interval=1)
            else:
                ddp = model
                params = list(model.parameters())
                options = {"rank": low} if name == "powersgd" else {"ratio": low}
                reducer = build_reducer(name, params, **options)
                compressible = [i for i, c in enumerate(reducer.compressible) if c]
                schedule = build_schedule("accordion", num_layers=len(compressible),
                                          compressor=name, default_level=low,
                                          base_global_batch=None, world_size=2, low=low,
                                          high=high, eta=10.0, interval=1, lr_decay_rule=True,
                                          statistic="mean")
                adapt = AdaptController(schedule, rank=rank)  # as engine/trainer.py decides
                detector, plan = adapt.detector, adapt.plan
            trace, levels = [], []
            for epoch in range(3):
                for _ in range(2):
                    x, y = _batch(gen)
                    optimizer.zero_grad()
                    torch.nn.functional.cross_entropy(ddp(x), y).backward()
                    if path == "trainer":
                        grads = [p.grad for p in params]
                        if detector is not None:
                            detector.accumulate([grads[i] for i in compressible])
                        reducer.reduce(grads, plan.levels)
                    optimizer.step()
                    trace.append([p.detach().clone() for p in model.parameters()])
                if path == "accordion":
                    levels.append(acc.end_epoch(epoch, 0.1, 0.1).levels)
                else:
                    adapt.end_epoch(epoch, 0.1, 0.1)
                    plan = adapt.plan
                    levels.append(plan.levels)
            out[path] = (trace, levels)
        results[name] = out
    return results


@pytest.mark.slow
@distributed
def test_accordion_updates_the_parameters_as_the_trainers_reducer_path(tmp_path):
    r0, r1 = run_workers(_accordion_vs_trainer_worker, tmp_path)
    for name, high in (("powersgd", 1), ("topk", 0.05)):
        (acc_trace, acc_levels), (tr_trace, tr_levels) = r0[name]["accordion"], r0[name]["trainer"]
        assert acc_levels == tr_levels == r1[name]["accordion"][1]
        assert acc_levels[1] == [high] * 3  # the switch to high compression after epoch 1
        for step, (a, b) in enumerate(zip(acc_trace, tr_trace)):
            for x, y in zip(a, b):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=f"{name} step {step}")


# ---- asynchronous = synchronous; the level check -----------------------------------------------
class BranchNet(SmallNet):
    """SmallNet with a head that only some steps use (find_unused_parameters)."""

    def __init__(self):
        super().__init__()
        self.spare = torch.nn.Linear(32, 10)
        self.use_spare = False

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        x = torch.relu(self.fc1(torch.nn.functional.adaptive_avg_pool2d(x, 4).flatten(1)))
        return self.spare(x) if self.use_spare else self.fc2(x)


def _hook_run(rank, compressor, options, *, async_op, bucket_cap_mb, unused):
    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook

    torch.manual_seed(0)
    model = BranchNet() if unused else SmallNet()
    state = AccordionHookState(model, compressor, async_op=async_op, **options)
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb,
                                  find_unused_parameters=unused)
    ddp.register_comm_hook(state, accordion_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(rank)
    low, high = (2, 1) if compressor == "powersgd" else (0.3, 0.05)
    plans = {2: [high, low, high, low][:len(state.layer_names)],
             4: [low, high, high, low][:len(state.layer_names)], 5: [low] * len(state.layer_names)}
    trace = []
    for step in range(6):
        if step in plans:
            state.set_levels(plans[step])
        if unused:
            model.use_spare = step % 2 == 1
        optimizer.zero_grad()
        if step == 3:  # gradient accumulation: two micro-batches, one reduction
            with ddp.no_sync():
                torch.nn.functional.cross_entropy(ddp(_batch(gen)[0]), _batch(gen)[1]).backward()
        x, y = _batch(gen)
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        optimizer.step()
        trace.append((grads, [p.detach().clone() for p in model.parameters()]))
    return trace, state.pop_stats()


def _mismatch(rank):
    from accordion_repro.ddp import Accordion

    torch.manual_seed(0)
    ddp = DistributedDataParallel(SmallNet())
    acc = Accordion(ddp, "powersgd", low=2, high=1)
    if rank == 1:
        acc.set_level("fc1.weight", 1)  # only rank 1: the ranks now disagree
    try:
        torch.nn.functional.cross_entropy(ddp(_batch(torch.Generator())[0]),
                                          torch.zeros(8, dtype=torch.long)).backward()
    except Exception as exc:  # noqa: BLE001 (the test looks at what the user would see)
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _async_worker(rank):
    results = {}
    for compressor, options in (("powersgd", {"rank": 2}), ("topk", {"ratio": 0.3})):
        for cap, unused in ((0.002, False), (25, False), (0.01, True)):
            runs = [_hook_run(rank, compressor, options, async_op=a, bucket_cap_mb=cap,
                              unused=unused) for a in (True, False)]
            results[(compressor, cap, unused)] = runs
    results["mismatch"] = _mismatch(rank)
    return results


class _Work:
    """A collective that is already complete; its start and waits go to `log`."""

    def __init__(self, name, log):
        self.name, self.log = name, log
        log.append(f"start {name}")

    def wait(self):
        self.log.append(f"wait {self.name}")

    def get_future(self):
        future = torch.futures.Future()
        future.set_result(None)
        return future


def _two_phases(bucket, log):
    """A PowerSGD-like reduction: compress, P all-reduce; Q all-reduce (final); decompress."""
    log.append(f"compress {bucket}")
    yield Phase([_Work(f"P{bucket}", log)], False)
    yield Phase([_Work(f"Q{bucket}", log)], True)
    log.append(f"decompress {bucket}")


def test_the_pipeline_starts_a_bucket_before_waiting_for_the_earlier_ones():
    """A bucket's compression and first collectives come before the hook thread waits for an
    earlier bucket's P; every collective is still started in one fixed order."""
    log = []
    pipeline = BucketPipeline()
    futures = [pipeline.submit(_two_phases(b, log), lambda: torch.zeros(1), last=b == 2)
               for b in range(3)]
    assert all(f.done() for f in futures)
    assert log == ["compress 0", "start P0",
                   "compress 1", "start P1", "wait P0", "start Q0", "decompress 0",
                   "compress 2", "start P2", "wait P1", "start Q1", "decompress 1",
                   "wait P2", "start Q2", "decompress 2"]


@pytest.mark.slow
@distributed
def test_async_hook_equals_sync_hook_and_a_level_mismatch_stops_in_one_line(tmp_path):
    r0, r1 = run_workers(_async_worker, tmp_path)
    mismatch = r0.pop("mismatch"), r1.pop("mismatch")
    for key, ((async_trace, async_stats), (sync_trace, sync_stats)) in r0.items():
        assert async_stats == sync_stats, key
        for step, ((ga, pa), (gs, ps)) in enumerate(zip(async_trace, sync_trace)):
            for a, b in zip(ga + pa, gs + ps):
                assert (a - b).abs().max() <= 1e-6, (key, step)
        for (_, pa), (_, pb) in zip(async_trace, r1[key][0][0]):
            assert all(torch.equal(a, b) for a, b in zip(pa, pb))  # both ranks alike
    for result in mismatch:
        assert result.startswith("LevelMismatchError: compression levels differ between ranks")
        assert "\n" not in result
    assert "rank 1 has 3 layers: 2 at 2, 1 at 1" in mismatch[1]


# ---- mixed precision --------------------------------------------------------------------------
def _precision_worker(rank):
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_wrapper

    from accordion_repro.comm.ddp_hook import AccordionHookState, accordion_hook

    results = {}
    for compressor, options in (("powersgd", {"rank": 2}), ("topk", {"ratio": 0.3})):
        for mode in ("fp32", "bf16", "fp16", "fp16 wrapper"):
            torch.manual_seed(0)
            model = SmallNet()
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode, torch.float32)
            model = model.to(dtype)
            state = AccordionHookState(model, compressor, **options)
            ddp = DistributedDataParallel(model, bucket_cap_mb=0.01)
            hook = fp16_compress_wrapper(accordion_hook) if mode == "fp16 wrapper" \
                else accordion_hook
            ddp.register_comm_hook(state, hook)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
            x, y = _batch(torch.Generator().manual_seed(rank), n=16, dtype=dtype)
            losses = [_step(ddp, optimizer, x, y).item() for _ in range(8)]
            results[(compressor, mode)] = (losses, [p.detach().float() for p in model.parameters()])
    return results


@pytest.mark.slow
@distributed
def test_bf16_and_fp16_gradients_train_like_fp32(tmp_path):
    r0, r1 = run_workers(_precision_worker, tmp_path)
    for compressor in ("powersgd", "topk"):
        reference_losses, reference = r0[(compressor, "fp32")]
        for mode, tolerance in (("bf16", 3e-2), ("fp16", 5e-3), ("fp16 wrapper", 5e-3)):
            losses, params = r0[(compressor, mode)]
            assert losses[-1] < losses[0] - 0.02, (compressor, mode, losses)
            for got, want, other in zip(params, reference, r1[(compressor, mode)][1]):
                torch.testing.assert_close(got, want, rtol=0, atol=tolerance)
                assert torch.equal(got, other)


def test_precisions_the_reducers_cannot_use_are_refused_with_the_reason():
    from accordion_repro.comm.ddp_hook import AccordionHookState

    with pytest.raises(ValueError, match="packs float32 values with int32 indices"):
        AccordionHookState(SmallNet().double(), "topk", ratio=0.1)
    mixed = SmallNet()
    mixed.fc2.double()
    with pytest.raises(ValueError, match="parameters mix"):
        AccordionHookState(mixed, "powersgd", rank=2)
    state = AccordionHookState(SmallNet().double(), "powersgd", rank=2)  # float64 works
    assert state.reducer.dtype == torch.float64


# ---- checkpoints ------------------------------------------------------------------------------
# (compressor, bucket_cap_mb, error_feedback): None is DDP's default cap (SmallNet fits one
# bucket); 0.01 MB gives several buckets, which DDP regroups after its first step, so the first
# step after a restart packs other layers together than the step it replaces.
RESUME_CASES = (("powersgd", None, True), ("topk", None, True), ("powersgd", 0.01, True),
                ("powersgd", 0.01, False), ("topk", 0.01, True))


def _resume_worker(rank):
    from accordion_repro.ddp import Accordion

    def build(name, cap, error_feedback):
        torch.manual_seed(0)
        model = SmallNet()
        ddp = DistributedDataParallel(model, bucket_cap_mb=cap)
        low, high = (2, 1) if name == "powersgd" else (0.5, 0.05)
        acc = Accordion(ddp, name, low=low, high=high, eta=10.0, interval=1,
                        error_feedback=error_feedback)
        return model, ddp, acc, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def train(ddp, optimizer, acc, epochs, seed):
        gen = torch.Generator().manual_seed(seed)
        for epoch in epochs:
            for _ in range(2):
                _step(ddp, optimizer, *_batch(gen))
            acc.end_epoch(epoch, 0.1, 0.1)

    results = {}
    for case in RESUME_CASES:
        model, ddp, acc, optimizer = build(*case)
        train(ddp, optimizer, acc, range(2), seed=rank)
        buffer = io.BytesIO()
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "accordion": acc.state_dict()}, buffer)
        train(ddp, optimizer, acc, range(2, 4), seed=100 + rank)
        straight = [p.detach().clone() for p in model.parameters()], acc.levels

        model, ddp, acc, optimizer = build(*case)
        buffer.seek(0)
        saved = torch.load(buffer)  # weights_only: the state is plain tensors and containers
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        acc.load_state_dict(saved["accordion"])
        train(ddp, optimizer, acc, range(2, 4), seed=100 + rank)
        results[case] = straight, ([p.detach().clone() for p in model.parameters()], acc.levels)
    return results


@pytest.mark.slow
@distributed
def test_a_saved_accordion_state_resumes_bit_for_bit(tmp_path):
    """One bucket or several (DDP regroups them after the first step), with error memory or
    without: the resumed run computes every parameter bit for bit as the uninterrupted one."""
    for result in run_workers(_resume_worker, tmp_path):
        assert sorted(result, key=str) == sorted(RESUME_CASES, key=str)
        for case, ((straight, levels), (resumed, resumed_levels)) in result.items():
            assert levels == resumed_levels, case
            differ = [float((a - b).abs().max()) for a, b in zip(straight, resumed)]
            assert max(differ) == 0, (case, differ)


# ---- one process: errors the user can act on ----------------------------------------------------
def test_unknown_layer_names_and_non_ddp_models_are_refused_clearly():
    from accordion_repro.comm.ddp_hook import AccordionHookState
    from accordion_repro.ddp import Accordion

    state = AccordionHookState(SmallNet(), "powersgd", rank=2)
    with pytest.raises(ValueError, match=r"no trainable parameter named 'fc1.weigth'; did you "
                                         r"mean 'fc1.weight'"):
        state.set_level("fc1.weigth", 1)
    with pytest.raises(ValueError, match="fewer than 2 dimensions"):
        state.set_level("fc1.bias", 1)
    with pytest.raises(TypeError, match="DistributedDataParallel-wrapped model"):
        Accordion(SmallNet(), low=2, high=1)


def test_detector_fed_in_parts_sums_exactly_like_whole_steps():
    from accordion_repro.accordion import CriticalRegimeDetector

    gen = torch.Generator().manual_seed(3)
    steps = [[torch.randn(4, 5, generator=gen), torch.randn(3, 2, generator=gen),
              torch.randn(6, 1, 2, generator=gen)] for _ in range(3)]
    whole, parts = CriticalRegimeDetector(3, interval=1), CriticalRegimeDetector(3, interval=1)
    parts.prepare(steps[0])
    for grads in steps:
        whole.accumulate(grads)
        parts.accumulate_layers([2, 0], [grads[2], grads[0]])  # buckets come in any order
        parts.accumulate_layers([1], [grads[1]])
        parts.end_step()
    assert whole.end_epoch(0, 0.1, 0.1) == parts.end_epoch(0, 0.1, 0.1)
    assert whole.report == parts.report


# ---- Accordion in the caller's words (issue 29) -------------------------------------------------
BAD_ARGUMENTS = {
    "topk_low_above_1": (dict(compressor="topk", low=1.5, high=0.1), "ConfigError", "low: "),
    "topk_high_zero": (dict(compressor="topk", low=0.5, high=0), "ConfigError", "high: "),
    "powersgd_low_zero": (dict(low=0, high=1), "ConfigError", "low: "),
    "high_compresses_less": (dict(low=2, high=3), "ConfigError", "high: 3 compresses less than low = 2"),
    "eta_zero": (dict(low=2, high=1, eta=0), "ConfigError", "eta: "),
    "interval_zero": (dict(low=2, high=1, interval=0), "ConfigError", "interval: "),
    "error_feedback_maybe": (dict(low=2, high=1, error_feedback="maybe"), "ConfigError", "error_feedback: "),
    "misspelled_keyword": (dict(low=2, high=1, etaa=0.3), "TypeError",
                           "unexpected keyword argument 'etaa'; it takes low, high, async_op, "
                           "check_levels, the detector's eta, interval, lr_decay_rule, statistic"),
    "rank_beside_low_high": (dict(low=2, high=1, rank=3), "TypeError", "takes no rank=: low and high"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_accordion_arguments_are_named_as_the_caller_wrote_them(one_rank_group, case):
    from accordion_repro.ddp import Accordion

    kwargs, kind, expected = BAD_ARGUMENTS[case]
    with pytest.raises(Exception) as caught:
        Accordion(DistributedDataParallel(SmallNet()), **kwargs)
    assert type(caught.value).__name__ == kind
    message = str(caught.value)
    assert message.startswith(expected) or expected in message, message
    assert "compressor." not in message and "schedule." not in message and "\n" not in message
    if kind == "TypeError" and "etaa" in message:
        assert "rank" not in message.split("powersgd's")[1]  # low/high replace the rank


def test_a_level_too_high_to_compress_a_layer_is_reported(one_rank_group):
    from accordion_repro.ddp import Accordion

    torch.manual_seed(0)
    ddp = DistributedDataParallel(SmallNet())
    # conv.weight is 8 x 27 and fc2.weight 10 x 32: rank 16 cannot compress them; fc1 (32 x 128) can
    acc = Accordion(ddp, "powersgd", low=16, high=1, interval=1)
    assert acc.uncompressed_layers == ["conv.weight", "fc2.weight"]
    x, y = _batch(torch.Generator().manual_seed(0))
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    assert acc.pop_stats().uncompressed_layers == 2  # one step, two layers sent whole
    acc.end_epoch(0, lr_now=0.1, lr_next=0.1)
    assert acc.report["uncompressed_layers"] == acc.uncompressed_layers


def _misuse_worker(rank):
    import warnings

    from accordion_repro.comm import EpochMismatchError
    from accordion_repro.ddp import Accordion, AccordionWarning

    out = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.manual_seed(0)
        ddp = DistributedDataParallel(SmallNet())
        acc = Accordion(ddp, "topk", low=0.5, high=0.1)  # the levels of the issue, on 2 ranks
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, AccordionWarning)]
    x, y = _batch(torch.Generator().manual_seed(rank))
    torch.nn.functional.cross_entropy(ddp(x), y).backward()
    out["floats"] = acc.pop_stats().floats_sent
    out["layers"] = {name: p.numel() for name, p in ddp.module.named_parameters()
                     if name in acc.layer_names}
    out["others"] = sum(p.numel() for name, p in ddp.module.named_parameters()
                        if name not in acc.layer_names)
    # end_epoch on rank 0 only: rank 1 goes on training
    try:
        if rank == 0:
            acc.end_epoch(0, lr_now=0.1, lr_next=0.1)
        else:
            torch.nn.functional.cross_entropy(ddp(x), y).backward()
        out["end_epoch"] = "no error"
    except EpochMismatchError as exc:
        out["end_epoch"] = str(exc)
    return out


@pytest.mark.slow
@distributed
def test_topk_above_break_even_warns_once_and_end_epoch_on_one_rank_stops_both(tmp_path):
    r0, r1 = run_workers(_misuse_worker, tmp_path)
    [warning] = r0["warnings"]  # rank 0 warns, once, for `low` only
    assert "low=0.5 on 2 ranks sends 2x the floats of no compression" in warning
    assert "only below low=0.25" in warning and r1["warnings"] == []
    dense = sum(r0["layers"].values())
    kept = sum(max(1, int(0.5 * n)) for n in r0["layers"].values())
    # the accounting says what the warning says: the all-gather's 2 x k x 2 ranks, above dense
    assert r0["floats"] == 2 * kept * 2 + r0["others"] and 2 * kept * 2 >= dense
    assert r0["end_epoch"] == ("rank 0 called Accordion.end_epoch(0) while another rank went on "
                               "training; call end_epoch on every rank at the end of every epoch")
    assert r1["end_epoch"].startswith("another rank called Accordion.end_epoch(0) while rank 1 "
                                      "went on training")


# ---- issue 37: arguments refused at construction; continuous LR schedules --------------------
def _construction_worker(rank):
    from accordion_repro.ddp import Accordion

    def error(**kwargs):
        torch.manual_seed(0)
        try:
            Accordion(DistributedDataParallel(SmallNet()), **kwargs)
        except Exception as exc:  # noqa: BLE001 (the test looks at what the user would see)
            return f"{type(exc).__name__}: {exc}"
        return "no error"

    return {"async_op": error(low=2, high=1, async_op="no"),
            "PowerSGD": error(compressor="PowerSGD", low=2, high=1),
            "none": error(compressor="none", low=2, high=1),
            # rank 1 passes another high (and another seed): caught before any step
            "high": error(low=2, high=1 + rank),
            "seed": error(low=2, high=1, seed=rank),
            "same": error(low=2, high=1, eta=0.5 if rank else 0.5000)}


@pytest.mark.slow
@distributed
def test_mistyped_arguments_and_ranks_that_disagree_are_refused_at_construction(tmp_path):
    for rank, out in enumerate(run_workers(_construction_worker, tmp_path)):
        assert out["async_op"] == "ConfigError: async_op: must be true or false, got 'no'"
        assert out["PowerSGD"] == ("ConfigError: compressor: unknown compressor 'PowerSGD': "
                                   "Accordion takes 'acp_powersgd', 'powersgd', 'precision' "
                                   "or 'topk' (PowerSGD ranks, Top-K kept fractions or "
                                   "precision's bits); did you mean 'powersgd'?")
        assert out["none"] == ("ConfigError: compressor: 'none' has no compression level to "
                               "adapt; Accordion takes 'acp_powersgd', 'powersgd', "
                               "'precision' or 'topk'")
        assert out["high"] == (f"ConfigError: high: the ranks passed Accordion different values; "
                               f"rank {rank} passed {1 + rank}: every rank must pass the same "
                               "arguments")
        assert out["seed"].startswith("ConfigError: seed: the ranks passed Accordion different")
        assert out["same"] == "no error"


def _cosine_run(rule):
    """SmallNet on one rank under a cosine schedule (6 epochs of 2 steps); eta=10 sends every
    layer to high at each check after the first, unless the LR rule holds it at low."""
    import warnings

    from accordion_repro.ddp import Accordion, AccordionWarning, lr_now_and_next

    torch.manual_seed(0)
    ddp = DistributedDataParallel(SmallNet())
    acc = Accordion(ddp, "powersgd", low=2, high=1, eta=10.0, interval=1, lr_decay_rule=rule)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=6)
    gen = torch.Generator().manual_seed(0)
    levels, fired = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for epoch in range(6):
            for _ in range(2):
                _step(ddp, optimizer, *_batch(gen))
            levels.append(acc.end_epoch(epoch, *lr_now_and_next(scheduler)).levels)
            fired.append(acc.report["lr_rule_fired"])
            scheduler.step()
    return levels, fired, [str(w.message) for w in caught if w.category is AccordionWarning]


def test_a_continuous_lr_schedule_warns_or_counts_only_real_drops(one_rank_group):
    levels, fired, warned = _cosine_run(True)  # the paper's rule: every drop is a decay
    assert fired == [True] * 6 and all(lv == [2, 2, 2] for lv in levels)
    [warning] = warned  # once, at the second drop in a row
    assert warning.startswith("Accordion: the LR dropped at the end of epochs 0 and 1")
    assert "never compresses at high; pass lr_decay_rule=0.5" in warning
    levels, fired, warned = _cosine_run(0.4)  # drops of 40 % or more: the cosine's last epochs
    assert fired == [False, False, False, True, True, True] and warned == []
    assert levels[1] == levels[2] == [1, 1, 1]  # high compression between the decays


def test_lr_now_and_next_reads_a_torch_scheduler_without_moving_it():
    from accordion_repro.ddp import lr_now_and_next

    def schedulers():
        def optimizer():
            return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1, momentum=0.9)
        step = optimizer()
        yield torch.optim.lr_scheduler.MultiStepLR(step, milestones=[2, 4], gamma=0.1)
        yield torch.optim.lr_scheduler.CosineAnnealingLR(optimizer(), T_max=5)
        warm = optimizer()
        yield torch.optim.lr_scheduler.SequentialLR(
            warm, [torch.optim.lr_scheduler.LinearLR(warm, start_factor=0.1, total_iters=2),
                   torch.optim.lr_scheduler.ExponentialLR(warm, gamma=0.5)], milestones=[2])
        yield torch.optim.lr_scheduler.OneCycleLR(optimizer(), max_lr=1.0, total_steps=8)

    for queried, plain in zip(schedulers(), schedulers()):
        for _ in range(6):
            queried.optimizer.step()
            plain.optimizer.step()
            before = plain.optimizer.param_groups[0]["lr"]
            momentum = plain.optimizer.param_groups[0]["momentum"]
            got = lr_now_and_next(queried)
            plain.step()
            assert got == (before, plain.optimizer.param_groups[0]["lr"]), type(plain).__name__
            queried.step()  # the query moved nothing: the two stay in step
            assert queried.optimizer.param_groups[0]["lr"] == plain.optimizer.param_groups[0]["lr"]
            assert queried.optimizer.param_groups[0]["momentum"] == \
                plain.optimizer.param_groups[0]["momentum"], momentum
    plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(
        torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1))
    with pytest.raises(TypeError, match="ReduceLROnPlateau decides its next LR from a metric"):
        lr_now_and_next(plateau)


# ---- the library on its core dependencies alone (issue 60) --------------------------------------
CORE = ("torch", "numpy", "tqdm", "pyyaml")  # pyproject.toml's dependencies


def _core_closure() -> list:
    """The installed distributions of CORE and everything they require here, transitively."""
    import importlib.metadata as metadata

    from packaging.markers import default_environment
    from packaging.requirements import Requirement

    environment = {**default_environment(), "extra": ""}
    todo, seen, found = list(CORE), set(), []
    while todo:
        name = todo.pop()
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key in seen:
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(dist)
        for text in dist.requires or []:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate(environment):
                todo.append(requirement.name)
    return found


@pytest.mark.slow
@pytest.mark.distributed
def test_the_own_code_example_runs_with_only_the_core_dependencies(tmp_path):
    """`pip install accordion_repro` without the `suite` extra gets torch, numpy, tqdm and
    pyyaml: docs/api.md's complete script must import and train on 2 gloo ranks with those
    alone. Here: a folder holding only those distributions (and what they need), linked from
    this environment, is the whole sys.path (python -S: no site-packages), with the repository
    for the package itself; hydra, pandas, matplotlib, wandb and torchvision cannot be found."""
    site = tmp_path / "site"
    site.mkdir()
    for dist in _core_closure():
        for top in {Path(str(f)).parts[0] for f in dist.files or []}:
            source = Path(dist.locate_file(top))
            if source.exists() and not (site / top).exists() and top not in ("..", "bin"):
                (site / top).symlink_to(source)
    example = tmp_path / "example.py"
    example.write_text(readme_example())
    env = {"PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "OMP_NUM_THREADS": "1",
           "PATH": os.environ.get("PATH", "")}
    absent = subprocess.run(
        [sys.executable, "-S", "-c", "import importlib.util as u; print([m for m in ('hydra', "
         "'pandas', 'matplotlib', 'wandb', 'torchvision', 'omegaconf') if u.find_spec(m)])"],
        env=env, capture_output=True, text=True, timeout=120)
    assert absent.stdout.strip() == "[]", absent.stderr
    run = subprocess.run(  # the ranks too without site-packages: --no-python, python -S
        [sys.executable, "-S", "-m", "torch.distributed.run", "--nproc_per_node=2",
         "--master_addr=127.0.0.1", f"--master_port={free_port()}", "--no-python",
         sys.executable, "-S", str(example)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]


# ---- own-code misuses named in our words (issue 60) ---------------------------------------------
def test_a_second_accordion_on_one_model_and_a_text_learning_rate_are_refused_in_one_line(
        one_rank_group):
    """A second Accordion on one model got torch's "register_comm_hook must only be called
    once"; end_epoch(0, "0.1", "0.01") compared the rates as text ("0.01" < "0.1" holds, but
    so does "0.1" < "0.09"), and the LR-decay rule read a decay where there was none."""
    from torch.nn.parallel import DistributedDataParallel

    from accordion_repro.ddp import Accordion, LGreCo

    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
                                                        torch.nn.Linear(8, 2)))
    acc = Accordion(model, compressor="powersgd", low=2, high=1)
    for second in (lambda: Accordion(model, compressor="powersgd", low=2, high=1),
                   lambda: LGreCo(model, r0=2)):
        with pytest.raises(ValueError, match="already has Accordion attached") as error:
            second()
        assert "\n" not in str(error.value)
    with pytest.raises(TypeError, match=r"end_epoch\(lr_now=\.\.\.\) takes a number, got '0.1'"):
        acc.end_epoch(0, "0.1", "0.09")
    acc.end_epoch(0, 0.1, 0.1)  # numbers pass
