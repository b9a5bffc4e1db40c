"""Notebook 08's chapter module (helpers.chapters.last_mile) and what its smoke run answers."""

import dataclasses
import math

import pandas as pd
import pytest
import torch

from helpers import bench, gpt, verdicts
from helpers.chapters import last_mile

CPU = torch.device("cpu")


def test_a_lever_stays_only_when_faster_and_learning_the_same():
    answers = verdicts.Answers("08")
    noise = verdicts.NoiseFloor((2.0, 2.0), 2.02)  # other seeds 1% apart: the loss margin is 2%
    faster = answers.rounds("a?", "lever", "best", [9.0, 9.1, 8.9], [10.0, 10.0, 10.0])
    as_fast = answers.rounds("b?", "lever", "best", [10.0, 10.1, 9.9], [10.0, 10.0, 10.0])
    same = answers.loss("c?", "lever", "best", 2.01, 2.0, noise)
    higher = answers.loss("d?", "lever", "best", 2.2, 2.0, noise)
    assert last_mile.kept(faster, same)
    assert not last_mile.kept(faster, higher)
    assert not last_mile.kept(as_fast, same)


def test_rounds_are_read_per_the_same_number_of_sequences(monkeypatch):
    timed = {"batch 64": [bench.Timing("batch 64", [10.0], "cpu")] * 3,
             "batch 32": [bench.Timing("batch 32", [6.0], "cpu")] * 3}
    monkeypatch.setattr(bench, "interleaved", lambda fns, **how: timed)
    rounds = last_mile.step_rounds(dict.fromkeys(timed), {"batch 64": 64, "batch 32": 32},
                                   per=32, rounds=3, repeats=1, device=CPU)
    assert rounds == {"batch 64": [5.0] * 3, "batch 32": [6.0] * 3}


def test_the_chain_reads_each_gain_from_its_answer_and_the_total_per_batch():
    def rec(name, ms, sequences):
        return {"setup": name, "step_ms": ms, "sequences": sequences}

    table = last_mile.chain_table([(rec("path 4", 50.0, 32), None),
                                   (rec("heads", 45.0, 32), {"ratio": 0.9}),
                                   (rec("batch 64", 88.0, 64), {"ratio": 0.98})], per=32)
    assert table["ms_per_batch"].tolist() == [50.0, 45.0, 44.0]
    assert math.isnan(table["gain_x"][0]) and table["gain_x"][1] == pytest.approx(1 / 0.9)
    assert table["total_x"].tolist() == pytest.approx([1.0, 50 / 45, 50 / 44])


def test_the_width_table_counts_mfu_and_keeps_a_failed_width_with_its_reason():
    cfg = gpt.GPTConfig(n_layer=2, d_model=64, n_head=2, seq_len=32)
    ok = bench.Run("2 x 64", "cpu", losses=[1.0] * 4, step_ms=[10.0] * 4, warmup=1,
                   extra={"tokens_per_step": 128})
    failed = bench.Run("2 x 128", "cpu", error="out of GPU memory")
    table = last_mile.width_table({"2 x 64": ok, "2 x 128": failed},
                                  {"2 x 64": cfg, "2 x 128": dataclasses.replace(cfg, d_model=128)},
                                  peak_tflops=1.0)
    assert table.loc[0, "mfu"] == pytest.approx(gpt.flops_per_token(cfg) * 128 / 0.010 / 1e12)
    assert table.loc[1, "status"] == "FAILED: out of GPU memory"
    assert math.isnan(table.loc[1, "mfu"])


def test_flash_attention_is_offered_only_where_its_package_imports(monkeypatch):
    if not hasattr(torch.nn.attention, "activate_flash_attention_impl"):
        pytest.skip("this torch cannot switch SDPA's flash kernel")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(last_mile, "_importable", lambda module: False)
    impls, lack = last_mile.flash_impls()
    assert impls == [] and "pip install flash-attn-4" in lack
    monkeypatch.setattr(last_mile, "_importable", lambda m: m == last_mile.FLASH_MODULES["FA4"])
    assert last_mile.flash_impls() == (["FA4"], "")


@pytest.mark.parametrize(("gap", "idle"), [(-0.16, 0.0), (1.5, 1.5)])
def test_the_idle_gpu_is_never_below_zero(gap, idle):  # kernels traced past the untraced step
    row = pd.Series({"label": "path 4", "step_ms": 50.0})
    breakdown = pd.DataFrame({"gap_ms": [gap], "optimizer_ms": [2.0]})
    rec = last_mile.record(row, breakdown, pd.DataFrame(), sequences=32)
    assert rec["idle_ms"] == idle and last_mile.bounds(rec)["idle"] == idle / 50.0
    assert math.isnan(last_mile.record(row, pd.DataFrame(), pd.DataFrame(), 32)["idle_ms"])


@pytest.mark.notebook
@pytest.mark.smoke("08")
def test_08_answers_every_lever_and_keeps_exactly_the_faster_and_same(smoke_run):
    out, runs = smoke_run
    runs["08_last_mile_mfu.ipynb"]  # skips, saying so, where the run left 08 out
    answers = pd.read_csv(out / "results" / "08_answers.csv")
    assert verdicts.check_answers(answers) == []
    assert len(answers) == 14 and answers["question"].is_unique
    # the CPU runs every lever that needs no GPU: the heads, the fused loss, the batch
    cpu = answers["question"].str.contains("wider heads|cross-entropy|twice the batch")
    assert (answers.loc[cpu, "verdict"] != "not measured").all() and cpu.sum() == 6
    levers = answers[answers["question"].str.contains("the best so far|as many tokens")]
    both = levers.groupby("candidate", sort=False)["verdict"].agg(set)
    chain = pd.read_csv(out / "results" / "08_chain.csv")
    assert chain["setup"].tolist()[1:] == [c for c, v in both.items() if v == {"faster", "same"}]
    width = pd.read_csv(out / "results" / "08_width.csv")
    assert width["d_model"].tolist() == [32, 64] and (width["mfu"] > 0).all()
