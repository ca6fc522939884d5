"""End-to-end behaviour of the trainer: run directory, data parallelism, resume, failures."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from accordion_repro.engine import checkpoint
from accordion_repro.errors import ConfigError, DatasetMissingError
from conftest import REPO, compose_cfg, local_ranks, read_metrics, read_summary, train, train_in_pool

SMALL_IMAGE = ["dataset=synthetic_cifar10", "dataset.train_size=64", "dataset.test_size=32",
               "trainer.batch_size=8", "trainer.eval_batch_size=16"]
TIMING = {"epoch_time_s", "compute_time_s", "comm_time_s"}


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("compressor, floats_per_step, padded_blocks", [
    ("compressor=none", 11_173_962, 0),
    ("compressor=powersgd compressor.rank=2", 82_260, 2 * 21),  # a P and a Q per layer
])
def test_two_rank_run_directory_has_every_file_and_field(tmp_path, compressor, floats_per_step,
                                                         padded_blocks):
    run_dir = train(["model=resnet18", *SMALL_IMAGE, *compressor.split(), "dist.nproc_per_node=2",
                     "trainer.epochs=2", "trainer.max_steps_per_epoch=2", "trainer.max_eval_steps=1"],
                    tmp_path / "run")  # full width: the floats are the whole ResNet-18's
    assert (run_dir / "resolved.yaml").exists()
    assert (run_dir / "checkpoints" / "last.pt").exists()
    assert not (run_dir / "wandb").exists()  # logger.wandb.mode=disabled creates nothing
    metrics = read_metrics(run_dir)
    assert [m["epoch"] for m in metrics] == [0, 1]
    for m in metrics:
        for key in ("epoch", "lr", "train_loss", "test_loss", "test_acc", "steps", "batch_size",
                    "floats_sent", "bytes_sent", *TIMING):
            assert key in m, key
        assert m["steps"] == 2 and m["batch_size"] == 16
        assert m["floats_sent"] == 2 * floats_per_step  # the official convention, per worker
        # float32 P, Q and dense, each P and Q block padded to 64 bytes (comm/powersgd.py PACKING)
        padding = m["bytes_sent"] - 4 * m["floats_sent"]
        assert 0 <= padding < 64 * padded_blocks * m["steps"] or padding == padded_blocks == 0
    summary = read_summary(run_dir)
    assert summary["num_params"] == 11_173_962
    assert summary["world_size"] == 2 and summary["status"] == "completed"
    assert summary["total_floats_sent"] == sum(m["floats_sent"] for m in metrics)
    assert "final_test_acc" in summary and summary["total_train_time_s"] > 0


def _lstm_overrides(nproc: int, batch: int) -> list[str]:
    return ["model=lstm", "model.num_layers=1", "model.hidden_size=16", "model.embedding_size=16",
            "model.dropout=0.0", "optim=lstm", "dataset=synthetic_text", "dataset.vocab_size=50",
            "dataset.train_tokens=4000", "dataset.eval_tokens=400", "dataset.data_seed=3",
            "dataset.bptt=10", f"dist.nproc_per_node={nproc}", f"trainer.batch_size={batch}",
            "trainer.epochs=1", "trainer.max_steps_per_epoch=3", "trainer.max_eval_steps=1",
            "optim.warmup_epochs=0", "optim.lr=0.5"]


@pytest.mark.slow
@pytest.mark.distributed
def test_two_ranks_match_one_rank_on_the_same_global_batch(tmp_path, rank_pool):
    """Each rank's contiguous shard holds the same columns as one rank's twice-as-wide batch."""
    one = train(_lstm_overrides(1, 8) + ["optim.reference_batch=8"], tmp_path / "one")
    two = train_in_pool(rank_pool, _lstm_overrides(2, 4) + ["optim.reference_batch=8"],
                        tmp_path / "two")
    a = checkpoint.read(one / "checkpoints" / "last.pt")["model"]
    b = checkpoint.read(two / "checkpoints" / "last.pt")["model"]
    assert read_metrics(one)[0]["lr"] == pytest.approx(read_metrics(two)[0]["lr"])
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-5, rtol=0, msg=name)
    start = checkpoint.read(one / "checkpoints" / "last.pt")
    assert any((a[n] != 0).any() for n in a) and start["epoch"] == 0


STRATEGIES = {"ddp": [], "fsdp": ["dist.strategy=fsdp", "dist.nproc_per_node=2"]}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", pytest.param("fsdp", marks=pytest.mark.distributed)])
def test_resume_continues_identically(tmp_path, strategy, rank_pool):
    """Under fsdp the checkpoint holds the whole model and optimizer (gathered from the
    shards), each rank's reducer (error memory, Q) and rank 0's detector, as under ddp. (The
    two fsdp ranks are the pool's: the checkpoint and its resume are the trainer's, not the
    launcher's.)"""
    run = functools.partial(train_in_pool, rank_pool) if strategy == "fsdp" else train
    common = ["model=resnet18", "model.width=0.125", *SMALL_IMAGE, "compressor=powersgd",
              "schedule=accordion", "schedule.low=2", "schedule.high=1",
              "schedule.interval=1", "trainer.epochs=3", "trainer.max_steps_per_epoch=3",
              "optim.warmup_epochs=1", "optim.decay_at=[2]", *STRATEGIES[strategy]]
    whole = run(common, tmp_path / "whole")
    run(common + ["trainer.stop_after_epoch=0"], tmp_path / "split")
    assert read_summary(tmp_path / "split")["status"] == "stopped"
    run(common, tmp_path / "split")
    full, split = read_metrics(whole), read_metrics(tmp_path / "split")
    assert len(full) == len(split) == 3
    for a, b in zip(full, split):
        assert {k: v for k, v in a.items() if k not in TIMING} == {k: v for k, v in b.items() if k not in TIMING}
    assert read_summary(tmp_path / "split")["status"] == "completed"


@pytest.mark.slow
def test_wandb_offline_run_keeps_its_id_across_a_resume(tmp_path):
    common = ["model=resnet18", "model.width=0.125", *SMALL_IMAGE, "trainer.epochs=2",
              "trainer.max_steps_per_epoch=1", "trainer.max_eval_steps=1", "logger.wandb.mode=offline"]
    run_dir = train(common + ["trainer.stop_after_epoch=0"], tmp_path / "run")
    first = checkpoint.read(run_dir / "checkpoints" / "last.pt")["wandb_id"]
    train(common, run_dir)
    runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert first and len(runs) == 2 and all(name.endswith(first) for name in runs)
    assert checkpoint.read(run_dir / "checkpoints" / "last.pt")["wandb_id"] == first


@pytest.mark.parametrize("override, key", [
    ("optim.lr=-0.1", "optim.lr"),
    ("trainer.epochs=0", "trainer.epochs"),
    ("dist.nproc_per_node=0", "dist.nproc_per_node"),
    ("model.name=resnet99", "model.name"),
    ("dataset.name=imagenet", "dataset.name"),
    ("compressor=powersgd compressor.rank=0", "compressor.rank"),
    ("compressor=topk compressor.ratio=1.5", "compressor.ratio"),
    # a level the schedule sets per layer would never be read; the static schedule needs one
    ("compressor=powersgd schedule=accordion compressor.rank=4", "compressor.rank"),
    ("compressor=powersgd schedule=accordion compressor.rank=2", "compressor.rank"),
    ("compressor=topk schedule=regime_windows schedule.inside=0.5 schedule.outside=0.1 "
     "compressor.ratio=0.5", "compressor.ratio"),
    ("compressor=powersgd compressor.rank=null", "compressor.rank"),
    ("compressor=powersgd schedule=accordion schedule.eta=0", "schedule.eta"),
    ("dataset.augment=maybe", "dataset.augment"),
    ("trainer.checkpoint=maybe", "trainer.checkpoint"),
    ("optim.nesterov=sometimes", "optim.nesterov"),
    ("dist.timeout_s=-5", "dist.timeout_s"),
    ("dataset.train_size=0", "dataset.train_size"),
    ("dataset.pipeline=gpu", "dataset.pipeline"),
    ("+dataset.agument=false", "dataset.agument"),
    ("model.width=0", "model.width"),
    ("logger.wandb.mode=public", "logger.wandb.mode"),
    ("logger.wandb.tags=oops", "logger.wandb.tags"),
    ("logger.wandb.project=''", "logger.wandb.project"),
    ("dist.launcher=mpi", "dist.launcher"),
    # issue 56: named by the key typed, not compressor.seed (which conf ties to it)
    ("seed=-1 compressor=powersgd", "seed"),
    # issue 56: what no plan can do, refused before the run, naming the nearest feasible value
    ("compressor=powersgd schedule=phase_rule schedule.boundaries=[5] schedule.splits=[] "
     "schedule.levels=[[2],[1]] trainer.epochs=3", "schedule.boundaries[0]"),
    ("compressor=powersgd schedule=auto schedule.budget=1e-9", "schedule.budget"),
    ("compressor=powersgd schedule=auto schedule.step_time=1e-9 schedule.link_bps=1e8 "
     "dist.nproc_per_node=2", "schedule.step_time"),
    ("compressor=powersgd schedule=lgreco schedule.alpha=0.001", "schedule.alpha"),
])
def test_bad_values_are_rejected_with_their_key(override, key):
    from accordion_repro.config import validate

    cfg = compose_cfg(["dataset=synthetic_cifar10", *override.split()])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key


# Every config group of conf/ (Hydra's own and the presets, which write into the others, aside)
# and the nodes with no group file: an added key is refused naming it, whatever the prefix.
GROUPS = sorted({p.name for p in (REPO / "conf").iterdir() if p.is_dir()} - {"hydra", "experiment"}
                | {"run", "logger.wandb"})


@pytest.mark.parametrize("prefix", ["+", "++", ""])
@pytest.mark.parametrize("group", GROUPS + [""])
def test_an_unknown_key_is_refused_naming_it_in_every_config_group(group, prefix):
    """`+trainer.epoch=5` must not train 3 epochs as if nothing were said (issue 37 item 3)."""
    from hydra.errors import ConfigCompositionException

    from accordion_repro.config import validate

    key = f"{group}.no_such_key" if group else "no_such_key"
    try:
        cfg = compose_cfg(["dataset=synthetic_cifar10", "compressor=powersgd",
                           "schedule=accordion", f"{prefix}{key}=5"])
    except ConfigCompositionException as exc:  # no prefix: Hydra refuses a key it does not hold
        assert not prefix and key.split(".")[-1] in str(exc)
        return
    assert prefix, f"Hydra accepted {key}=5 without a prefix"
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.key == key


def test_a_refused_config_prints_no_warning_before_its_error(capsys):
    """Issue 56's audit (benchmarks/cli_audit.py, phase-boundary-after-run): a 3-epoch run's
    default decay_at warned, then the phase after the run was refused, two lines where a refusal
    is one. The warnings come once every check has passed."""
    from accordion_repro.config import validate

    warned = ["dataset=synthetic_cifar10", "trainer.epochs=3"]
    validate(compose_cfg(warned))
    assert "warning: optim.decay_at" in capsys.readouterr().err
    with pytest.raises(ConfigError) as err:
        validate(compose_cfg([*warned, "compressor=powersgd", "schedule=phase_rule",
                              "schedule.boundaries=[5]", "schedule.splits=[]",
                              "schedule.levels=[[2],[1]]"]))
    assert err.value.key == "schedule.boundaries[0]" and capsys.readouterr().err == ""


def test_missing_dataset_is_one_line_before_training(tmp_path):
    from accordion_repro.config import validate

    cfg = compose_cfg(["dataset=cifar10", f"dataset.root={tmp_path}"])
    with pytest.raises(DatasetMissingError) as err:
        validate(cfg)
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


def _cli(args: list[str], **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accordion_repro.train", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, **kw)


@pytest.mark.slow
def test_cli_prints_composed_config_and_rejects_bad_values(tmp_path):
    out = _cli(["model=resnet18", "compressor=powersgd", "schedule=accordion", "--cfg", "job"])
    assert out.returncode == 0, out.stderr
    assert "name: powersgd" in out.stdout and "name: accordion" in out.stdout
    bad = _cli(["dataset=synthetic_cifar10", "optim.lr=-1", f"hydra.run.dir={tmp_path}/bad"])
    assert bad.returncode == 2 and "optim.lr" in bad.stderr
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def test_a_level_the_schedule_sets_is_refused_in_one_line_naming_why(tmp_path):
    """`schedule=accordion compressor.rank=4`: the schedule sets each layer's rank, so the rank
    would be dead; refused before any rank starts, worded as Accordion(..., rank=4) is."""
    out = _cli(["dataset=synthetic_cifar10", "compressor=powersgd", "schedule=accordion",
                "compressor.rank=4", f"hydra.run.dir={tmp_path}/run"])
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert out.returncode == 2 and lines == [
        "error: compressor.rank: schedule 'accordion' takes no compressor.rank: the schedule sets "
        "each layer's rank, so it would never be read (got 4); leave it unset"], out.stderr
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.parametrize("override, said", [
    ("trainer.epoch=5", "error: trainer.epoch: not a key of this configuration; trainer has: "
                        "allow_config_change, batch_size,"),
    ("model=resnet99", "Available options in 'model': densenet, googlenet, lstm, resnet18"),
    # The README's `dataset.root` is cifar's and wikitext's: npz reads dataset.path.
    ("dataset.root=/elsewhere", "error: dataset.root: not a key of this configuration; dataset "
                                "has: augment, cache_dir, mean, name, num_classes, path,"),
    # issue 56: an override Hydra cannot parse is named by its key
    ("schedule.windows=[[0,1]", "error: schedule.windows: '[[0,1]' does not parse as a value"),
], ids=["unknown-trainer-key", "unknown-model", "root-under-npz", "unparsed-value"])
def test_hydras_own_refusals_are_one_line(tmp_path, override, said):
    """Issue 37 item 11: Hydra printed 7 and 17 lines where the suite promises one."""
    dataset = "dataset=npz" if override.startswith("dataset.") else "dataset=synthetic_cifar10"
    out = _cli([dataset, override, f"hydra.run.dir={tmp_path}/run"])
    assert out.returncode == 2
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and said in lines[0], out.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
@pytest.mark.distributed
def test_a_killed_rank_ends_the_job_with_its_rank(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "accordion_repro.train", "model=resnet18", "model.width=0.125", *SMALL_IMAGE,
         # many short epochs keep the ranks training when one is killed, without generating a
         # large synthetic set first (100,000 images took most of this test's time)
         "dataset.train_size=2000", "dist.nproc_per_node=2", "trainer.epochs=1000",
         "logger.wandb.mode=disabled", f"hydra.run.dir={tmp_path}/run"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and not (tmp_path / "run" / "summary.json").exists():
            time.sleep(0.5)  # rank 0 writes summary.json once the ranks are set up
        workers = local_ranks(proc.pid)
        assert len(workers) == 2, "ranks did not start"
        os.kill(workers[1], signal.SIGKILL)
        killed_at = time.time()
        out, _ = proc.communicate(timeout=120)
        assert time.time() - killed_at < 60
        assert proc.returncode != 0
        assert "rank 1" in out
        time.sleep(1)
        assert not [pid for pid in workers if Path(f"/proc/{pid}").exists()
                    and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_evaluation_runs_in_eval_mode_and_training_resumes_in_train_mode(tmp_path, monkeypatch):
    """BatchNorm must use its running statistics (and dropout be off) when scoring the model."""
    from accordion_repro.engine import tasks

    modes = {"eval": [], "train": []}
    evaluate, loss = tasks.ImageClassificationTask.evaluate, tasks.ImageClassificationTask.loss

    def spy_evaluate(self, model, max_steps):
        modes["eval"].append(model.training)
        return evaluate(self, model, max_steps)

    def spy_loss(self, model, batch):
        modes["train"].append(model.training)
        return loss(self, model, batch)

    monkeypatch.setattr(tasks.ImageClassificationTask, "evaluate", spy_evaluate)
    monkeypatch.setattr(tasks.ImageClassificationTask, "loss", spy_loss)
    train(["model=resnet18", "model.width=0.125", *SMALL_IMAGE, "trainer.epochs=2",
           "trainer.max_steps_per_epoch=2", "trainer.max_eval_steps=1"], tmp_path / "run")
    assert modes["eval"] == [False, False]
    assert modes["train"] == [True] * 4


@pytest.mark.parametrize("clip_point", ["local", "averaged"])
def test_clip_point_local_clips_what_the_detector_sees(tmp_path, clip_point):
    """The official LSTM clips each worker's own gradient before the detector accumulates it."""
    max_norm = 1e-3
    run_dir = train([*_lstm_overrides(1, 4), "compressor=powersgd", "schedule=accordion",
                     "schedule.interval=1", "schedule.low=2", "schedule.high=1",
                     f"optim.clip_grad_norm={max_norm}", f"optim.clip_point={clip_point}",
                     "trainer.epochs=1"], tmp_path / "run")
    norms = read_metrics(run_dir)[0]["detector"]["norms"]
    total = sum(n * n for n in norms) ** 0.5  # norm of the epoch-mean gradient, compressed layers
    if clip_point == "local":
        assert total <= max_norm * (1 + 1e-4)
    else:
        assert total > 10 * max_norm


@pytest.mark.slow
def test_clip_point_is_checked():
    with pytest.raises(ConfigError) as caught:
        train(["dataset=synthetic_cifar10", "optim.clip_point=before"], Path("/nonexistent"))
    assert caught.value.key == "optim.clip_point"


def test_each_process_moves_only_its_own_hydra_files(tmp_path):
    """Every rank of a multi-node job runs the CLI on one run directory, so rank 0 moves its
    Hydra files up while another rank may still be writing its own: each process has its own
    pending folder (a two-node requeue once failed on `rmdir` of a shared .hydra/pending)."""
    from omegaconf import OmegaConf

    from accordion_repro.config import register_resolvers
    from accordion_repro.train import keep_hydra_files

    register_resolvers()
    subdir = OmegaConf.load(REPO / "conf" / "config.yaml").hydra.output_subdir
    assert subdir == f".hydra/pending-{os.getpid()}"
    hydra_dir = tmp_path / ".hydra"
    mine, other = hydra_dir / "pending-1", hydra_dir / "pending-2"
    for folder in (mine, other):
        folder.mkdir(parents=True)
        (folder / "config.yaml").write_text(folder.name)
    keep_hydra_files(mine)
    assert (hydra_dir / "config.yaml").read_text() == "pending-1" and not mine.exists()
    assert (other / "config.yaml").read_text() == "pending-2"


@pytest.mark.parametrize("override, nearest, key", [
    ("schedule=phase_rule schedule.boundaries=[5] schedule.splits=[] schedule.levels=[[2],[1]] "
     "trainer.epochs=3", "the latest feasible boundary is", "schedule.boundaries"),
    ("schedule=auto schedule.budget=1e-9", "the smallest feasible budget is", "schedule.budget"),
    ("schedule=lgreco schedule.alpha=0.001", "the nearest value sure to have a plan is",
     "schedule.alpha"),
], ids=["phase_after_the_run", "auto_budget", "lgreco_alpha"])
def test_what_no_plan_can_do_is_refused_naming_the_nearest_feasible_value(override, nearest, key):
    """Issue 56 item 7: these trained as if the phase did not exist, or fell back to the
    cheapest or least-error plan without a word. The value the refusal names is accepted."""
    from accordion_repro.config import validate

    base = ["dataset=synthetic_cifar10", "compressor=powersgd", *override.split()]
    with pytest.raises(ConfigError, match=re.escape(nearest)) as err:
        validate(compose_cfg(base))
    assert "\n" not in str(err.value)
    value = re.search(re.escape(nearest) + r" ([\d.e+-]+)", str(err.value))[1]
    fixed = f"{key}=[{value}]" if key == "schedule.boundaries" else f"{key}={value}"
    validate(compose_cfg([*base, fixed]))
