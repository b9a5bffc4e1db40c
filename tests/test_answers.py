"""The one answer rule: effects in words, verdicts from intervals, honest both ways."""

import math

import numpy as np
import pandas as pd
import pytest

from helpers import verdicts as v


@pytest.mark.parametrize("ratio, effect", [
    (1 / 49, "49x faster"), (1 / 1.32, "1.32x faster"), (1.19, "19% slower"),
    (49.0, "49x slower"), (463.0, "463x slower"), (2.3, "2.3x slower")])
def test_effect_says_how_big(ratio, effect):
    assert v.read(ratio).effect == effect


@pytest.mark.parametrize("kind", ["time", "memory", "loss"])
@pytest.mark.parametrize("ratio", [0.02, 0.4, 2.5, 463.0])
@pytest.mark.parametrize("spread", [0.0, 0.1])  # exact, and the widest interval a run gives
def test_a_large_effect_is_never_the_same(kind, ratio, spread):
    reading = v.read(ratio, ratio * (1 - spread), ratio * (1 + spread), kind=kind)
    assert reading.verdict in v.verdict_words(kind)[:2]  # a direction, never "same"


def test_interval_straddling_the_margin_cannot_tell():
    r = v.rounds_reading([1.0, 0.9, 1.08], [1.0, 1.0, 1.0])
    assert r.verdict == v.UNSURE and r.effect.startswith("cannot tell: ")
    assert v.rounds_reading([0.5, 0.6, 0.55], [1, 1, 1]).verdict == "faster"
    assert v.rounds_reading([1.01, 0.99, 1.0], [1, 1, 1]).verdict == v.SAME
    assert v.read(1.0, 0.99, 1.01).effect == "same within 3%"


def test_samples_interval_separates_only_what_differs():
    rng = np.random.default_rng(1)
    a, b = 1 + 0.01 * rng.standard_normal(50), 1.2 + 0.01 * rng.standard_normal(50)
    assert v.samples_reading(a, b).verdict == "faster"
    assert v.samples_reading(a, a[::-1]).verdict == v.SAME


def test_loss_is_decidable_when_the_runs_agree_within_the_yardstick():
    noise = v.NoiseFloor((2.0, 2.0005), other_seed=2.04)  # seeds spread 2%
    r = v.loss_reading(2.01, 2.0, noise)  # 0.5% apart: inside 2 x 2%
    assert r.verdict == v.SAME and r.effect == "same within 4%"
    assert v.loss_reading(2.3, 2.0, noise).verdict == "higher"
    assert v.loss_reading(2.3, 2.0, v.NoiseFloor((2.0, 2.0))).verdict == v.MISSING  # no seeds
    assert v.loss_reading(2.0, 2.0, None).verdict == v.MISSING


def test_per_call_faster_on_both_is_faster_on_any_host():
    fast, slow, same = v.read(0.5), v.read(2.0), v.read(1.0)
    assert v.per_call_reading(fast, v.read(0.8)) == ("faster", "at least 1.25x faster")
    assert v.per_call_reading(fast, slow)[0] == v.HOST
    assert v.per_call_reading(same, same)[0] == v.SAME


def test_answers_one_row_one_verdict_and_checked():
    a = v.Answers("99")
    a.rounds("Is X faster than Y?", "X", "Y", [1.0, 1.1, 1.05], [2.0, 2.1, 2.2])
    a.exact("Does X use less memory?", "X", "Y", 9.0, 10.0, measure="peak memory",
            unit="GiB", kind="memory")
    a.missing("Is Apex faster?", "apex", "torch", "Apex is not built here", feature="FusedAdam")
    a.rounds("Is X faster than Y?", "X", "Y", [1.0, 1.1, 1.05], [2.0, 2.1, 2.2])  # re-run
    df = a.table()
    assert list(df.verdict) == ["less", v.MISSING, "faster"]  # one row per question
    assert v.check_answers(df) == []
    bad = pd.DataFrame([dict(df.iloc[2]) | dict(verdict="same"),
                        dict(df.iloc[2]) | dict(ratio=1.0, ratio_lo=0.9, ratio_hi=1.1)])
    found = v.check_answers(bad)
    assert len(found) == 2 and "'same'" in found[0] and "reaches into" in found[1]
    assert math.isnan(df.ratio.iloc[1])
