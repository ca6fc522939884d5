"""The paired statistics against values computed by hand and printed t tables."""

import math

import pytest

from accordion_repro.analysis.stats import (PairedStats, holm, matches, paired_stats,
                                            t_central_probability,
                                            t_quantile)

# Two-sided 95 % points of Student's t (any printed table; e.g. Fisher & Yates, Table III).
T_TABLE_975 = {1: 12.7062, 2: 4.3027, 3: 3.1824, 4: 2.7764, 5: 2.5706, 9: 2.2622, 30: 2.0423}


@pytest.mark.parametrize("df", sorted(T_TABLE_975))
def test_t_quantile_matches_the_printed_table(df):
    assert t_quantile(0.95, df) == pytest.approx(T_TABLE_975[df], abs=1e-4)


def test_two_degrees_of_freedom_have_the_textbook_closed_form():
    # With 2 degrees of freedom P(|T| <= t) = t / sqrt(t^2 + 2); 95 %: t = sqrt(0.95^2 * 2 / (1 - 0.95^2)).
    for t in (0.3, 1.0, 4.0, 17.0):
        assert t_central_probability(t, 2) == pytest.approx(t / math.sqrt(t * t + 2), rel=1e-12)
    assert t_quantile(0.95, 2) == pytest.approx(math.sqrt(0.95**2 * 2 / (1 - 0.95**2)), rel=1e-12)


def test_one_degree_of_freedom_is_the_cauchy_distribution():
    for t in (0.5, 2.0, 12.7):
        assert t_central_probability(t, 1) == pytest.approx(2 / math.pi * math.atan(t), rel=1e-12)


def test_paired_stats_of_a_case_worked_by_hand():
    # Differences 1, 2, 3: mean 2, sample std 1, standard error 1/sqrt(3), t = 2 sqrt(3) with 2
    # degrees of freedom: p = 1 - t / sqrt(t^2 + 2) = 1 - sqrt(12/14) = 0.074180;
    # the interval is 2 -+ 4.302653 / sqrt(3) = 2 -+ 2.484138.
    result = paired_stats([1.0, 2.0, 3.0])
    assert (result.n, result.mean, result.std, result.positive) == (3, 2.0, 1.0, 3)
    assert result.p == pytest.approx(1 - math.sqrt(12 / 14), abs=1e-9)
    assert result.ci_low == pytest.approx(2 - 2.484138, abs=1e-6)
    assert result.ci_high == pytest.approx(2 + 2.484138, abs=1e-6)
    assert result.undecided  # the interval spans zero although every difference is positive


def test_a_clear_difference_is_decided_and_a_mixed_one_is_not():
    assert not paired_stats([0.74, 0.69, 0.35]).undecided
    mixed = paired_stats([0.16, -0.57, 0.03])
    assert mixed.undecided and mixed.positive == 2 and mixed.p > 0.5


def test_one_difference_has_no_spread_interval_or_p():
    assert paired_stats([0.4]) == PairedStats(1, 0.4, None, None, None, None, 1)


@pytest.mark.parametrize("bad", [0, 1.5, -2])
def test_degrees_of_freedom_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="positive integer"):
        t_central_probability(1.0, bad)


def test_holm_multiplies_the_ith_smallest_p_by_m_minus_i_plus_1_and_keeps_the_order():
    # sorted: 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (never below the step
    # before it); returned in the order given
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.042]) == pytest.approx([0.042])


def test_matches_says_nothing_below_three_seeds_and_reads_mean_within_two_std():
    reference = [85.0, 85.2, 85.4]  # mean 85.2, sample std 0.2: the band is 84.8 to 85.6
    assert matches([85.5, 85.6, 85.7], reference) is True
    assert matches([85.6, 85.7, 85.8], reference) is False
    assert matches([85.2, 85.2], reference) is None and matches([85.2] * 3, reference[:2]) is None
