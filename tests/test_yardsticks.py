"""One yardstick per question, fixed by the question, and the interleaved rounds."""

import math

import pytest

from helpers import bench, verdicts

# a baseline trained 3x with one seed (a 0.05% floor) and with 3 other seeds (a 0.9% spread)
NOISE = verdicts.NoiseFloor(same_seed=(2.7225, 2.7230, 2.7239), other_seed=2.7470,
                            other_seeds=(2.7100, 2.7312))


def test_the_yardstick_is_fixed_by_the_question_not_by_the_larger_spread():
    assert NOISE.floor == pytest.approx((2.7239 - 2.7225) / 2.7225)  # of the same-seed runs
    with pytest.raises(ValueError, match="at least twice"):
        verdicts.NoiseFloor((2.4,))
    repeat, name_r = verdicts.yardstick(NOISE, "repeat")
    seeds, name_s = verdicts.yardstick(NOISE, "numerics")
    assert name_r == verdicts.REPEAT and name_s == verdicts.SEEDS
    assert repeat == pytest.approx((2.7239 - 2.7225) / 2.7225)
    assert seeds == pytest.approx((2.7470 - 2.7100) / 2.7225)
    # a narrower seed spread is still the seeds' yardstick (it is never swapped for the floor)
    narrow = verdicts.NoiseFloor(same_seed=(2.0, 2.01), other_seed=2.001)
    assert verdicts.yardstick(narrow, "numerics") == (pytest.approx(0.0005), verdicts.SEEDS)
    assert math.isnan(verdicts.yardstick(verdicts.NoiseFloor((2.0, 2.0)), "numerics")[0])
    with pytest.raises(ValueError):
        verdicts.yardstick(NOISE, "speed")


def test_a_difference_inside_the_other_seed_spread_is_not_a_finding():
    base = 2.7225
    # -1.2% (an FSDP2 drift) is 24x the same-seed floor but inside twice the seeds' spread
    assert verdicts.loss_reading(base * 0.988, base, NOISE).verdict == verdicts.SAME
    assert verdicts.loss_reading(base * 0.988, base, NOISE, question="repeat").verdict == "lower"
    assert verdicts.loss_reading(base * 1.05, base, NOISE).verdict == "higher"


def test_interleaved_rounds_rotate_the_order_and_time_every_candidate():
    order = []
    fns = {n: (lambda n=n: order.append(n)) for n in "abc"}
    out = bench.interleaved(fns, rounds=3, warmup=0, repeats=1, device="cpu")
    assert order == list("abc" "bcacababc")  # a first round, run and thrown away, then three
    assert {n: len(ts) for n, ts in out.items()} == {"a": 3, "b": 3, "c": 3}
    assert [t.meta["round"] for t in out["a"]] == [0, 1, 2]
    assert all(len(m) == 3 for m in bench.round_medians(out).values())
    order.clear()
    out = bench.interleaved(fns, rounds=2, warmup=0, repeats=1, device="cpu", discard=0)
    assert order == list("abcbca") and len(out["c"]) == 2
