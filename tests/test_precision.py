"""Mixed precision and memory layout in the trainer (trainer.precision, trainer.channels_last),
on the CPU: bf16 and fp16 autocast train with float32 gradients; fp16's loss scale skips an
overflowing step on every rank and logs it; channels_last changes the layout, not the result."""

from __future__ import annotations

import math

import pytest
import torch

from accordion_repro.engine import precision
from conftest import read_metrics, train, train_in_pool

TINY = ["model=resnet18", "model.width=0.125", "dataset=synthetic_cifar10", "dataset.train_size=64",
        "dataset.test_size=32", "compressor=powersgd", "schedule=accordion", "schedule.interval=1",
        "trainer.epochs=2", "trainer.batch_size=8", "trainer.eval_batch_size=16",
        "trainer.max_steps_per_epoch=4", "trainer.max_eval_steps=2"]


@pytest.fixture(scope="module")
def fp32_run(tmp_path_factory):
    return read_metrics(train(TINY, tmp_path_factory.mktemp("fp32") / "run"))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_reduced_precision_trains_close_to_fp32(fp32_run, tmp_path, name):
    metrics = read_metrics(train([*TINY, f"trainer.precision={name}"], tmp_path / "run"))
    assert [m["epoch"] for m in metrics] == [0, 1]
    for ours, reference in zip(metrics, fp32_run):
        assert math.isfinite(ours["train_loss"])
        assert abs(ours["train_loss"] - reference["train_loss"]) < 0.05 * reference["train_loss"]
    # epoch 0 runs every layer at `low` in both: the same traffic per step taken (later, the
    # detector's decisions may differ with the norms). fp16 may skip its first steps while the
    # loss scale (torch's 2^16 to start) settles, as torch's GradScaler does.
    skipped = metrics[0].get("amp_skipped_steps", 0)
    per_step = fp32_run[0]["floats_sent"] // fp32_run[0]["steps"]
    assert metrics[0]["floats_sent"] == (metrics[0]["steps"] - skipped) * per_step
    if name == "fp16":
        assert skipped < metrics[0]["steps"] and metrics[0]["loss_scale"] == 2.0 ** (16 - skipped)
    else:
        assert "amp_skipped_steps" not in metrics[0]  # fp32 and bf16 records are unchanged


def test_an_fp16_overflow_skips_the_step_and_halves_the_scale(tmp_path, monkeypatch):
    """A loss scale far above fp16's range overflows every step: each is skipped (no update,
    nothing sent) and counted, and the scale halves per skipped step."""
    monkeypatch.setattr(precision.LossScaler.__init__, "__defaults__", (2.0 ** 100, 2000))
    metrics = read_metrics(train([*TINY, "trainer.precision=fp16"], tmp_path / "run"))
    assert metrics[0]["amp_skipped_steps"] == metrics[0]["steps"] == 4
    assert metrics[0]["loss_scale"] == 2.0 ** 96 and metrics[0]["floats_sent"] == 0


@pytest.mark.slow
@pytest.mark.distributed
def test_channels_last_gives_the_same_training_on_two_ranks(tmp_path, rank_pool):
    two = ["dist.nproc_per_node=2"]
    plain = read_metrics(train_in_pool(rank_pool, [*TINY, *two], tmp_path / "plain"))
    nhwc = read_metrics(train_in_pool(rank_pool, [*TINY, *two, "trainer.channels_last=true"],
                                      tmp_path / "nhwc"))
    # the same numbers up to the convolutions' summation order (NHWC kernels differ from NCHW
    # ones by about 1e-4 relative in the loss of epoch 0 on AVX512; the second epoch, trained
    # from weights that already differ, by up to 0.31 % on an AVX2 CPU)
    for a, b, tolerance in zip(plain, nhwc, (1e-3, 6e-3)):
        assert abs(a["train_loss"] - b["train_loss"]) <= tolerance * a["train_loss"]
        assert a["floats_sent"] == b["floats_sent"]


def test_autocast_is_nothing_for_fp32_and_the_dtype_otherwise():
    assert precision.autocast(torch.device("cpu"), "fp32").__class__.__name__ == "nullcontext"
    with precision.autocast(torch.device("cpu"), "bf16"):
        assert torch.nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16


def test_bf16_on_a_cpu_that_emulates_it_is_named_before_the_run(monkeypatch, capsys):
    """An AVX2 CPU runs bf16 autocast about 8x slower than fp32 (docs/reproduce.md): validate
    says so in one line before any rank starts; fp32, or a CPU with native bf16, says nothing."""
    from accordion_repro.config import validate
    from accordion_repro.engine import precision
    from conftest import compose_cfg

    for emulated, chosen, warned in ((True, "bf16", True), (True, "fp32", False),
                                     (False, "bf16", False)):
        monkeypatch.setattr(precision, "cpu_bf16_is_emulated", lambda: emulated)
        validate(compose_cfg(["dataset=synthetic_cifar10", "trainer.device=cpu",
                              f"trainer.precision={chosen}"]))
        lines = [line for line in capsys.readouterr().err.splitlines() if "native bf16" in line]
        assert len(lines) == (1 if warned else 0), (emulated, chosen)
        if warned:
            assert lines[0].startswith("warning: trainer.precision=bf16 on a CPU without native")
