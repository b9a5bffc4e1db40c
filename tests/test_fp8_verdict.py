"""Notebook 06's verdict as one table and its summary as a table: a row per model and float8
recipe, the step time read by the tie rule, the loss read against the model's own yardstick
(its same-seed floor, or another seed's spread where the same-seed runs repeat exactly), and
one sentence per model computed from the rows."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from helpers import bench, verdicts
from helpers.chapters import fp8

WIDE = {"bf16": "GPT 2 x 4096 (bf16)", "tensorwise": "GPT 2 x 4096 + float8 tensorwise"}


def _run(label, ms, val_loss, spread=0.03, steps=20):
    losses = [6.3 - 3.0 * i / steps for i in range(steps)]
    step_ms = [9000.0] + [ms * (1 + spread * ((i % 3) - 1)) for i in range(steps - 1)]
    return bench.Run(label, "cuda", losses=losses, step_ms=step_ms, warmup=1, peak_mem_gib=15.0,
                     extra={"tokens_per_step": 32768, "val_loss": val_loss, "checksum": 7})


def _wide(fp8_loss, *, fp8_ms=100.4, other=3.1180 * 1.004):
    """The H200 run's wide model in numbers: bf16 140.7 ms/step, float8 100.4 ms/step, the
    same-seed repeat exactly equal (floor 0), and another seed's run ``other``."""
    noise = verdicts.NoiseFloor((3.1180, 3.1180), other, what=WIDE["bf16"])
    runs = {"bf16": _run(WIDE["bf16"], 140.7, 3.1180),
            "tensorwise": _run(WIDE["tensorwise"], fp8_ms, fp8_loss)}
    e2e = fp8.end_to_end_table(runs, WIDE, flops_per_token=4e9, peak_tflops=989.0, noise=noise)
    return e2e, noise


def test_the_wide_model_faster_with_its_loss_inside_the_other_seeds_spread_speeds_up():
    e2e, noise = _wide(3.1180 * 0.997)  # -0.3%: inside twice the other seed's 0.4%
    [row] = fp8.verdict_rows("GPT 2 x 4096", e2e, noise)
    assert row["step_time"] == f"{140.7 / 100.4:.2f}x faster" and row["speeds_up"]
    assert row["yardstick"] == fp8.OTHER_SEED and row["yardstick_pct"] == pytest.approx(0.4)
    assert row["loss_reading"] == "within 2x another seed's spread" and row["within_target"]
    sentence = fp8.verdict_sentence(pd.DataFrame([row]), "GPT 2 x 4096", "NVIDIA H200")
    assert sentence.startswith("GPT 2 x 4096 (NVIDIA H200): float8 speeds up its training")
    assert "tensorwise 1.40x faster" in sentence


def test_a_loss_outside_the_target_does_not_speed_up_however_fast():
    e2e, noise = _wide(3.1180 * (1 - 0.03366))  # the H200 run's -3.366%
    [row] = fp8.verdict_rows("GPT 2 x 4096", e2e, noise)
    assert row["step_time"].endswith("faster") and not row["within_target"]
    assert not row["speeds_up"] and row["loss_reading"].startswith("beyond another seed's spread")
    sentence = fp8.verdict_sentence(pd.DataFrame([row]), "GPT 2 x 4096", "NVIDIA H200")
    assert "does not speed up" in sentence


def test_step_times_that_cannot_be_told_apart_do_not_speed_up():
    e2e, noise = _wide(3.1180, fp8_ms=139.0)  # within 3% of bf16's 140.7 ms
    [row] = fp8.verdict_rows("GPT 2 x 4096", e2e, noise)
    assert row["step_time"].startswith("cannot be told apart") and not row["speeds_up"]


def test_a_yardstick_too_wide_for_the_target_says_so_in_the_row():
    e2e, noise = _wide(3.1180, other=3.1180 * 1.015)  # twice 1.5% is beyond the 2% target
    [row] = fp8.verdict_rows("GPT 2 x 4096", e2e, noise)
    assert "too wide to read the 2% target" in row["loss_reading"] and not row["speeds_up"]


def test_a_model_whose_bf16_run_failed_is_not_compared():
    e2e, noise = _wide(3.1180)
    e2e.loc[e2e["recipe"] == "bf16", "status"] = "out of memory"
    [row] = fp8.verdict_rows("GPT 2 x 4096", e2e, noise)
    assert row["step_time"].startswith("not compared") and not row["speeds_up"]
    assert fp8.verdict_sentence(pd.DataFrame(), "GPT 2 x 4096", "H200").endswith("not compared "
                                                                                 "on this run.")


def test_the_summary_is_one_row_per_finding():
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    grown = fp8.outlier_sweep(x, [1.0, 1e6], [(torch.float8_e4m3fn, "tensorwise")], row=0)
    correctness = pd.DataFrame([{"recipe": "tensorwise", "rel_err": 0.03, "ok": True}])
    e2e, noise = _wide(3.1180 * 0.997)
    verdict = pd.DataFrame(fp8.verdict_rows("GPT 2 x 4096", e2e, noise))
    reconciled = pd.DataFrame([{"model": "GPT 2 x 4096", "recipe": "tensorwise",
                                "reading": "prediction and measurement overlap"}])
    table = fp8.summary_table(grown, correctness, fp8.sweep_table([]), verdict, reconciled)
    assert list(table.columns) == ["topic", "on this run"]
    by = dict(zip(table["topic"], table["on this run"], strict=True))
    assert by["width sweep"] == "not measured here"
    assert "speeds up training" in by["GPT 2 x 4096, tensorwise"]
    assert "another seed's spread" in by["GPT 2 x 4096, tensorwise"]
    assert by["GPT 2 x 4096, tensorwise: sweep vs step"] == "prediction and measurement overlap"
    assert "every tolerance held" in by["correctness"]
