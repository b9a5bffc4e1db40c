"""Notebook 06's loss readings against the noise floor of its bf16 baseline: the end-to-end table,
the verdict and the summary call a float8 loss difference within noise when it is no larger than
NOISE_FACTOR x the floor and beyond noise when it is larger, say when no floor was measured or
when the floor is too wide for the 2% target, and never call a winner from step times whose
spread is too wide."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from helpers import bench, gpt, verdicts
from helpers.chapters import fp8

LABELS = {"bf16": "path 4 (bf16)", "tensorwise": "path 4 + float8 tensorwise",
          "rowwise": "path 4 + float8 rowwise"}
BASE = 3.0  # path 4's validation loss
E4M3 = torch.float8_e4m3fn


def _run(label, ms, val_loss, spread=0.01, steps=20):
    losses = [5.5 - 3.0 * i / steps for i in range(steps)]
    step_ms = [100.0] + [ms * (1 + spread * ((i % 3) - 1)) for i in range(steps - 1)]
    return bench.Run(label, "cuda", losses=losses, step_ms=step_ms, warmup=1, peak_mem_gib=2.0,
                     extra={"tokens_per_step": 32768, "val_loss": val_loss, "checksum": 7,
                            "compile_s": 20.0})


def _noise(floor: float) -> verdicts.NoiseFloor:
    """Four same-seed runs of path 4 whose largest difference is ``floor`` of its loss, and a
    run from another seed 0.05% away (inside the floor: the floor is the yardstick)."""
    return verdicts.NoiseFloor((BASE, BASE * (1 + floor), BASE * (1 + floor / 2), BASE),
                               other_seed=BASE * 1.0005, what="path 4 (bf16)")


def _e2e(tw_diff, rw_diff, *, noise=None, tw_ms=40.0, rw_ms=40.0, tw_spread=0.01):
    runs = {"bf16": _run(LABELS["bf16"], 50.0, BASE),
            "tensorwise": _run(LABELS["tensorwise"], tw_ms, BASE * (1 + tw_diff),
                               spread=tw_spread),
            "rowwise": _run(LABELS["rowwise"], rw_ms, BASE * (1 + rw_diff))}
    return fp8.end_to_end_table(runs, LABELS, flops_per_token=gpt.flops_per_token(gpt.GPT2_SMALL),
                                peak_tflops=989.0, noise=noise)


def _line(text: str, recipe: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"float8 {recipe} "))


def _sweep() -> pd.DataFrame:
    rows = [{"shape": "768x768", "kind": "square", "tokens": 1024, "in_features": 768,
             "out_features": 768, "recipe": recipe, "mode": "compiled", "median_ms": ms,
             "q1_ms": 0.99 * ms, "q3_ms": 1.01 * ms, "iqr_ms": 0.02 * ms, "compile_s": 1.0}
            for recipe, ms in (("bf16", 1.0), ("tensorwise", 0.8), ("rowwise", 0.8))]
    return fp8.sweep_table(rows)


def test_the_table_puts_the_floor_and_its_reading_beside_the_difference():
    floor = 0.004
    table = _e2e(0.003, 0.012, noise=_noise(floor)).set_index("recipe")
    assert table["noise_floor_pct"].tolist() == pytest.approx([100 * floor] * 3)
    assert table.loc["bf16", "loss_reading"] == "baseline"
    assert table.loc["tensorwise", "loss_reading"] == "within noise"  # 0.3% < 0.4%
    assert table.loc["rowwise", "loss_reading"] == "beyond noise by 3.0x the floor"  # 1.2%
    assert table["within_target"].all()
    far = _e2e(0.003, 0.03, noise=_noise(floor)).set_index("recipe")
    assert not far.loc["rowwise", "within_target"] and far.loc["tensorwise", "within_target"]
    bare = _e2e(0.003, 0.012).set_index("recipe")  # no floor measured: no reading invented
    assert bare["noise_floor_pct"].isna().all()
    assert bare.loc["rowwise", "loss_reading"] == "not measured"


def _row(e2e, recipe, noise=None):
    return next(r for r in fp8.verdict_rows("GPT 12 x 768", e2e, noise) if r["recipe"] == recipe)


@pytest.mark.parametrize(("diff", "said"), [
    (0.001, "within noise"),  # smaller than the floor
    (-0.007, "within noise"),  # larger than the floor, not NOISE_FACTOR x it
    (0.0081, "beyond noise by 2.0x the floor"),
    (-0.016, "beyond noise by 4.0x the floor")])
def test_the_verdict_reads_each_loss_difference_against_the_floor(diff, said):
    floor = 0.004
    assert verdicts.NOISE_FACTOR == 2.0
    e2e = _e2e(diff, 0.0, noise=_noise(floor))
    row = _row(e2e, "tensorwise", _noise(floor))
    assert row["loss_reading"] == said and row["within_target"]
    assert row["yardstick"] == fp8.SAME_SEED and row["yardstick_pct"] == pytest.approx(0.4)
    assert row["val_loss_diff_pct"] == pytest.approx(100 * diff)
    assert _row(e2e, "tensorwise") == row  # the table's columns alone give the same reading


def test_a_faster_float8_run_is_credited_with_its_loss_reading():
    table = pd.DataFrame(fp8.verdict_rows("GPT 12 x 768", _e2e(0.001, 0.012,
                                                               noise=_noise(0.004))))
    assert table["speeds_up"].all()
    sentence = fp8.verdict_sentence(table, "GPT 12 x 768", "H200")
    assert "float8 speeds up its training on this run" in sentence
    assert "tensorwise 1.25x faster (+0.10% loss, within noise)" in sentence
    assert "rowwise 1.25x faster (+1.20% loss, beyond noise by 3.0x the floor)" in sentence


def test_without_a_floor_no_loss_is_called_within_or_beyond_noise():
    for recipe in ("tensorwise", "rowwise"):
        row = _row(_e2e(0.001, 0.012), recipe)
        assert row["loss_reading"] == "not read" and row["yardstick"] == "none measured"
    words, _ = fp8.loss_reading(0.1, math.nan)
    assert words.startswith("not read against a run-to-run scale") and "noise" not in words


def test_a_floor_too_wide_for_the_target_does_not_let_the_target_be_called_held():
    wide = _noise(0.012)  # twice the floor, 2.4%, is beyond the 2% target
    row = _row(_e2e(0.001, 0.001, noise=wide), "tensorwise", wide)
    assert row["loss_reading"] == "within noise; too wide to read the 2% target"
    assert not row["within_target"] and not row["speeds_up"]
    words, held = fp8.loss_reading(0.1, 0.012)
    assert not held and "too wide" in words


def test_a_zero_floor_without_another_seed_judges_no_difference():
    exact = verdicts.NoiseFloor((BASE, BASE, BASE), what="path 4 (bf16)")  # a CPU: exact repeats
    assert math.isnan(fp8.loss_yardstick(exact)[0])
    table = _e2e(0.0001, 0.0, noise=exact).set_index("recipe")
    assert table.loc["tensorwise", "loss_reading"] == "not measured"  # a floor of 0 judges nothing
    assert not table.loc["tensorwise", "loss_reading"].startswith("beyond")


def test_a_zero_floor_reads_the_loss_against_another_seeds_spread():
    exact = verdicts.NoiseFloor((BASE, BASE), other_seed=BASE * 1.002, what="wide (bf16)")
    scale, name = fp8.loss_yardstick(exact)
    assert scale == pytest.approx(0.002) and name == fp8.OTHER_SEED
    table = _e2e(0.003, 0.005, noise=exact).set_index("recipe")
    assert table.loc["tensorwise", "loss_reading"] == "within 2x another seed's spread"
    assert table.loc["rowwise", "loss_reading"] == "beyond another seed's spread by 2.5x"
    assert (table["yardstick"] == fp8.OTHER_SEED).all()
    assert table["yardstick_pct"].iloc[0] == pytest.approx(0.2)
    # a floor above 0 stays the yardstick, whatever the other seed did
    assert fp8.loss_yardstick(_noise(0.004)) == (pytest.approx(0.004), fp8.SAME_SEED)


def test_a_timing_whose_spread_is_too_wide_is_not_called_faster():
    e2e = _e2e(0.001, 0.001, noise=_noise(0.004), tw_ms=30.0, tw_spread=0.4, rw_ms=50.0)
    row = _row(e2e, "tensorwise", _noise(0.004))
    assert row["step_time"].startswith("cannot be told apart (a spread of")
    assert not row["speeds_up"]


def test_the_summary_reads_the_losses_against_the_floor():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    grown = fp8.outlier_sweep(x, [1.0, 1e6], [(E4M3, "tensorwise")], row=0)
    correctness = pd.DataFrame([{"recipe": "tensorwise", "product": "output", "rel_err": 0.03,
                                 "ok": True, "kernel": "FP8 tensor cores"}])
    noise = _noise(0.004)
    verdict = pd.DataFrame(fp8.verdict_rows("GPT 12 x 768", _e2e(0.003, 0.012, noise=noise),
                                            noise))
    table = fp8.summary_table(grown, correctness, _sweep(), verdict, pd.DataFrame())
    by = dict(zip(table["topic"], table["on this run"], strict=True))
    assert ("loss +0.300%, within noise (the same-seed noise floor)"
            in by["GPT 12 x 768, tensorwise"])
    assert "beyond noise by 3.0x the floor" in by["GPT 12 x 768, rowwise"]


def test_loss_reading_handles_a_missing_loss():
    words, held = fp8.loss_reading(math.nan, 0.004)
    assert not held and words == "no validation loss to compare"


def test_another_seeds_spread_wider_than_the_floor_is_the_yardstick():
    """A run that repeats almost exactly (floor 1e-6) but moves 4.7% with another seed - the
    wide model on the H200 - reads a float8 loss 4.3% lower against the seed's spread, not as
    a finding 29,000 times its floor; too wide a yardstick leaves the 2% target unread, and
    the verdict credits the speed without claiming the target."""
    near = verdicts.NoiseFloor((2.9593, 2.9593 * (1 + 1e-6)), other_seed=3.0973, what="wide")
    scale, name = fp8.loss_yardstick(near)
    assert name == fp8.OTHER_SEED and scale == pytest.approx(0.04663, rel=1e-3)
    e2e = _e2e(-0.0427, 0.0, noise=near, tw_ms=36.0)
    rows = fp8.verdict_rows("wide", e2e[e2e["recipe"] != "rowwise"], near)
    (row,) = rows
    assert row["faster"] and not row["target_readable"] and not row["speeds_up"]
    assert "within 2x another seed's spread" in row["loss_reading"]
    sentence = fp8.verdict_sentence(pd.DataFrame(rows), "wide", "H200")
    assert "float8 is faster on this run" in sentence and "cannot say whether" in sentence
    assert "does not speed up" not in sentence
