"""Verdicts read against their noise: loss differences against a measured floor, timings
against their spreads. Each test states a case a careless verdict gets wrong."""

from __future__ import annotations

import math

import pytest

from helpers import verdicts


def test_the_floor_is_the_largest_same_seed_difference_relative_to_the_baseline():
    noise = verdicts.NoiseFloor((2.40, 2.41, 2.404), other_seed=2.39, what="path 3")
    assert noise.floor == pytest.approx(0.01 / 2.40)
    assert noise.seed_spread == pytest.approx(0.01 / 2.40)
    with pytest.raises(ValueError, match="at least twice"):
        verdicts.NoiseFloor((2.4,))


@pytest.mark.parametrize("diff, floor, verdict", [
    (0.001, 0.002, "within noise"),          # smaller than the floor: never beyond it
    (0.003, 0.002, "within noise"),          # above the floor but within NOISE_FACTOR x it
    (-0.0039, 0.002, "within noise"),        # the sign does not matter
    (0.005, 0.002, "higher"),
    (-0.010, 0.002, "lower"),
    (0.0, 0.0, "within noise"),              # a machine that repeats runs exactly, no change
    (1e-6, 0.0, "higher"),                   # ... where any change is beyond its floor of 0
    (math.nan, 0.002, "not measured"),
])
def test_a_difference_is_read_against_the_floor(diff, floor, verdict):
    assert verdicts.loss_verdict(diff, floor) == verdict


def test_the_loss_table_reads_every_run_against_its_yardstick_and_the_target():
    noise = verdicts.NoiseFloor((2.400, 2.406))  # floor 0.25%
    table = verdicts.loss_table({"1": 2.400, "2": 2.404, "3": 2.430, "4": 2.50}, "1", noise,
                                question="repeat")
    by = table.set_index("run")
    assert by.loc["1", "verdict"] == "baseline"
    assert by.loc["2", "verdict"] == "within noise"       # 0.17% < 2 x floor
    assert by.loc["3", "verdict"] == "higher"             # 1.25% > 2 x 0.25%
    assert by.loc["3", "target"] == "within" and by.loc["4", "target"] == "beyond"
    assert list(by["yardstick_pct"]) == pytest.approx([0.25] * 4)
    with pytest.raises(KeyError, match="baseline"):
        verdicts.loss_table({"2": 2.4}, "1", noise)


def test_overlapping_timings_are_never_reported_as_a_speedup():
    # medians 20% apart, but the distributions overlap: no ratio, no winner
    word, _, why = verdicts.pair(10.0, 12.0, a_iqr=(9.5, 11.5), b_iqr=(11.0, 13.0))
    assert (word, why) == (verdicts.TIE_WORD, "IQRs overlap")
    assert verdicts.label(word, 1.2) == "tie"
    assert verdicts.is_tie(10.0, 12.0, a_iqr=(9.5, 11.5), b_iqr=(11.0, 13.0))


def test_a_timing_whose_spread_is_a_large_share_of_its_median_is_not_compared():
    # the cold first run: a 384 ms median with an IQR as wide as it, against 11.8 ms
    word, _, why = verdicts.pair(384.0, 11.8, a_iqr=(200.0, 600.0), b_iqr=(11.5, 12.1))
    assert word == verdicts.TIE_WORD and "cold caches or a busy machine" in why
    # the same medians with tight spreads are a finding
    word, speedup, why = verdicts.pair(384.0, 11.8, a_iqr=(380.0, 390.0), b_iqr=(11.5, 12.1))
    assert (word, why) == ("slower", "") and verdicts.label(word, speedup) == "slower 0.03x"
    assert verdicts.too_noisy(10.0, (9.0, 12.6)) and not verdicts.too_noisy(10.0, (9.0, 11.0))
