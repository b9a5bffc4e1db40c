"""The rules every verdict follows (helpers.verdicts): one yardstick per question, fixed by the
question; host-bound timings read against their interleaved rounds; compact verdict labels."""

import math

import pytest

from helpers import bench, verdicts

# a baseline trained 3x with one seed (a 0.05% floor) and with 3 other seeds (a 0.9% spread)
NOISE = verdicts.NoiseFloor(same_seed=(2.7225, 2.7230, 2.7239), other_seed=2.7470,
                            other_seeds=(2.7100, 2.7312))


def test_the_yardstick_is_fixed_by_the_question_not_by_the_larger_spread():
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
    seeds, _ = verdicts.yardstick(NOISE, "numerics")
    # -1.2% (07's FSDP2 drift) is 24x the same-seed floor but inside twice the seeds' spread
    assert verdicts.loss_verdict(-0.012, seeds) == "within noise"
    assert verdicts.loss_verdict(-0.012, verdicts.yardstick(NOISE, "repeat")[0]) == "lower"
    assert verdicts.loss_verdict(+0.05, seeds) == "higher"
    assert verdicts.loss_verdict(0.01, math.nan) == "not measured"
    table = verdicts.loss_table({"plain": 2.7225, "fsdp2": 2.7225 * (1 - 0.012)}, "plain", NOISE)
    row = table.set_index("run").loc["fsdp2"]
    assert (row.yardstick, row.verdict) == (verdicts.SEEDS, "within noise")


@pytest.mark.parametrize(("diff", "scale", "want"), [
    (0.001, 0.002, "within"), (0.0236, 0.009, "undecided"), (0.0159, 0.009, "undecided"),
    (0.05, 0.009, "beyond"), (-0.05, 0.009, "beyond"), (0.019, 0.0, "within"),
    (0.021, 0.0, "beyond"), (math.nan, 0.01, "not measured"), (0.001, math.nan, "within")])
def test_the_target_is_read_against_the_noise(diff, scale, want):
    assert verdicts.target_verdict(diff, scale) == want


def test_overlapping_rounds_are_never_a_speedup():
    # b is 10% slower in its median, but one round of four reverses it: no verdict
    a, b = [2.0, 2.1, 2.0, 2.3], [2.2, 2.3, 2.2, 2.2]
    assert verdicts.rounds_reason(a, b)[0] == verdicts.TIE_WORD
    assert verdicts.rounds_reason(a, [x * 1.2 for x in a])[0] == "faster"
    assert verdicts.rounds_reason([x * 1.2 for x in a], a)[0] == "slower"
    assert verdicts.rounds_reason(a, [x * 1.01 for x in a]) == (verdicts.TIE_WORD,
                                                                "every round within 3%")
    # a's rounds range 50% (the host changed speed), yet b lost every round: still a verdict
    assert verdicts.rounds_reason([2.0, 3.0, 2.0], [4.0, 4.0, 4.0])[0] == "faster"
    assert verdicts.rounds_reason([2.0, 4.1, 2.0], [4.0, 4.0, 4.0])[0] == verdicts.TIE_WORD
    table = verdicts.rounds_table({"a": a, "b": b, "c": [x * 1.5 for x in a]},
                                  [("a", "b"), ("a", "c"), ("a", "missing")])
    assert list(table["label"]) == ["tie", "faster 1.50x"]
    assert verdicts.fastest_by_rounds({"a": a, "b": b, "c": [x * 1.5 for x in a]}) == ("a", ["b"])


def test_each_candidate_has_its_own_stability_flag():
    table = verdicts.round_stability({"ddp": [10.17, 10.21, 10.19], "fsdp2": [10.2, 15.4, 11.0]})
    assert dict(zip(table.candidate, table.stable, strict=True)) == {"ddp": True, "fsdp2": False}


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


@pytest.mark.parametrize(("word", "speedup", "want"), [
    ("faster", 1.404, "faster 1.40x"), ("slower", 0.891, "slower 0.89x"),
    (verdicts.TIE_WORD, 1.01, "tie"), ("unstable", 2.0, "unstable")])
def test_compact_labels(word, speedup, want):
    assert verdicts.label(word, speedup) == want
