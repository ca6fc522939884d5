"""The contract every registered compressor keeps (issue 57, items 1 and 5), one test id per
compressor: it builds from its name, reduces on 1 and on 2 ranks to one replicated average, sends
the floats its wire cost says, and resumes bit for bit from its state_dict.

A compressor is tested by being registered: StrideReducer (tests/toy_compressor.py, a
module-level class and one registry line, nothing else) is covered by every test of this file
like the suite's own, and a test trains with it through the CLI. It is registered for this
file's tests only (the fixture below), so no other test sees it in the registry.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from accordion_repro.comm import COMPRESSORS, Reducer, build_reducer
from accordion_repro.comm.config import PrecisionBits
from conftest import REPO

TOY = "stride"  # tests/toy_compressor.py
NAMES = sorted({*COMPRESSORS, TOY})


@pytest.fixture(autouse=True, scope="module")
def toy_registered():
    """The toy in the registry while this file's tests run, and out of it afterwards."""
    import toy_compressor  # its import registers it  # noqa: F401

    from accordion_repro.comm import register_compressor

    register_compressor(toy_compressor.StrideReducer)  # again, if a teardown removed it
    yield
    COMPRESSORS.pop(TOY, None)


COMPRESSING = {int: 2, float: 0.25, PrecisionBits: 16, None: None}  # a level that compresses, by kind
SHAPES = [(16, 3, 3, 3), (16,), (10, 64), (10,)]


def _level(name: str):
    return COMPRESSING[COMPRESSORS[name].SETTINGS.LEVEL[1]]


def _reducer(name: str, group=None) -> Reducer:
    option_name = COMPRESSORS[name].SETTINGS.LEVEL[0]
    options = {option_name: _level(name)} if option_name else {}
    return build_reducer(name, [torch.zeros(s) for s in SHAPES], group=group, **options)


def _grads(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=generator) for s in SHAPES]


def test_the_toy_is_registered_beside_the_suites_compressors():
    assert {"none", "powersgd", "acp_powersgd", "topk", "stride"} <= set(COMPRESSORS)


@pytest.mark.parametrize("name", NAMES)
def test_builds_and_reduces_on_one_rank_sending_what_its_wire_cost_says(name):
    reducer = _reducer(name)
    for step in range(2):  # ACP-SGD's cost alternates: it is the coming step's
        grads, cost = _grads(step), reducer.floats_per_step()
        stats = reducer.reduce(grads)
        assert all(torch.isfinite(g).all() for g in grads)
        assert stats.floats_sent == cost > 0
        assert stats.bytes_sent == stats.collectives == 0  # one worker sends nothing


@pytest.mark.parametrize("name", NAMES)
def test_a_state_dict_resumes_bit_for_bit(name):
    straight = _reducer(name)
    for step in range(3):
        straight.reduce(_grads(step))
    first = _reducer(name)
    first.reduce(_grads(0))
    resumed = _reducer(name)
    resumed.load_state_dict(first.state_dict())
    for step in (1, 2):
        grads, again = _grads(step), _grads(step)
        resumed.reduce(grads)
        first.reduce(again)
        assert all(torch.equal(a, b) for a, b in zip(grads, again))
    last, expected = _grads(3), _grads(3)
    resumed.reduce(last)
    straight.reduce(expected)
    assert all(torch.equal(a, b) for a, b in zip(last, expected))


def _two_rank_worker(rank):
    import toy_compressor  # noqa: F401  (registers the toy in this rank)

    out = {}
    for name in NAMES:
        reducer = _reducer(name, group=torch.distributed.group.WORLD)
        grads, cost = _grads(10 + rank), reducer.floats_per_step()
        stats = reducer.reduce(grads)
        out[name] = ([g.clone() for g in grads], stats.floats_sent, cost,
                     stats.bytes_sent, stats.collectives)
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    from test_comm_distributed import run_workers

    return run_workers(_two_rank_worker, tmp_path_factory.mktemp("contract"), timeout=240)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", NAMES)
def test_two_ranks_end_with_one_replicated_average(two_ranks, name):
    (grads0, sent0, cost0, bytes0, calls0), (grads1, sent1, cost1, bytes1, calls1) = (
        two_ranks[0][name], two_ranks[1][name])
    assert all(torch.equal(a, b) for a, b in zip(grads0, grads1))
    assert sent0 == cost0 == sent1 == cost1
    assert bytes0 == bytes1 >= 4 * sent0 // 2 > 0 and calls0 == calls1 > 0
    # the 1-D tensors are never compressed: their exact average
    mean = [(a + b) / 2 for a, b in zip(_grads(10), _grads(11))]
    assert torch.allclose(grads0[1], mean[1]) and torch.allclose(grads0[3], mean[3])


@pytest.mark.slow
@pytest.mark.distributed
def test_the_toy_trains_from_the_cli_on_two_ranks_through_a_plugin(tmp_path):
    """`plugins=[...]` imports the module that registers it; `compressor=stride` needs no YAML;
    the ranks register it again when they unpickle its settings."""
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO / "tests"), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run(
        [sys.executable, "-m", "accordion_repro.train", "plugins=[toy_compressor]",
         "compressor=stride", "compressor.stride=4", "model=resnet18", "model.width=0.125",
         "dataset=synthetic_cifar10", "dataset.train_size=64", "dataset.test_size=16",
         "logger.wandb.mode=disabled", "trainer.progress=never", "trainer.batch_size=8",
         "trainer.eval_batch_size=16", "trainer.max_steps_per_epoch=2", "trainer.max_eval_steps=1",
         "trainer.epochs=2", "dist.nproc_per_node=2", f"hydra.run.dir={run_dir}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "done: test_acc" in done.stdout
    assert "name: stride" in (run_dir / "resolved.yaml").read_text()


def test_an_unimportable_plugin_is_refused_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "accordion_repro.train", "plugins=[no_such_module]",
                           f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("error: plugins: cannot import 'no_such_module': "
                                   "ModuleNotFoundError: No module named 'no_such_module'")
