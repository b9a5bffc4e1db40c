"""Notebook 05's chapter module: the memory it measures (score matrix, saved activations), the
time breakdown and its chart, and the readings - verdict, targets, MFU limits, summary - built
from the run's numbers, with the path roles and the targets the notebook passes in."""

import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest
import torch

from helpers import bench, gpt, kernels, verdicts
from helpers.chapters import end_to_end

CPU = torch.device("cpu")
NOTEBOOK = Path(__file__).resolve().parents[1] / "notebooks" / "05_end_to_end_transformer.ipynb"
ROLES = end_to_end.Roles(baseline="1", apex="2", native="3", compiled="4",
                         baseline_name="the FP32 baseline")
GOALS = end_to_end.Targets(mfu=0.45, speedup=5.0, slower=0.10, val_loss=verdicts.LOSS_TOLERANCE)


# ------------------------------------------------------------------ memory
def test_score_matrix_size():
    # 32 x 12 x 1024 x 1024 float32 values: 1.61 GB per layer at GPT-2 small's shape
    assert end_to_end.score_matrix_bytes(gpt.GPT2_SMALL, 32) == 1_610_612_736
    tiny = gpt.GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16)
    assert end_to_end.score_matrix_bytes(tiny, 3, bytes_per_element=2) == 3 * 4 * 16 * 16 * 2


def test_saved_bytes_counts_what_autograd_keeps():
    x = torch.randn(8, 16, requires_grad=True)
    # x * x saves x twice (one tensor: counted once); exp saves its output
    assert end_to_end.saved_bytes(lambda: (x * x).exp()) == 2 * 8 * 16 * 4
    with torch.no_grad():
        assert end_to_end.saved_bytes(lambda: (x * x).exp()) == 0
    linear = torch.nn.Linear(16, 4)
    assert end_to_end.saved_bytes(lambda: linear(x)) == 8 * 16 * 4  # the input; not the weight
    norm = torch.nn.LayerNorm(16)
    # the FP32 input, plus mean and 1/std per row
    assert end_to_end.saved_bytes(lambda: norm(x)) == 8 * 16 * 4 + 2 * 8 * 4


# ------------------------------------------------------------------ where the time goes
def _profiled_cpu_run() -> bench.Run:
    """Four steps of a tiny GPT on the CPU, then one untraced and two traced by the profiler."""
    data = gpt.load_corpus(cap_mb=0.5)
    cfg = gpt.GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=32)
    torch.manual_seed(0)
    model = gpt.GPT(cfg)
    plan = gpt.BatchPlan.draw(data.train, steps=7, batch=4, seq_len=cfg.seq_len, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)

    def step(i):
        loss = model(*plan.batch(i))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # foreach norm: "optimizer"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    run = bench.train(step, 4, device=CPU, warmup=2, label="cpu")
    more = iter(range(4, 7))  # profile_steps runs one untraced step first
    run.extra["breakdown"] = kernels.profile_steps(lambda: step(next(more)), 2, CPU)
    return run


def test_profiler_breakdown_fits_in_the_traced_step():
    run = _profiled_cpu_run()
    b = run.extra["breakdown"]
    # operator self times are measured by the profiler, the traced step by the wall clock: the
    # self times of operators that run one after another cannot add up to more than the step
    assert 0 < b["kernel_ms"] <= b["traced_step_ms"] * 1.05
    assert b["matmul_ms"] > 0 and b["optimizer_ms"] > 0
    failed = bench.Run("P2", "cpu", error="out of GPU memory (...)")
    table = end_to_end.breakdown_table({"1": run, "2": failed})  # a failed path has no row
    assert list(table["path"]) == ["1"] and table["gap_ms"].notna().all()
    assert table.loc[0, "step_reference"] == "traced"
    assert table.loc[0, "step_ms"] == b["traced_step_ms"]  # on the CPU: the traced step
    ax = end_to_end.breakdown_chart(table)
    assert len(ax.patches) == len(kernels.NAMES) + 1  # one bar segment per category + the gap
    assert sum(p.get_height() for p in ax.patches) == pytest.approx(100)  # shares of the step


def _breakdown_row(path: str, gap_ms: float, **ms: float) -> dict:
    row = {f"{k}_ms": 1.0 for k in kernels.NAMES} | {f"{k}_ms": v for k, v in ms.items()}
    kernel_ms = sum(row[f"{k}_ms"] for k in kernels.NAMES)
    return {"path": path, **row, "kernel_ms": kernel_ms, "gap_ms": gap_ms,
            "step_ms": kernel_ms + gap_ms, "kernels_per_step": 100.0, "device": "cuda"}


# ------------------------------------------------------------------ the readings
def _fake_table(step_2: float, step_3: float, keys=("1", "2", "3")) -> pd.DataFrame:
    rows = [(keys[0], "FP32", 300.0), (keys[1], "Apex", step_2), (keys[2], "Native", step_3)]
    table = pd.DataFrame([{"path": p, "label": lab, "status": "ran", "step_ms": ms,
                           "mfu": 0.1, "speedup_vs_fp32": 300.0 / ms} for p, lab, ms in rows])
    return table


def test_the_readings_take_the_paths_from_the_roles_they_are_given():
    table = _fake_table(30.0, 40.0, keys=("fp32", "apex", "native"))
    table["peak_mem_gib"] = [19.7, 10.8, 12.0]
    table["tokens_per_s"], table["final_val_loss"] = 1000.0, 2.0
    roles = end_to_end.Roles(baseline="fp32", apex="apex", native="native", compiled="compiled",
                             baseline_name="the reference")
    goals = end_to_end.targets(table, GOALS, roles, applies=True).set_index("target")
    speedup = goals.loc["path apex's speed-up over path fp32, at least"]
    assert speedup[["threshold", "measured", "reading"]].tolist() == [5.0, 10.0, "met"]
    assert goals.loc["path apex's step time over path native's, at most", "reading"] == "met"
    # the notebook's keys are not this table's: nothing measured for the Apex targets
    other = end_to_end.targets(table, GOALS, ROLES, applies=True)
    assert other["reading"][1:3].tolist() == ["not measured here"] * 2
    table = pd.concat([table, pd.DataFrame([{
        "path": "compiled", "label": "Compiled", "status": "ran", "step_ms": 40.2, "mfu": 0.1,
        "tokens_per_s": 1000.0, "final_val_loss": 2.0, "compile_s": 20.0}])], ignore_index=True)
    closing = end_to_end.summary_table(table, roles).set_index("path")
    assert closing.loc["apex", ["step_ms", "speedup", "vs_baseline"]].tolist() == [
        30.0, 10.0, "faster 10.00x"]
    assert closing.loc["fp32", "vs_baseline"] == "baseline"


def test_the_summary_table_reads_each_path_by_the_tie_rule():
    table = _fake_table(50.0, 40.0)
    table["tokens_per_s"], table["final_val_loss"] = 1000.0, [2.0, 2.02, 2.01]
    table = pd.concat([table, pd.DataFrame([{
        "path": "4", "label": "Compiled", "status": "ran", "step_ms": 30.0, "mfu": 0.2,
        "speedup_vs_fp32": 10.0, "tokens_per_s": 1000.0, "final_val_loss": 2.0,
        "compile_s": 20.0}])], ignore_index=True)
    closing = end_to_end.summary_table(table, ROLES)
    assert list(closing["path"]) == ["1", "2", "3", "4"]
    row = closing.set_index("path").loc["2"]
    assert row[["step_ms", "tokens_per_s", "mfu", "speedup", "vs_baseline",
                "final_val_loss"]].tolist() == [50.0, 1000.0, 0.1, 6.0, "faster 6.00x", 2.02]
    table.loc[2, "step_ms"] = 300.5  # path 3 level with path 1: no ratio, a tie
    row = end_to_end.summary_table(table, ROLES).set_index("path").loc["3"]
    assert row["vs_baseline"] == "tie" and pd.isna(row["speedup"])
    table.loc[0, "status"] = "Path 1 skipped: ..."
    table["speedup_vs_fp32"] = float("nan")
    closing = end_to_end.summary_table(table, ROLES)
    assert set(closing["vs_baseline"]) == {"no baseline"} and closing["speedup"].isna().all()
    table["status"] = "skipped"
    assert end_to_end.summary_table(table, ROLES).empty


def _targets_table() -> pd.DataFrame:
    table = pd.DataFrame([
        {"path": "1", "status": "ran", "mfu": 0.05, "step_ms": 500.0, "final_val_loss": 2.00},
        {"path": "2", "status": "ran", "mfu": 0.40, "step_ms": 90.0, "final_val_loss": 2.03},
        {"path": "3", "status": "ran", "mfu": 0.46, "step_ms": 80.0, "final_val_loss": 2.01},
    ])
    table["speedup_vs_fp32"] = 500.0 / table["step_ms"]
    return table


def _readings(goals: pd.DataFrame) -> list[tuple]:
    return [(round(m, 4), r) for m, r in goals[["measured", "reading"]].values]


def test_targets_mark_each_goal_from_the_numbers():
    table = _targets_table()
    goals = end_to_end.targets(table, GOALS, ROLES, applies=True)
    assert goals["threshold"].tolist() == [0.45, 5.0, 1.1, 0.02]
    assert _readings(goals) == [(0.46, "met"), (5.5556, "met"), (1.125, "MISSED"),
                                (0.015, "met")]
    table.loc[1, "final_val_loss"] = 2.10
    assert _readings(end_to_end.targets(table, GOALS, ROLES, applies=True))[3] == (0.05,
                                                                                  "MISSED")
    skipped = end_to_end.targets(table, GOALS, ROLES, applies=False)
    assert (skipped["reading"] == "not evaluated").all()
    assert skipped["measured"].iloc[1] == pytest.approx(500 / 90)  # the numbers are still there
    table.loc[1, "step_ms"] = 60.0  # faster than path 3 by any margin still meets it
    assert _readings(end_to_end.targets(table, GOALS, ROLES, applies=True))[2] == (0.75, "met")


def test_targets_read_the_loss_spread_against_the_other_seeds():
    """Two numerics' loss spread is read against other seeds, never the same-seed floor: the
    target is met, MISSED, or undecided when it lies within 2x the seeds' spread of its edge."""
    table = _targets_table()  # a spread of 1.5%
    # a 0.01% same-seed floor and seeds 1% apart: 1.5% is within noise, and the 2% target's
    # edge is within 2x 1% of it, so a re-run could land on either side
    wide = verdicts.NoiseFloor((2.0, 2.0002), other_seed=2.02)
    goals = end_to_end.targets(table, GOALS, ROLES, applies=True, noise=wide)
    assert goals["reading"][3] == "undecided"
    assert goals["measured"][3] == pytest.approx(0.015)
    assert goals["yardstick"][3] == pytest.approx(0.01)
    assert goals["yardstick"][:3].isna().all()  # only the loss target has a yardstick
    narrow = verdicts.NoiseFloor((2.0, 2.0), other_seed=2.002)  # seeds 0.1% apart
    goals = end_to_end.targets(table, GOALS, ROLES, applies=True, noise=narrow)
    assert goals["reading"][3] == "met" and goals["yardstick"][3] == pytest.approx(0.001)
    table.loc[1, "final_val_loss"] = 2.10  # 5%: beyond the target by more than 2x 0.1%
    goals = end_to_end.targets(table, GOALS, ROLES, applies=True, noise=narrow)
    assert goals["reading"][3] == "MISSED"
    table.loc[1, "status"] = "skipped"
    goals = end_to_end.targets(table, GOALS, ROLES, applies=True)
    assert goals["reading"][1:3].tolist() == ["not measured here"] * 2


def test_the_yardsticks_table_names_each_question_s_spread():
    noise = verdicts.NoiseFloor((2.0, 2.001, 2.002), other_seed=2.02, other_seeds=(1.99,))
    table = end_to_end.yardsticks_table(noise).set_index("question")
    assert table.loc["repeat", "yardstick"] == verdicts.REPEAT
    assert table.loc["numerics", "yardstick"] == verdicts.SEEDS
    assert table["runs"].tolist() == [3, 3]  # three same-seed runs; the baseline + 2 seeds
    assert table.loc["repeat", "spread_pct"] == pytest.approx(0.1)
    assert table.loc["numerics", "spread_pct"] == pytest.approx(1.5)
    assert table.loc["numerics", "beyond_at_pct"] == pytest.approx(3.0)


# ------------------------------------------------------------------ the norm a step pays for
GPU = {"torch": [0.30, 0.31, 0.30], "apex": [0.27, 0.28, 0.27], "apex_mixed": [0.27, 0.27, 0.28]}
HOST = {"torch": [0.42, 0.43, 0.42], "apex": [0.76, 0.70, 0.80], "apex_mixed": [0.54, 0.55, 0.52]}


def _norm_breakdown(apex_norm_ms: float) -> pd.DataFrame:
    """Paths 2 (Apex) and 3 (torch) with 25 norm calls a step: 8 ms of torch norms."""
    return pd.DataFrame([{"path": "2", "norm_ms": apex_norm_ms}, {"path": "3", "norm_ms": 8.0}])


def test_the_norm_is_picked_by_gpu_time_and_ties_broken_by_the_host():
    """GPU time ranks first; where the rounds cannot tell two apart, host time decides."""
    choice = end_to_end.norm_choice(GPU, HOST, baseline="torch").set_index("norm")
    assert choice.loc["apex", "gpu_vs_baseline"] == "faster 1.11x"
    assert choice.loc["apex", "call_vs_baseline"].startswith("slower")
    assert choice.loc["torch", "gpu_vs_baseline"] == "baseline"
    assert (choice[["gpu_range_pct", "call_range_pct"]] >= 0).all().all()
    assert end_to_end.pick_norm(GPU, HOST, ["apex", "apex_mixed"]) == "apex_mixed"  # GPU tie
    slow_gpu = {**GPU, "apex_mixed": [0.35, 0.36, 0.35]}  # now its GPU time loses every round
    assert end_to_end.pick_norm(slow_gpu, HOST, ["apex", "apex_mixed"]) == "apex"


def test_the_step_decides_and_a_standalone_figure_that_disagrees_says_so():
    """The reference run's case: torch's norm faster per call with the host included, Apex's
    kernels faster inside the step; the table keeps both and marks the one that disagrees."""
    choice = end_to_end.norm_choice(GPU, HOST, baseline="torch")
    paths = {"torch": "3", "apex_mixed": "2"}
    table = end_to_end.norm_in_step(choice, _norm_breakdown(7.0), paths, calls=25)
    rows = table.set_index("measure")
    step = rows.loc[end_to_end.MEASURES["step"]]
    assert step["torch_ms"] == pytest.approx(8.0 / 25) and bool(step["decides"])
    assert step["apex_mixed_vs_torch"] == "faster 1.14x"
    assert table["decides"].sum() == 1
    assert rows.loc[end_to_end.MEASURES["gpu"], "agrees_with_step"] is True
    assert rows.loc[end_to_end.MEASURES["call"], "agrees_with_step"] is False  # not hidden
    tie = end_to_end.norm_in_step(choice, _norm_breakdown(7.9), paths, calls=25)
    assert tie["apex_mixed_vs_torch"].iloc[-1] == "tie"  # within 3%: no ranking in the step
    assert not tie["agrees_with_step"].iloc[:2].any()
    alone = end_to_end.norm_in_step(choice, pd.DataFrame(), paths, calls=25)
    assert len(alone) == 2 and alone["agrees_with_step"].isna().all()


def test_category_shares_read_tf32_from_the_breakdown():
    """The reference run's paths 1 and 1b: TF32 cuts the matmuls 5.3x and leaves attention,
    which becomes 42% of path 1b's step; every share is computed from the breakdown."""
    breakdown = pd.DataFrame([
        {"path": "1", "label": "FP32", "matmul_ms": 331.46, "attention_ms": 67.66,
         "step_ms": 431.65},
        {"path": "1b", "label": "TF32", "matmul_ms": 63.04, "attention_ms": 69.72,
         "step_ms": 166.17}])
    shares = end_to_end.category_shares(breakdown, ["1", "1b", "3"]).set_index("path")
    assert list(shares.index) == ["1", "1b"]  # path 3 was not profiled: left out
    assert shares.loc["1b", "matmul_x"] == pytest.approx(331.46 / 63.04)
    assert shares.loc["1b", "attention_x"] < 1.0  # TF32 did not speed attention up
    assert shares.loc["1b", "attention_pct"] == pytest.approx(100 * 69.72 / 166.17)
    assert shares.loc["1b", "rest_ms"] == pytest.approx(166.17 - 63.04 - 69.72)
    row = shares.loc["1b"]
    assert row[["matmul_pct", "attention_pct", "rest_pct"]].sum() == pytest.approx(100.0)


def test_targets_are_held_to_the_goals_they_are_given():
    stricter = end_to_end.Targets(mfu=0.50, speedup=6.0, slower=0.15, val_loss=0.01)
    goals = end_to_end.targets(_targets_table(), stricter, ROLES, applies=True)
    assert goals["threshold"].tolist() == [0.5, 6.0, 1.15, 0.01]
    assert _readings(goals) == [(0.46, "MISSED"), (5.5556, "MISSED"), (1.125, "met"),
                                (0.015, "MISSED")]


def test_mfu_limits_accounts_for_the_step_from_the_breakdown():
    cfg = gpt.GPT2_SMALL
    tokens = 32768
    fpt = gpt.flops_per_token(cfg)
    att = 6 * cfg.n_layer * cfg.d_model * cfg.seq_len
    table = pd.DataFrame([
        {"path": "3", "label": "native", "status": "ran", "step_ms": 60.0, "mfu": 0.3},
        {"path": "4", "label": "compiled", "status": "ran", "step_ms": 50.0, "mfu": 0.38},
    ])
    # matmuls take 25 ms, attention 5 ms: rates follow from the counted FLOPs
    row = {"path": "4", "step_ms": 50.0, "gap_ms": 1.0, "device": "cuda"}
    row.update({f"{k}_ms": 4.0 for k in kernels.NAMES if k not in ("matmul", "attention")})
    row.update(matmul_ms=25.0, attention_ms=5.0)
    limits = end_to_end.mfu_limits(pd.DataFrame([row]), table, cfg, tokens, 989.0, 780.0)
    parts = limits.set_index("part")
    assert list(parts.index) == ["parameter matmuls", "attention", "everything else"]
    assert set(limits["path"]) == {"4"}
    mm_rate = (fpt - att) * tokens / 25e-3 / 1e12
    assert parts.loc["parameter matmuls", "tflops"] == pytest.approx(mm_rate)
    assert parts.loc["parameter matmuls", "vs_matmul_ceiling"] == pytest.approx(mm_rate / 780)
    assert parts.loc["attention", "vs_peak"] == pytest.approx(att * tokens / 5e-3 / 1e12 / 989)
    assert parts.loc["everything else", ["ms", "share_of_step"]].tolist() == [20.0, 0.4]
    assert pd.isna(parts.loc["everything else", "tflops"])
    assert end_to_end.mfu_limits(pd.DataFrame(), table, cfg, tokens, 989.0).empty


def test_an_mfu_above_its_peak_is_never_repeated_by_the_readings():
    table = _fake_table(50.0, 40.0)
    table["mfu"] = [0.1, 1.6, 1.7]  # the CHECK line has called these impossible
    table["tokens_per_s"], table["final_val_loss"] = 1000.0, [2.0, 2.02, 2.01]
    goals = end_to_end.targets(table, GOALS, ROLES, applies=True)
    assert pd.isna(goals["measured"][0]) and goals["reading"][0] == "not measured here"
    assert end_to_end.summary_table(table, ROLES)["mfu"][1:].isna().all()  # not shown


# ------------------------------------------------------------------ notebook 05's own values
def _cell(nb, needle: str) -> str:
    return next(c.source for c in nb.cells if needle in c.source)


def test_the_05_targets_cell_holds_the_targets_its_text_names():
    """The verdict's markdown names the four targets; the cell below it passes them in."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    line = next(ln for ln in _cell(nb, "end_to_end.Targets(").splitlines()
                if "end_to_end.Targets(" in ln)
    goals = eval(line.split("=", 1)[1], {"end_to_end": end_to_end, "verdicts": verdicts})  # noqa: S307
    text = " ".join(_cell(nb, "The course sets four targets").split())
    assert f"fastest path at {goals.mfu:.0%} MFU or more" in text
    assert f"path 2 at least {goals.speedup:g}x path 1" in text
    assert f"path 2 at most {goals.slower:.0%} slower than path 3" in text
    assert f"validation losses within {goals.val_loss:.0%} of each other" in text


def test_the_05_roles_name_paths_it_labels():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    cell = _cell(nb, "end_to_end.Roles(")
    labels = eval(re.search(r"^labels = (\{.*?\})$", cell, re.M | re.S).group(1))  # noqa: S307
    call = re.search(r"^roles = (end_to_end\.Roles\(.*?\))$", cell, re.M | re.S).group(1)
    roles = eval(call, {"end_to_end": end_to_end})  # noqa: S307
    assert {roles.baseline, roles.apex, roles.native, roles.compiled} <= set(labels)
    assert labels[roles.baseline].startswith("FP32") and "Apex" in labels[roles.apex]
    assert "compile" in labels[roles.compiled] and "FP32" in roles.baseline_name


def test_the_05_noise_runs_default_follows_the_profile_and_zero_stops_in_one_sentence():
    """noise_runs and seed_runs = None: 1 same-seed repeat and 1 other seed in the smoke
    profile (a CPU repeats exactly), 2 and 2 in the full one (at least 2 other seeds); 0 stops
    at the parameter checks in one sentence, before the profile is resolved."""
    from helpers import errors, run_profile

    nb = nbformat.read(NOTEBOOK, as_version=4)
    params = next(c.source for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    checks = _cell(nb, "errors.check_parameters(").split("print(profile.describe())", 1)[0]
    for name, repeats, seeds in (("smoke", 1, 1), ("full", 2, 2)):
        space = {"errors": errors,
                 "resolve": lambda _name, n=name: run_profile.Profile(n, "cpu")}
        exec(params, space)
        assert space["noise_runs"] is None and space["seed_runs"] is None
        exec(checks, space)
        assert (space["noise_runs"], space["seed_runs"]) == (repeats, seeds), name
    space = {"errors": errors, "resolve": None}
    exec(params.replace("noise_runs = None", "noise_runs = 0"), space)
    with pytest.raises(errors.CourseError, match="^noise_runs = 0: the noise floor needs path 3"):
        exec(checks, space)
    space = {"errors": errors, "resolve": None}
    exec(params.replace("seed_runs = None", "seed_runs = 0"), space)
    with pytest.raises(errors.CourseError, match="^seed_runs = 0: reading two numerics needs"):
        exec(checks, space)
