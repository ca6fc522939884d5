"""The critical-regime detector on crafted gradients whose epoch norms we choose exactly."""

import io

import pytest
import torch

from accordion_repro.accordion import CriticalRegimeDetector

torch.set_num_threads(1)


def grad_with_norm(norm: float) -> torch.Tensor:
    """A 2-D gradient whose L2 norm is exactly `norm` (values exactly representable)."""
    return torch.tensor([[0.0, float(norm)], [0.0, 0.0]])


def run_epoch(detector, epoch, layer_norms, *, steps=1, lr_now=0.1, lr_next=0.1):
    """Feed `steps` identical steps so the epoch sum has norm steps * norm (mean: norm)."""
    for _ in range(steps):
        detector.accumulate([grad_with_norm(n) for n in layer_norms])
    return detector.end_epoch(epoch, lr_now, lr_next)


def test_epoch_zero_every_layer_critical_and_nothing_compared():
    det = CriticalRegimeDetector(3, eta=0.5, interval=10)
    assert det.critical == [True, True, True]      # the plan for epoch 0
    flags = run_epoch(det, 0, [1.0, 2.0, 0.0])
    assert flags == [True, True, True]
    assert det.report["checked"] is True
    assert det.report["ratios"] is None
    assert det.report["norms"] == [1.0, 2.0, 0.0]


def test_ratio_exactly_eta_is_critical_and_just_below_is_not():
    det = CriticalRegimeDetector(2, eta=0.5, interval=1)
    run_epoch(det, 0, [4.0, 4.0])
    flags = run_epoch(det, 1, [2.0, 2.5])           # ratios 0.5 and 0.375
    assert det.report["ratios"] == [0.5, 0.375]
    assert flags == [True, False]


def test_rising_norm_counts_like_falling_norm():
    det = CriticalRegimeDetector(3, eta=0.5, interval=1)
    run_epoch(det, 0, [4.0, 4.0, 4.0])
    flags = run_epoch(det, 1, [6.0, 2.0, 5.5])      # +50 %, -50 %, +37.5 %
    assert det.report["ratios"] == [0.5, 0.5, 0.375]
    assert flags == [True, True, False]


def test_previous_norm_zero_counts_as_critical():
    det = CriticalRegimeDetector(3, eta=0.5, interval=1)
    run_epoch(det, 0, [0.0, 0.0, 4.0])
    flags = run_epoch(det, 1, [3.0, 0.0, 4.0])
    assert flags == [True, True, False]
    assert det.report["ratios"] == [None, None, 0.0]


def test_checks_only_at_multiples_of_the_interval():
    det = CriticalRegimeDetector(1, eta=0.5, interval=3)
    norms = [4.0, 4.0, 40.0, 4.1, 0.5, 40.0, 4.2]   # wild swings between checks
    flags, checked, compared = [], [], []
    for epoch, norm in enumerate(norms):
        flags.append(run_epoch(det, epoch, [norm])[0])
        checked.append(det.report["checked"])
        compared.append(det.report["compared_with_epoch"])
    assert checked == [True, False, False, True, False, False, True]
    assert compared == [None, None, None, 0, None, None, 3]
    # epoch 0 starts critical; epoch 3 compares 4.1 with 4.0 (calm); epoch 6 compares 4.2 with 4.1
    assert flags == [True, True, True, False, False, False, False]


def test_lr_rule_fires_on_the_epoch_before_a_decay_and_holds_until_the_next_check():
    det = CriticalRegimeDetector(1, eta=0.5, interval=5)
    lrs = [0.1] * 8 + [0.01] * 4                   # the LR drops from epoch 8 on
    flags, fired = [], []
    for epoch in range(11):
        flags.append(run_epoch(det, epoch, [4.0], lr_now=lrs[epoch], lr_next=lrs[epoch + 1])[0])
        fired.append(det.report["lr_rule_fired"])
    assert fired == [e == 7 for e in range(11)]
    # calm from the check at 5; the decay sends the layer back to low for epoch 8 on, until the
    # check at 10 (4.0 vs 4.0) says calm again
    assert flags == [True] * 5 + [False, False, True, True, True, False]


def test_lr_rule_wins_over_a_calm_check_in_the_same_epoch():
    det = CriticalRegimeDetector(1, eta=0.5, interval=1)
    run_epoch(det, 0, [4.0])
    assert run_epoch(det, 1, [4.0], lr_now=0.1, lr_next=0.01) == [True]
    assert det.report["checked"] and det.report["ratios"] == [0.0]


def test_lr_rule_ignores_warmup_and_can_be_switched_off():
    det = CriticalRegimeDetector(1, eta=0.5, interval=1)
    run_epoch(det, 0, [4.0], lr_now=0.1, lr_next=0.16)
    assert run_epoch(det, 1, [4.0], lr_now=0.16, lr_next=0.22) == [False]
    off = CriticalRegimeDetector(1, eta=0.5, interval=1, lr_decay_rule=False)
    run_epoch(off, 0, [4.0])
    assert run_epoch(off, 1, [4.0], lr_now=0.1, lr_next=0.01) == [False]
    assert off.report["lr_rule_fired"] is False


def test_mean_statistic_ignores_a_change_in_steps_per_epoch_and_sum_does_not():
    # the same per-step gradient, 8 steps then 1 step per epoch (as B_low -> B_high would do)
    mean = CriticalRegimeDetector(1, eta=0.5, interval=1, statistic="mean")
    summed = CriticalRegimeDetector(1, eta=0.5, interval=1, statistic="sum")
    for det in (mean, summed):
        run_epoch(det, 0, [2.0], steps=8)
    assert run_epoch(mean, 1, [2.0], steps=1) == [False]
    assert run_epoch(summed, 1, [2.0], steps=1) == [True]
    assert summed.report["norms"] == [2.0] and summed.report["ratios"] == [0.875]


def test_mean_and_sum_agree_when_steps_per_epoch_are_constant():
    norms = [[4.0, 1.0], [2.0, 1.25], [2.5, 1.0], [1.0, 3.0]]
    results = {}
    for statistic in ("mean", "sum"):
        det = CriticalRegimeDetector(2, eta=0.5, interval=1, statistic=statistic)
        results[statistic] = [run_epoch(det, e, n, steps=4) for e, n in enumerate(norms)]
    assert results["mean"] == results["sum"]


def test_model_granularity_uses_the_whole_model_norm():
    det = CriticalRegimeDetector(2, eta=0.5, interval=1, granularity="model")
    assert run_epoch(det, 0, [3.0, 4.0]) == [True]
    assert det.report["norms"] == [5.0]
    # one layer halves, the other barely moves: the model norm changes by less than eta
    assert run_epoch(det, 1, [1.5, 4.0]) == [False]
    both = CriticalRegimeDetector(2, eta=0.5, interval=1, granularity="layer+model")
    run_epoch(both, 0, [3.0, 4.0])
    assert run_epoch(both, 1, [1.5, 4.0]) == [True, False, False]
    assert len(both.report["norms"]) == 3


def test_sums_are_preallocated_and_reset_in_place():
    det = CriticalRegimeDetector(2, interval=1)
    det.accumulate([torch.ones(3, 2), torch.ones(2, 2)])
    pointers = [s.data_ptr() for s in det._sums]
    det.end_epoch(0, 0.1, 0.1)
    det.accumulate([torch.ones(3, 2), torch.ones(2, 2)])
    assert [s.data_ptr() for s in det._sums] == pointers
    det.end_epoch(1, 0.1, 0.1)
    assert det.report["norms"] == [pytest.approx(6 ** 0.5), 2.0]


def test_half_precision_gradients_are_summed_in_float32():
    det = CriticalRegimeDetector(1, interval=1, statistic="sum")
    for _ in range(4):
        det.accumulate([torch.full((2, 2), 0.5, dtype=torch.bfloat16)])
    det.end_epoch(0, 0.1, 0.1)
    assert det.report["norms"] == [4.0]


def test_wrong_number_of_gradients_is_refused():
    det = CriticalRegimeDetector(2)
    with pytest.raises(ValueError, match="expected 2 gradients"):
        det.accumulate([torch.ones(2, 2)])


def _through_checkpoint(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_restored_detector_makes_the_same_decisions():
    generator = torch.Generator().manual_seed(0)
    epochs = [[torch.randn(4, 3, generator=generator) * (1 + e % 7) for _ in range(3)]
              for e in range(14)]
    lrs = [0.4] * 9 + [0.04] * 6

    def play(det, start, stop, *, stop_mid_epoch=False):
        out = []
        for epoch in range(start, stop):
            for grads in ([epochs[epoch][0], epochs[epoch][1]], [epochs[epoch][2]] * 2):
                det.accumulate(grads)
                if stop_mid_epoch and epoch == stop - 1:
                    return out
            out.append((det.end_epoch(epoch, lrs[epoch], lrs[epoch + 1]), dict(det.report)))
        return out

    settings = dict(eta=0.3, interval=3, lr_decay_rule=True, granularity="layer+model")
    reference = play(CriticalRegimeDetector(2, **settings), 0, 14)

    first = CriticalRegimeDetector(2, **settings)
    before = play(first, 0, 7, stop_mid_epoch=True)        # stops after one step of epoch 6
    restored = CriticalRegimeDetector(2, **settings)
    restored.load_state_dict(_through_checkpoint(first.state_dict()))
    # finish epoch 6 from its second step, then go on
    restored.accumulate([epochs[6][2]] * 2)
    after = [(restored.end_epoch(6, lrs[6], lrs[7]), dict(restored.report))]
    after += play(restored, 7, 14)
    assert before + after == reference


def test_restore_refuses_other_settings():
    det = CriticalRegimeDetector(2, interval=10)
    with pytest.raises(ValueError, match="settings differ"):
        CriticalRegimeDetector(2, interval=5).load_state_dict(det.state_dict())
