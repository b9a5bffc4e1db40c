"""Notebook 02's chapter module: the workload, the checks and the tables, driven by factories."""

import re
from pathlib import Path

import pandas as pd
import pytest
import torch

from helpers import bench, verdicts
from helpers.chapters import optimizers as chapter

HP = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def factories(hp=HP):
    """The notebook's native candidates, as its section 3 cell builds them."""
    return {"for-loop": lambda p: torch.optim.AdamW(p, foreach=False, **hp),
            "foreach": lambda p: torch.optim.AdamW(p, foreach=True, **hp),
            "fused": lambda p: torch.optim.AdamW(p, fused=True, **hp)}


def native(device="cpu"):
    """The candidates that step on ``device`` (the notebook drops fused where it cannot)."""
    cands = factories()
    if chapter.cannot_step(cands["fused"], device):
        del cands["fused"]
    return cands


def test_no_helper_builds_an_optimizer_the_notebook_compares():
    source = Path(chapter.__file__).read_text()
    for name in ("AdamW(", "FusedAdam(", "Adam(", "SGD("):
        assert name not in source, f"{chapter.__file__} constructs {name}...): use a factory"


def test_model_size_matches_formula():
    params = list(chapter.build_model(hidden=16, blocks=3).parameters())
    assert (sum(p.numel() for p in params), len(params)) == chapter.expected_size(16, 3)


def test_split_shapes_keeps_the_total_and_rejects_uneven_splits():
    shapes = chapter.split_shapes(4096, 16)
    assert len(shapes) == 16 and sum(s[0] for s in shapes) == 4096
    with pytest.raises(ValueError):
        chapter.split_shapes(100, 3)


def test_grads_are_reproducible_from_the_seed():
    a = chapter.make_grads([(3, 4), (5,)], seed=7, device="cpu")
    b = chapter.make_grads([(3, 4), (5,)], seed=7, device="cpu")
    c = chapter.make_grads([(3, 4), (5,)], seed=8, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


def test_cannot_step_reports_the_reason_in_one_line():
    assert chapter.cannot_step(factories()["for-loop"], "cpu") is None

    def broken(params):
        raise RuntimeError("fused kernels are not built for this device\nmore detail")

    assert chapter.cannot_step(broken, "cpu") == (
        "RuntimeError: fused kernels are not built for this device")


def test_the_factories_are_called_with_fresh_parameters_holding_the_gradients():
    seen = []

    def spy(params):
        seen.append(params)
        return torch.optim.AdamW(params, **HP)

    work = chapter.workload(list(chapter.build_model(hidden=8, blocks=1).parameters()))
    params, _ = work.prepared(spy)
    assert seen == [params]
    assert all(p is not q for p, q in zip(params, work.params, strict=True))
    assert all(p.grad is g for p, g in zip(params, work.grads, strict=True))


# ------------------------------------------------------------------ bytes per step
def _stepped(factory, dtype=torch.float32, n=10):
    p = torch.nn.Parameter(torch.zeros(n, dtype=dtype))
    p.grad = torch.ones_like(p)
    optimizer = factory([p])
    optimizer.step()
    return optimizer


def test_step_bytes_fp32_adamw_is_28_per_parameter():
    for name, factory in native().items():
        assert chapter.step_bytes(_stepped(factory)) == 28 * 10, name


def test_step_bytes_follow_the_state_dtype():
    # torch keeps bf16 moments: 7 x 2 B
    assert chapter.step_bytes(_stepped(factories()["foreach"], torch.bfloat16)) == 14 * 10

    class Fp32Moments(torch.optim.Optimizer):
        """Apex FusedAdam's layout: fp32 moments whatever the parameter dtype."""

        def __init__(self, params):
            super().__init__(params, {})

        def step(self):
            for p in self.param_groups[0]["params"]:
                self.state[p] = {"exp_avg": torch.zeros(p.shape),
                                 "exp_avg_sq": torch.zeros(p.shape)}

    # read p(2) + g(2) + m(4) + v(4) = 12, write p(2) + m(4) + v(4) = 10
    assert chapter.step_bytes(_stepped(Fp32Moments, torch.bfloat16)) == 22 * 10


def _timing(label, ms, bytes_per_step=28_000_000):
    """One candidate's rounds (name -> [Timing]), three rounds around ``ms``."""
    return {label: [bench.Timing(label=label, samples_ms=[m * 0.99, m, m * 1.01], device="cpu",
                                 meta={"bytes_per_step": bytes_per_step, "round": k})
                    for k, m in enumerate([ms * 0.99, ms, ms * 1.01])]}


def test_step_table_bandwidth_and_speedups():
    table = chapter.step_table(_timing("for-loop", 10.0) | _timing("foreach", 5.0)
                               | _timing("fused", 2.0), 1_000_000, copy_gbps=100.0)
    fused = table.set_index("candidate").loc["fused"]
    assert fused.bytes_per_param == 28
    assert fused.gbps == pytest.approx(28e6 / 2e-3 / 1e9)
    assert fused.pct_of_copy_ceiling == pytest.approx(fused.gbps)
    assert fused.speedup_vs_forloop == pytest.approx(5.0)
    assert fused.speedup_vs_foreach == pytest.approx(2.5)
    assert fused.median_ms == pytest.approx(2.0) and fused.rounds == 3
    assert fused.round_range_pct == pytest.approx(2.0)
    for column in ("candidate", "median_ms", "q1_ms", "q3_ms", "iqr_ms", "gbps", "round_min_ms",
                   "pct_of_copy_ceiling", "speedup_vs_foreach", "speedup_vs_forloop"):
        assert column in table.columns


def test_step_table_counts_each_candidates_own_bytes():
    table = chapter.step_table(_timing("fused", 1.0, 14_000) | _timing("apex", 1.0, 22_000),
                               1000, 1.0).set_index("candidate")
    assert list(table["bytes_per_param"]) == [14, 22]
    assert table.loc["fused", "gbps"] == pytest.approx(14_000 / 1e-3 / 1e9)
    assert "speedup_vs_foreach" not in table.columns  # no baseline measured, no column


def test_time_optimizers_times_every_factory_and_records_its_bytes():
    work = chapter.workload(list(chapter.build_model(hidden=8, blocks=1).parameters()))
    timings = chapter.time_optimizers(native(), work, warmup=1, repeats=2, rounds=3,
                                      steps={"no-op": lambda: None})
    assert list(timings) == [*native(), "no-op"]
    assert all(len(ts) == 3 and all(len(t.samples_ms) == 2 for t in ts)
               for ts in timings.values())
    assert [t.meta["round"] for t in timings["foreach"]] == [0, 1, 2]
    assert {t.meta["bytes_per_step"] for name in native() for t in timings[name]} == {
        28 * work.numel}
    assert "bytes_per_step" not in timings["no-op"][0].meta
    with pytest.raises(ValueError):
        chapter.time_optimizers(native(), work, warmup=0, repeats=2)


def test_time_optimizers_holds_one_candidates_state_at_a_time():
    import gc
    import weakref

    live, built, most = weakref.WeakSet(), [], [0]

    def tracked(factory):
        def make(p):
            optimizer = factory(p)
            live.add(optimizer)
            built.append(optimizer.__class__)
            return optimizer
        return make

    def probe():  # a step of its own in the same rounds: how many optimizers are alive now?
        gc.collect()
        most[0] = max(most[0], len(live))

    work = chapter.workload(list(chapter.build_model(hidden=8, blocks=1).parameters()))
    cands = {name: tracked(factory) for name, factory in native().items()}
    chapter.time_optimizers(cands, work, warmup=1, repeats=1, rounds=2, steps={"probe": probe})
    assert most[0] == 1  # the last candidate's, never two at once
    assert len(built) == (1 + 2) * len(cands)  # fresh in every round, the discarded first too
    gc.collect()
    assert len(live) == 0  # none kept after the timing


def test_workload_gradients_follow_the_parameter_dtype():
    model = chapter.build_model(hidden=16, blocks=1).to(torch.bfloat16)
    work = chapter.workload(list(model.parameters()))
    assert {g.dtype for g in work.grads} == {torch.bfloat16}
    params, optimizer = work.prepared(factories()["for-loop"])
    before = params[1].detach().clone()
    optimizer.step()
    assert not torch.equal(before, params[1].detach())


# ------------------------------------------------------------------ correctness
def test_native_candidates_agree_with_the_float64_reference_on_cpu():
    params = list(chapter.build_model(hidden=16, blocks=2).parameters())
    cands = native()
    table = chapter.correctness(cands, params, 3, reference=cands["for-loop"], atol=1e-6)
    assert list(table["candidate"]) == list(cands)
    assert table["ok"].all(), table
    assert (table["max_abs_vs_ref_float64"] > 0).all()  # fp32 really differs from float64


def test_correctness_catches_a_wrong_weight_decay():
    # FusedAdam's default weight_decay=0 against AdamW's 0.01 moves parameters by lr*wd*p:
    # visible after a step with a large learning rate
    hp = dict(HP, lr=0.5)
    no_decay = dict(hp, weight_decay=0.0)
    cands = {"for-loop": factories(hp)["for-loop"],
             "no decay": lambda p: torch.optim.AdamW(p, foreach=True, **no_decay)}
    params = list(chapter.build_model(hidden=16, blocks=1).parameters())
    table = chapter.correctness(cands, params, 2, reference=cands["for-loop"],
                                atol=hp["lr"] / 1000)
    ok = table.set_index("candidate")["ok"]
    assert bool(ok["for-loop"]) and not bool(ok["no decay"])


def test_correctness_uses_the_given_tolerance():
    params = list(chapter.build_model(hidden=8, blocks=1).parameters())
    cands = native()
    table = chapter.correctness(cands, params, 2, reference=cands["for-loop"], atol=0.0)
    assert not table["ok"].any() and (table["atol"] == 0.0).all()


# ------------------------------------------------------------------ verdicts
def test_comparison_flips_when_the_numbers_flip():
    def rounds(apex_ms, fused_ms):
        return bench.round_medians(_timing("foreach", 5.0) | _timing("fused", fused_ms)
                                   | _timing("apex FusedAdam", apex_ms))

    pairs = [("apex FusedAdam", "fused")]
    row = verdicts.rounds_table(rounds(1, 2), pairs).iloc[0]
    assert (row.verdict, row.speedup, row.label) == ("faster", pytest.approx(2.0), "faster 2.00x")
    row = verdicts.rounds_table(rounds(2, 1), pairs).iloc[0]
    assert (row.verdict, row.speedup, row.label) == ("slower", pytest.approx(0.5), "slower 0.50x")


def test_comparison_names_a_tie_and_skips_pairs_not_measured():
    rounds = bench.round_medians(_timing("foreach", 5.0) | _timing("fused", 2.0)
                                 | _timing("compiled", 2.02))
    got = verdicts.rounds_table(rounds, [("compiled", "fused"), ("apex FusedAdam", "fused"),
                                         ("fused", "foreach")])
    assert list(zip(got["candidate"], got["vs"], got["label"], strict=True)) == [
        ("compiled", "fused", "tie"), ("fused", "foreach", "faster 2.50x")]
    empty = verdicts.rounds_table(rounds, [("apex FusedAdam", "fused")])
    assert empty.empty and "label" in empty.columns


def test_rounds_that_disagree_are_a_tie_whatever_the_medians_say():
    # fused's median is 10% below apex's, but apex won one round of three: no speed-up
    rounds = {"fused": [1.0, 1.0, 1.12], "apex FusedAdam": [1.1, 1.1, 1.1]}
    table = chapter.step_table({name: [bench.Timing(name, [ms] * 3, "cpu",
                                                    meta={"bytes_per_step": 28_000})
                                       for ms in ms_list] for name, ms_list in rounds.items()},
                               1000, 1.0)
    assert (table["round_range_pct"] < 25).all()  # each steady: the rounds alone disagree
    row = verdicts.rounds_table(rounds, [("fused", "apex FusedAdam")]).iloc[0]
    assert row.label == "tie" and row.why.startswith("the rounds disagree")
    rounds["fused"] = [1.0, 1.0, 1.05]  # now every round agrees: a speed-up
    row = verdicts.rounds_table(rounds, [("fused", "apex FusedAdam")]).iloc[0]
    assert row.label == "faster 1.10x"


# ------------------------------------------------------------------ kernels, sweep, gotchas
def test_kernel_counts_fall_with_fusion_on_cpu():
    work = chapter.workload(list(chapter.build_model(hidden=16, blocks=2).parameters()))
    table = chapter.kernel_table(native(), work).set_index("candidate")
    assert table.loc["for-loop", "per_step"] > table.loc["foreach", "per_step"]
    assert (table["per_tensor"] * table["tensors"] == table["per_step"]).all()
    assert table.loc["for-loop", "per_tensor"] >= 1  # at least one op per tensor, one at a time
    if "fused" in table.index:
        assert table.loc["fused", "per_step"] < table.loc["foreach", "per_step"]


def test_sweep_and_its_reading():
    cands = {"foreach": factories()["foreach"]}
    seen = []

    def progress(it, desc=""):
        seen.append(desc)
        return it

    table = chapter.tensor_count_sweep(cands, 4096, [2, 32], "cpu", warmup=1, repeats=2,
                                       progress=progress)
    assert list(table["tensors"]) == [2, 32] and seen == ["tensor counts"]
    assert list(chapter.sweep_table(table)["candidate"]) == ["foreach"]
    fake = pd.DataFrame({"candidate": ["x", "x"], "tensors": [4, 64], "median_ms": [1.0, 3.0]})
    ends = chapter.sweep_table(fake).iloc[0]
    assert ends.slowdown == pytest.approx(3.0)
    assert (ends.ms_at_4_tensors, ends.ms_at_64_tensors) == (1.0, 3.0)
    assert (ends.label, ends.why) == ("slower 0.33x", "")


def test_gotchas_probe_torch_adamw():
    table = chapter.gotchas({"torch AdamW": torch.optim.AdamW}, "cpu").set_index("question")
    column = table["torch AdamW"]
    assert column["default weight_decay"] == "0.01"
    assert column["step counter in"] == "state[p]['step']"
    assert column["zero_grad(set_to_none=True)"] == "works (grad is None: True)"
    assert column["exp_avg dtype, bf16 params"] == "bfloat16"
    assert column["master_weights=True alone"] == "no such argument"


def test_gotchas_labels_are_short_enough_never_to_be_cut():
    table = chapter.gotchas({"torch AdamW": torch.optim.AdamW}, "cpu")
    assert all(len(q) <= 30 for q in table["question"])
    assert not any(re.search(r"\.\.\.$", v) for v in table["torch AdamW"])
