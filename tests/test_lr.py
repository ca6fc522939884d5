"""The per-epoch LR: the official rules written out from accordion-facts.md section 5, and the
decay epochs that fractions give on short runs."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from accordion_repro.engine.lr import build_epoch_lr, decay_epochs
from accordion_repro.engine.settings import OptimSettings
from accordion_repro.errors import ConfigError
from conftest import CONF_DIR

DEFAULT_DECAYS = [0.5, 0.8333333333]  # conf/optim/sgd.yaml


def optim_cfg(name: str, **overrides) -> OptimSettings:
    cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "optim" / f"{name}.yaml"))
    cfg.update(overrides)
    return OptimSettings.from_config(cfg)


def test_the_lr_schedule_refuses_a_raw_optim_node():
    """Components take checked settings, never the config dict (RunSettings.optim)."""
    node = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "optim" / "sgd.yaml"))
    with pytest.raises(TypeError, match=r"build_epoch_lr takes OptimSettings .*not a config dict"):
        build_epoch_lr(node, total_epochs=3, world_size=1, batch_size=128)


# ---- the official rules, from the facts (not from lr.py) -----------------------------------
# The LR of epoch e+1 is get_lr(e), computed at the end of epoch e; epoch 0 runs at the base LR.
# get_lr warms up linearly from lr to lr * workers over 5 epochs.
def official_lr(epoch: int, base: float, first: int, second: int, second_is_strict: bool) -> float:
    """get_lr(e) of an official script: e <= first full, then /10 up to `second` (`e < second`
    when second_is_strict, `e <= second` otherwise), then /100."""
    if epoch == 0:
        return base
    e = epoch - 1
    lr = base * (1 + 3 * min(e / 5, 1))
    if e <= first:
        return lr
    if e < second or (e == second and not second_is_strict):
        return lr / 10
    return lr / 100


def official_cifar_lr(epoch: int) -> float:
    """0.1 -> 0.4; e <= 150 full, 150 < e <= 250 /10, e > 250 /100 (lands 152 / 252)."""
    return official_lr(epoch, 0.1, 150, 250, second_is_strict=False)


def official_lstm_lr(epoch: int) -> float:
    """2.5 -> 10; e <= 60 full, 60 < e < 80 /10, else /100 (lands 62 / 81)."""
    return official_lr(epoch, 2.5, 60, 80, second_is_strict=True)


def drops(lrs: list[float]) -> list[int]:
    return [e for e in range(1, len(lrs)) if lrs[e] < lrs[e - 1]]


@pytest.mark.parametrize("name,epochs,official,landing", [
    ("sgd", 300, official_cifar_lr, [152, 252]),
    ("lstm", 90, official_lstm_lr, [62, 81]),
])
def test_official_off_by_one_matches_the_official_lr_of_every_epoch(name, epochs, official, landing):
    lr = build_epoch_lr(optim_cfg(name, official_off_by_one=True), total_epochs=epochs,
                        world_size=4, batch_size=128)
    ours = [lr(e) for e in range(epochs)]
    want = [official(e) for e in range(epochs)]
    assert ours == pytest.approx(want, rel=1e-12)
    assert drops(want) == landing and drops(ours) == landing


@pytest.mark.parametrize("name,epochs,landing", [("sgd", 300, [150, 250]), ("lstm", 90, [60, 80])])
def test_default_lr_decays_in_the_scheduled_epoch(name, epochs, landing):
    lr = build_epoch_lr(optim_cfg(name), total_epochs=epochs, world_size=4, batch_size=128)
    assert drops([lr(e) for e in range(epochs)]) == landing


def test_official_decay_compare_must_match_decay_at():
    cfg = optim_cfg("lstm", official_off_by_one=True, decay_at=[60])
    with pytest.raises(ConfigError, match="optim.official_decay_compare"):
        build_epoch_lr(cfg, total_epochs=90, world_size=4, batch_size=128)
    cfg = optim_cfg("lstm", official_off_by_one=True, official_decay_compare=[">", "=>"])
    with pytest.raises(ConfigError, match="optim.official_decay_compare"):
        build_epoch_lr(cfg, total_epochs=90, world_size=4, batch_size=128)


# ---- decay epochs from fractions -----------------------------------------------------------
@pytest.mark.parametrize("decay_at,epochs,want", [
    (DEFAULT_DECAYS, 12, [6, 10]), (DEFAULT_DECAYS, 300, [150, 250]), (DEFAULT_DECAYS, 30, [15, 25]),
    ([0.6666666667, 0.8888888889], 90, [60, 80]), ([0.6666666667, 0.8888888889], 18, [12, 16]),
])
def test_decay_fractions_round_to_the_nearest_epoch(decay_at, epochs, want, recwarn):
    assert decay_epochs(decay_at, epochs) == want
    assert len(recwarn) == 0


def test_a_fraction_that_lands_on_the_previous_decay_moves_to_the_next_free_epoch():
    with pytest.warns(UserWarning, match=r"optim\.decay_at.*0\.52.*epoch 5.*epoch 6"):
        assert decay_epochs([0.5, 0.52], 10) == [5, 6]


def test_short_run_never_merges_two_decays_into_one():
    """3 epochs: 0.5 and 0.8333 both round to epoch 2; epoch 3 is past the run, so it is dropped."""
    with pytest.warns(UserWarning, match=r"optim\.decay_at.*0\.8333333333.*dropped"):
        assert decay_epochs(DEFAULT_DECAYS, 3) == [2]
    with pytest.warns(UserWarning):
        lr = build_epoch_lr(optim_cfg("sgd", warmup_epochs=0), total_epochs=3, world_size=1,
                            batch_size=128)
    assert [lr(e) for e in range(3)] == pytest.approx([0.1, 0.1, 0.01])


def test_explicit_epochs_that_collide_are_an_error():
    with pytest.raises(ConfigError, match=r"optim\.decay_at.*epoch 5"):
        decay_epochs([5, 5], 10)
    with pytest.raises(ConfigError, match=r"optim\.decay_at.*epoch 6"), pytest.warns(UserWarning):
        decay_epochs([0.5, 0.52, 6], 10)  # 0.52 moved to epoch 6, where the explicit 6 is
    with pytest.raises(ConfigError, match="optim.decay_at"):
        decay_epochs([6, 5], 10)
