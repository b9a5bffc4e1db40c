"""Notebook 07's noise floor, on made-up runs: the wrappers' loss differences read against
plain's same-seed repeats ('within noise' below 2x the floor, 'beyond noise by Nx' above it, a
floor of 0 said so), the repeats kept apart from the wrappers, the spread-aware timing
sentences."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from helpers import bench, results, verdicts
from helpers.chapters import scaling


def run(variant: str, losses: list[float], seed: int = 0, step_ms: list[float] | None = None
        ) -> bench.Run:
    wrapper = scaling.wrapper_of(variant)
    return bench.Run(variant, "cuda", losses=losses, step_ms=step_ms or [60.0] * len(losses),
                     warmup=1, extra={"variant": variant, "wrapper": wrapper, "seed": seed,
                                      "world_size": 1, "grad_norms": [1.0] * len(losses)})


def gpu_like(ddp_final: float, fsdp2_final: float = 3.0) -> dict[str, bench.Run]:
    """plain ends at 3.000, its repeats at 3.001 and 2.999 (floor 0.002 / 3 = 0.067%)."""
    head = [5.0] * 9
    return {"plain": run("plain", head + [3.000]),
            "ddp": run("ddp", head + [ddp_final]),
            "fsdp2": run("fsdp2", head + [fsdp2_final]),
            "plain (repeat 1)": run("plain (repeat 1)", head + [3.001]),
            "plain (repeat 2)": run("plain (repeat 2)", head + [2.999]),
            "plain (seed 1)": run("plain (seed 1)", [5.1] * 9 + [3.05], seed=1)}


def test_the_names_of_the_extra_runs_and_their_seeds():
    assert scaling.noise_variants(3, 0, other_seed=1) == {
        "plain (repeat 1)": 0, "plain (repeat 2)": 0, "plain (repeat 3)": 0, "plain (seed 1)": 1}
    assert scaling.noise_variants(1, 5) == {"plain (repeat 1)": 5}
    with pytest.raises(ValueError, match="at least 1 repeat"):
        scaling.noise_variants(0, 0)
    with pytest.raises(ValueError, match="is the baseline's own"):
        scaling.noise_variants(1, 0, other_seed=0)
    for name in ("plain", "plain (repeat 2)", "plain (seed 1)"):
        assert scaling.wrapper_of(name) == "plain"
    assert scaling.wrapper_of("ddp (2 ranks)") == "ddp"


def test_the_floor_is_the_largest_same_seed_difference_and_leaves_the_other_seed_out():
    floor, per_step = scaling.noise_floor(gpu_like(3.0))
    assert floor.same_seed == (3.0, 3.001, 2.999)
    assert floor.floor == pytest.approx(0.002 / 3.0)
    assert floor.other_seed == 3.05 and floor.seed_spread == pytest.approx(0.05 / 3.0)
    assert per_step == pytest.approx(0.002)


def test_a_ddp_difference_below_the_floor_reads_within_noise_and_above_twice_it_beyond():
    table, floor, _ = scaling.noise_table(gpu_like(ddp_final=3.001, fsdp2_final=3.006))
    rows = table.set_index("run")
    assert list(table["run"]) == ["plain", "ddp", "fsdp2", "plain (repeat 1)",
                                  "plain (repeat 2)", "plain (seed 1)"]
    assert rows.loc["plain", "reading"] == "baseline"
    assert rows.loc["ddp", "reading"] == "within noise"  # 0.001 / 3 against a floor of 0.002 / 3
    assert rows.loc["ddp", "step_reading"] == "within noise"
    assert rows.loc["fsdp2", "reading"] == "beyond noise by 3.0x the floor"  # 0.006 vs 2 x 0.002
    assert rows.loc["fsdp2", "step_reading"] == "beyond noise by 3.0x the floor"
    assert bool(rows.loc["fsdp2", "within_target"])  # beyond noise, yet inside the 2% target
    assert rows.loc["ddp", "max_step_diff"] == pytest.approx(0.001)
    sentence = scaling.noise_sentence(table[table["run"] == "fsdp2"].iloc[0])
    assert sentence.startswith("fsdp2 vs plain: final loss +0.200% - beyond noise by 3.0x")
    assert "(floor 0.067%)" in sentence and sentence.endswith("within the 2% target")
    far = scaling.noise_table(gpu_like(ddp_final=3.1))[0].set_index("run").loc["ddp"]
    assert far["reading"].startswith("beyond noise") and not far["within_target"]


def test_a_floor_of_zero_says_the_machine_repeats_runs_exactly():
    runs = gpu_like(3.0)
    runs["plain (repeat 1)"] = run("plain (repeat 1)", runs["plain"].losses)
    runs["plain (repeat 2)"] = run("plain (repeat 2)", runs["plain"].losses)
    runs["ddp"] = run("ddp", [5.0] * 9 + [3.0000001])
    table, floor, per_step = scaling.noise_table(runs)
    assert floor.floor == 0 and per_step == 0
    rows = table.set_index("run")
    assert rows.loc["fsdp2", "reading"] == "within noise"  # identical to plain
    assert rows.loc["ddp", "reading"] == verdicts.noise_reading(1e-7, 0.0)
    assert "repeats runs exactly: the floor is 0" in rows.loc["ddp", "reading"]
    sentence = scaling.noise_sentence(table[table["run"] == "ddp"].iloc[0])
    assert "final loss +3.3e-06%" in sentence and "(floor" not in sentence
    assert all(math.isfinite(v) for v in table["diff_pct"])


def test_losses_record_is_json_with_every_run_and_the_floor():
    runs = gpu_like(3.0)
    floor, per_step = scaling.noise_floor(runs)
    path = results.save_json("07_losses", {"one_gpu": scaling.losses_record(runs, floor,
                                                                           per_step)})
    saved = json.loads(path.read_text())["one_gpu"]
    assert set(saved["runs"]) == set(runs)
    assert saved["runs"]["plain (seed 1)"]["seed"] == 1
    ddp = saved["runs"]["ddp"]
    assert ddp["losses"][-1] == 3.0 and len(ddp["grad_norms"]) == 10
    assert saved["noise_floor"]["same_seed"] == [3.0, 3.001, 2.999]
    assert saved["noise_floor"]["floor"] == pytest.approx(0.002 / 3.0)


def timing_table(ddp_ms: list[float]) -> tuple[pd.DataFrame, dict[str, bench.Run]]:
    runs = {"plain": run("plain", [3.0] * 12, step_ms=[60.0] * 12),
            "ddp": run("ddp", [3.0] * 12, step_ms=ddp_ms)}
    return scaling.runs_table(list(runs.values())), runs


def test_a_wrapper_whose_spread_is_too_wide_cannot_be_told_apart():
    wide = [60.0, 40.0, 40.0, 40.0, 90.0, 40.0, 90.0, 40.0, 90.0, 90.0, 90.0, 90.0]
    table, runs = timing_table(wide)
    said = verdicts.compare_rows(table, "ddp", "plain", key="variant")
    assert "cannot be told apart on this run (a spread of" in said
    assert scaling.overhead_phrase(table, "ddp").startswith(
        "ddp cannot be told apart from plain on this run (a spread of")
    spread = scaling.spread_sentence(runs["ddp"], 60.0)
    assert "over the 25% limit" in spread and "cannot be told apart from plain's" in spread


def test_a_tight_wrapper_gets_its_percentage_and_the_tie_rule():
    table, runs = timing_table([60.0] + [72.0] * 11)
    assert scaling.overhead_phrase(table, "ddp") == "ddp +20.0%"
    assert "1.20x slower" in verdicts.compare_rows(table, "ddp", "plain", key="variant")
    assert scaling.spread_sentence(runs["ddp"], 60.0) == ""
    table, _ = timing_table([60.0] + [61.0] * 11)
    assert scaling.overhead_phrase(table, "ddp") == "ddp +1.7% (a tie: within 3%)"
    middling = [60.0] + [62.0, 70.0] * 5 + [66.0]  # an IQR of about 12% of the median
    _, runs = timing_table(middling)
    said = scaling.spread_sentence(runs["ddp"], 60.0)
    assert said.startswith("ddp's step times spread widely on this run") and said.endswith(".")


# ------------------------------------------------------------------ the rounds, read once
# The H200 run of 2026-12-02: fsdp2 settled by the stop rule (its last 3 rounds within 2.5
# points) with an IQR of +5.8% to +15.2% over the rounds - unstable, not "settled".
H200_ROUNDS = {"plain": [62.137, 61.949, 62.107, 62.212, 62.549, 62.697],
               "ddp": [63.183, 63.297, 63.271, 63.233, 63.424, 64.136],
               "fsdp2": [66.259, 73.140, 73.447, 64.845, 65.989, 66.935]}


def test_a_settled_cost_with_a_wide_iqr_reads_unstable_with_its_drift():
    table = scaling.rounds_table(H200_ROUNDS).set_index("variant")
    assert table["settled"].all()  # the stop rule was met ...
    assert not table.loc["fsdp2", "stable"] and table.loc["ddp", "stable"]  # ... fsdp2 unstable
    said = scaling.rounds_by_variant(table.reset_index())
    assert "settled" not in said["fsdp2"] and "unstable on this run" in said["fsdp2"]
    assert "IQR +5.8% to +15.2%" in said["fsdp2"] and "ranged +4.2% to +18.3%" in said["fsdp2"]
    assert "its step time +1.0% and plain's +0.9%" in said["fsdp2"]
    assert said["fsdp2"].endswith("above plain's step by more than 3% in every round")
    assert said["ddp"].startswith("ddp: +1.8% over 6 interleaved rounds (IQR +1.7% to +2.1%)")
    assert said["ddp"].endswith("a tie with plain: its IQR inside the tie rule's 3%")
    assert scaling.rounds_by_variant(None) == {}


def test_a_stable_cost_beyond_the_tie_reads_slower():
    rounds = {"plain": [60.0] * 4, "fsdp2": [66.0, 66.3, 66.1, 66.2]}
    said = scaling.rounds_sentence(scaling.rounds_table(rounds).iloc[0])
    assert ", stable:" in said and said.endswith("slower than plain beyond the tie rule's 3%")


# ------------------------------------------------------------------ what DDP allocates
STAGES = ["model built", "wrapped", "step 0: after forward", "step 0: after backward",
          "step 0: after the update", "step 1: after forward", "step 1: after backward",
          "step 1: after the update"]


def ddp_table(ddp, grads, view, rebuilt) -> pd.DataFrame:
    return pd.DataFrame({"stage": STAGES, "ddp_allocated_vs_plain_gib": ddp,
                         "ddp_grads_vs_plain_gib": grads,
                         "ddp+view_allocated_vs_plain_gib": view, "ddp_rebuilt": rebuilt})


def test_ddp_memory_beyond_the_buckets_is_located_or_said_unexplained():
    rebuilt = [False] * 5 + [True] * 3
    # as on the H200: 0.32 GiB at wrapping, 0.32 more from step 1, not in the .grad tensors
    h200 = ddp_table([0, .321, .321, .322, .323, .645, .646, .646], [0] * 8,
                     [.009, .329, .329, .004, .004, .327, .327, .327], rebuilt)
    said = scaling.ddp_memory_sentence(h200, 0.32)
    assert said.startswith("wrapping in DDP allocated 0.32 GiB more than plain (its buckets on "
                           "paper: 0.32 GiB); from 'step 1: after forward', the first stage "
                           "after DDP rebuilt its buckets, 0.32 GiB more stayed allocated"), said
    assert "outside the .grad tensors' storage" in said and "not explained" in said
    assert said.endswith("with gradient_as_bucket_view=True +0.33 GiB against plain there")
    in_grads = ddp_table([0, .32, .32, .64, .64, .64, .64, .64], [0, 0, 0, .32, .32, 0, .32, .32],
                         [0] * 8, [False] * 8)
    said = scaling.ddp_memory_sentence(in_grads, 0.32)
    assert "from 'step 0: after backward' 0.32 GiB more stayed allocated, in the .grad" in said
    assert "rebuilt" not in said
    flat = ddp_table([0, .32, .32, .32, .32, .32, .32, .32], [0] * 8, [0] * 8, rebuilt)
    assert scaling.ddp_memory_sentence(flat, 0.32).endswith("nothing more at any later stage")


# ------------------------------------------------------------------ what Dynamo compiled
def test_dynamo_counts_see_a_compile_a_cache_hit_a_reset_and_a_recompile():
    import torch

    def f(x):
        return torch.sin(x) * 2

    g = torch.compile(f, backend="eager", dynamic=False)
    torch._dynamo.reset()
    before = scaling.dynamo_counts()
    g(torch.ones(3))
    assert scaling.counts_since(before)["graphs"] == 1
    before = scaling.dynamo_counts()
    g(torch.ones(3))  # the cached graph: nothing new
    assert scaling.counts_since(before) == dict.fromkeys(before, 0)
    torch._dynamo.reset()  # what the script does before a compiled variant: it compiles again
    before = scaling.dynamo_counts()
    g(torch.ones(3))
    g(torch.ones(4))  # another shape: a guard fails, a recompile
    got = scaling.counts_since(before)
    assert got["graphs"] == 2 and got["recompiles"] == 1 and got["limit_hits"] == 0
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=1, automatic_dynamic_shapes=False):
        before = scaling.dynamo_counts()
        for n in (5, 6):
            g(torch.ones(n))
        assert scaling.counts_since(before)["limit_hits"] == 1  # the second shape ran eagerly
    torch._dynamo.reset()
    row = {"variant": "fsdp2+compile", "graphs": 1, "frames": 2, "graph_breaks": 0,
           "recompiles": 1, "limit_hits": 1, "first_step_s": 0.1}
    said = scaling.compile_sentence(row)
    assert said == ("fsdp2+compile: 1 graph(s) compiled from 2 frame(s), 0 graph break(s), "
                    "1 recompile(s), gave up 1 time(s) at its recompile limit (those calls ran "
                    "eagerly); first step 0.1 s")
    assert "gave up" not in scaling.compile_sentence(dict(row, limit_hits=float("nan")))
