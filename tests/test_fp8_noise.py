"""Notebook 06's loss readings: float8 against bf16 asks "do two numerics learn the same?", so
the end-to-end table, the verdict and the summary read a float8 loss difference against the
bf16 baseline's other seeds (verdicts.yardstick(noise, "numerics")) whichever of that spread and
the same-seed floor is larger, give the 2% target its own verdict (within / beyond /
undecided), and never call a winner from step times whose spread is too wide."""

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


def _noise(floor: float, spread: float = 0.004) -> verdicts.NoiseFloor:
    """Same-seed runs of path 4 whose largest difference is ``floor`` of its loss, and two
    other seeds' runs, the farther ``spread`` away."""
    return verdicts.NoiseFloor((BASE, BASE * (1 + floor), BASE * (1 + floor / 2), BASE),
                               other_seed=BASE * (1 + spread / 2),
                               other_seeds=(BASE * (1 - spread / 2),), what="path 4 (bf16)")


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


def _row(e2e, recipe):
    return next(r for r in fp8.verdict_rows("GPT 12 x 768", e2e) if r["recipe"] == recipe)


def test_the_yardstick_is_the_other_seeds_even_when_the_same_seed_floor_is_wider():
    """The reference run's case: floor 0.555%, other seeds 0.229%. A -0.537% difference is
    inside twice the floor but beyond twice the seeds' spread: it must read 'lower'."""
    noise = _noise(0.00555, spread=0.00229)
    table = _e2e(-0.00537, 0.001, noise=noise).set_index("recipe")
    assert (table["yardstick"] == verdicts.SEEDS).all()
    assert table["yardstick_pct"].tolist() == pytest.approx([100 * noise.seed_spread] * 3)
    assert table.loc["tensorwise", "loss_verdict"] == "lower"
    assert table.loc["rowwise", "loss_verdict"] == "within noise"
    assert table["noise_floor_pct"].tolist() == pytest.approx([0.555] * 3)  # beside, not used


def test_the_yardstick_does_not_change_with_the_floor():
    """Two runs whose other seeds agree but whose floors differ read the same difference the
    same way: the question, not the larger number, picks the yardstick."""
    narrow = _e2e(0.006, 0.0, noise=_noise(0.0001, spread=0.004)).set_index("recipe")
    wide = _e2e(0.006, 0.0, noise=_noise(0.009, spread=0.004)).set_index("recipe")
    for col in ("yardstick", "yardstick_pct", "loss_verdict", "target"):
        assert narrow.loc["tensorwise", col] == wide.loc["tensorwise", col]
    assert narrow.loc["tensorwise", "loss_verdict"] == "within noise"  # 0.6% < 2 x 0.4%


def test_a_difference_inside_the_other_seeds_spread_is_never_beyond_it():
    noise = _noise(0.0, spread=0.01)  # a CPU: same-seed runs repeat exactly
    table = _e2e(0.0049, -0.0199, noise=noise).set_index("recipe")
    assert set(table.loc[["tensorwise", "rowwise"], "loss_verdict"]) == {"within noise"}


@pytest.mark.parametrize(("diff", "spread", "target"), [
    (0.003, 0.004, "within"),      # 0.3% < 2% - 2 x 0.4%
    (-0.043, 0.004, "beyond"),     # 4.3% > 2% + 2 x 0.4%
    (0.015, 0.004, "undecided"),   # between 1.2% and 2.8%
    (0.001, 0.012, "undecided")])  # the yardstick straddles the target: a re-run could cross
def test_the_target_has_its_own_verdict_read_against_the_yardstick(diff, spread, target):
    row = _row(_e2e(diff, 0.0, noise=_noise(0.0, spread=spread)), "tensorwise")
    assert row["target"] == target
    assert row["speeds_up"] == (target == "within")  # 40 ms against 50: faster


def test_faster_with_an_undecided_target_does_not_speed_up():
    """The wide model on the H200: 1.40x faster, -4.3% loss against other seeds 4.7% apart."""
    near = verdicts.NoiseFloor((2.9593, 2.9593 * (1 + 1e-6)), other_seed=3.0973,
                               other_seeds=(2.9,), what="wide")
    rows = fp8.verdict_rows("wide", _e2e(-0.0427, 0.0, noise=near, tw_ms=36.0))
    row = next(r for r in rows if r["recipe"] == "tensorwise")
    assert row["faster"] and row["target"] == "undecided" and not row["speeds_up"]
    assert row["loss_verdict"] == "within noise" and row["yardstick"] == verdicts.SEEDS


def test_without_other_seeds_no_loss_is_called_within_or_beyond_noise():
    same_only = verdicts.NoiseFloor((BASE, BASE * 1.004))
    for noise in (None, same_only):
        row = _row(_e2e(0.001, 0.05, noise=noise), "rowwise")
        assert row["loss_verdict"] == "not measured" and row["yardstick"] == verdicts.SEEDS


def test_a_timing_whose_spread_is_too_wide_is_not_called_faster():
    e2e = _e2e(0.001, 0.001, noise=_noise(0.004), tw_ms=30.0, tw_spread=0.4, rw_ms=50.0)
    row = _row(e2e, "tensorwise")
    assert row["step_label"] == "tie" and "spread" in row["step_why"]
    assert not row["faster"] and not row["speeds_up"]


def test_end_to_end_table_has_the_speedup_and_loss_difference():
    table = _e2e(0.01, 0.0).set_index("recipe")
    assert table.loc["tensorwise", "speedup_vs_bf16"] == pytest.approx(1.25)
    assert table.loc["tensorwise", "val_loss_diff_pct"] == pytest.approx(1.0)
    assert table.loc["bf16", "speedup_vs_bf16"] == 1.0
    missing = fp8.end_to_end_table({"bf16": _run("b", 50.0, 2.8)}, LABELS,
                                   flops_per_token=1.0, peak_tflops=1.0).set_index("recipe")
    assert missing.loc["rowwise", "status"] == "not run on this machine"


def test_a_model_whose_bf16_run_failed_is_not_compared():
    e2e = _e2e(0.0, 0.0, noise=_noise(0.004))
    e2e.loc[e2e["recipe"] == "bf16", "status"] = "out of memory"
    rows = fp8.verdict_rows("m", e2e)
    assert all(r["step_label"].startswith("not compared") and not r["speeds_up"] for r in rows)


# ------------------------------------------------------------------ a step's memory
def test_a_steps_memory_parts_are_counted_and_add_up():
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 32)

    def update():
        optimizer.step()
        optimizer.zero_grad()

    model(x).sum().backward()
    update()  # the optimizer's states exist, as after training
    parts = fp8.step_memory(lambda: model(x).sum(), update, model, optimizer, "cpu")
    gib = 2.0**30
    n = sum(p.numel() for p in model.parameters())
    assert parts["parameters"] == pytest.approx(4 * n / gib)
    assert parts["gradients"] == pytest.approx(4 * n / gib)
    assert parts["optimizer states"] >= 2 * parts["parameters"]  # exp_avg, exp_avg_sq
    assert parts["saved for backward"] > 0 and math.isnan(parts["peak"])  # no allocator here
    fake = {**parts, "other allocated before the step": 0.1, "peak": 1.0, "reserved": 0.2}
    fake["residual (peak minus the rows above)"] = 1.0 - sum(
        v for k, v in fake.items() if k in fp8.STEP_MEMORY[:5])
    table = fp8.memory_table({("m", "bf16"): fake, ("m", "tensorwise"): {**fake, "peak": 0.9,
                              "residual (peak minus the rows above)":
                              fake["residual (peak minus the rows above)"] - 0.1}})
    by = table.set_index("part")
    assert by.loc["sum of the parts", "bf16"] == pytest.approx(by.loc["peak of the step "
                                                                      "(measured)", "bf16"])
    assert by.loc["sum of the parts", "tensorwise - bf16"] == pytest.approx(-0.1)
