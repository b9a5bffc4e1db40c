"""Notebook 02's chapter module: the workload, the checks and the tables, driven by factories."""

import gc
import weakref
from pathlib import Path

import pytest
import torch

from helpers import bench
from helpers.chapters import optimizers as chapter

HP = {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}


def factories(hp=HP):  # the notebook's native candidates, as its section 3 builds them
    return {"for-loop": lambda p: torch.optim.AdamW(p, foreach=False, **hp),
            "foreach": lambda p: torch.optim.AdamW(p, foreach=True, **hp),
            "fused": lambda p: torch.optim.AdamW(p, fused=True, **hp)}


def native(device="cpu"):  # those that step here (the notebook drops fused where it cannot)
    cands = factories()
    if chapter.cannot_step(cands["fused"], device):
        del cands["fused"]
    return cands


def test_no_helper_builds_an_optimizer_the_notebook_compares():
    source = Path(chapter.__file__).read_text()
    for name in ("AdamW(", "FusedAdam(", "Adam(", "SGD("):
        assert name not in source, f"{chapter.__file__} constructs {name}...): use a factory"


def test_model_size_split_shapes_and_cannot_step_reports_the_reason_in_one_line():
    params = list(chapter.build_model(hidden=16, blocks=3).parameters())
    assert (sum(p.numel() for p in params), len(params)) == chapter.expected_size(16, 3)
    assert sum(s[0] for s in chapter.split_shapes(4096, 16)) == 4096
    with pytest.raises(ValueError):
        chapter.split_shapes(100, 3)
    assert chapter.cannot_step(factories()["for-loop"], "cpu") is None

    def broken(params):
        raise RuntimeError("fused kernels are not built for this device\nmore detail")

    assert chapter.cannot_step(broken, "cpu") == (
        "RuntimeError: fused kernels are not built for this device")


def _stepped(factory, dtype=torch.float32, n=10):
    p = torch.nn.Parameter(torch.zeros(n, dtype=dtype))
    p.grad = torch.ones_like(p)
    optimizer = factory([p])
    optimizer.step()
    return optimizer


def test_step_bytes_follow_the_state_dtype():
    for name, factory in native().items():
        assert chapter.step_bytes(_stepped(factory)) == 28 * 10, name  # fp32 AdamW
    # torch keeps bf16 moments: 7 x 2 B
    assert chapter.step_bytes(_stepped(factories()["foreach"], torch.bfloat16)) == 14 * 10

    class Fp32Moments(torch.optim.Optimizer):  # Apex FusedAdam's: fp32 moments always
        def __init__(self, params):
            super().__init__(params, {})

        def step(self):
            for p in self.param_groups[0]["params"]:
                self.state[p] = {"exp_avg": torch.zeros(p.shape),
                                 "exp_avg_sq": torch.zeros(p.shape)}

    # read p(2) + g(2) + m(4) + v(4) = 12, write p(2) + m(4) + v(4) = 10
    assert chapter.step_bytes(_stepped(Fp32Moments, torch.bfloat16)) == 22 * 10


def _timing(label, ms, bytes_per_step=28_000_000):  # three rounds around ms
    return {label: [bench.Timing(label=label, samples_ms=[m * 0.99, m, m * 1.01], device="cpu",
                                 meta={"bytes_per_step": bytes_per_step, "round": k})
                    for k, m in enumerate([ms * 0.99, ms, ms * 1.01])]}


def test_step_table_reads_the_rounds_and_each_candidates_own_bytes():
    table = chapter.step_table(_timing("fused", 2.0) | _timing("apex", 2.0, 22_000_000),
                               1_000_000, copy_gbps=100.0).set_index("candidate")
    fused = table.loc["fused"]
    assert fused.median_ms == pytest.approx(2.0) and fused.rounds == 3
    assert (fused.round_min_ms, fused.round_max_ms) == pytest.approx((1.98, 2.02))
    assert fused.round_range_pct == pytest.approx(2.0)
    assert fused.gbps == pytest.approx(28e6 / 2e-3 / 1e9) == fused.pct_of_copy_ceiling
    assert list(table["bytes_per_param"]) == [28, 22]


def test_each_factory_gets_fresh_parameters_and_is_timed_fresh_one_state_at_a_time():
    live, built, most = weakref.WeakSet(), [], [0]

    def tracked(factory):
        def make(p):
            live.add(optimizer := factory(p))
            built.append(type(optimizer))
            return optimizer
        return make

    def probe():  # a step of its own in the same rounds: how many optimizers are alive now?
        gc.collect()
        most[0] = max(most[0], len(live))

    work = chapter.workload(list(chapter.build_model(hidden=8, blocks=1).parameters()))
    params, optimizer = work.prepared(factories()["foreach"])  # over fresh parameters
    assert all(p is q for p, q in zip(optimizer.param_groups[0]["params"], params, strict=True))
    assert all(p is not q for p, q in zip(params, work.params, strict=True))
    assert all(p.grad is g for p, g in zip(params, work.grads, strict=True))  # shared gradients
    cands = {name: tracked(factory) for name, factory in native().items()}
    timings = chapter.time_optimizers(cands, work, warmup=1, repeats=2, rounds=3,
                                      steps={"probe": probe})
    assert list(timings) == [*cands, "probe"] and most[0] == 1  # never two at once
    assert all(len(ts) == 3 and all(len(t.samples_ms) == 2 for t in ts)
               for ts in timings.values())
    assert [t.meta["round"] for t in timings["foreach"]] == [0, 1, 2]
    assert {t.meta["bytes_per_step"] for name in cands for t in timings[name]} == {
        28 * work.numel}
    assert "bytes_per_step" not in timings["probe"][0].meta
    assert len(built) == (1 + 3) * len(cands)  # fresh in every round, the discarded first too
    gc.collect()
    assert len(live) == 0  # none kept after the timing
    with pytest.raises(ValueError):
        chapter.time_optimizers(native(), work, warmup=0, repeats=2)


def test_native_candidates_agree_with_the_float64_reference_and_a_wrong_decay_does_not():
    params = list(chapter.build_model(hidden=16, blocks=2).parameters())
    cands = native()
    table = chapter.correctness(cands, params, 3, reference=cands["for-loop"], atol=1e-6)
    assert list(table["candidate"]) == list(cands)
    assert table["ok"].all(), table
    assert (table["max_abs_vs_ref_float64"] > 0).all()  # fp32 really differs from float64
    hp = dict(HP, lr=0.5)  # a wrong weight decay: FusedAdam's default 0 vs AdamW's 0.01
    no_decay = dict(hp, weight_decay=0.0)
    cands = {"for-loop": factories(hp)["for-loop"],
             "no decay": lambda p: torch.optim.AdamW(p, foreach=True, **no_decay)}
    table = chapter.correctness(cands, params, 2, reference=cands["for-loop"],
                                atol=hp["lr"] / 1000)
    ok = table.set_index("candidate")["ok"]
    assert bool(ok["for-loop"]) and not bool(ok["no decay"])


def test_kernel_counts_fall_with_fusion_on_cpu():
    work = chapter.workload(list(chapter.build_model(hidden=16, blocks=2).parameters()))
    table = chapter.kernel_table(native(), work).set_index("candidate")
    assert table.loc["for-loop", "per_step"] > table.loc["foreach", "per_step"]
    assert (table["per_tensor"] * table["tensors"] == table["per_step"]).all()
    assert table.loc["for-loop", "per_tensor"] >= 1  # at least one op per tensor, one at a time
    if "fused" in table.index:
        assert table.loc["fused", "per_step"] < table.loc["foreach", "per_step"]


def test_sweep_keeps_every_step_and_its_table_the_share_of_the_ceiling():
    samples = chapter.tensor_count_sweep({"foreach": factories()["foreach"]}, 4096, [2, 32],
                                         "cpu", warmup=1, repeats=3)
    assert len(samples) == 2 * 3  # one row per timed step
    assert set(samples["bytes_per_step"]) == {28 * 4096}
    planted = samples.assign(ms=[1.0, 2.0, 3.0, 10.0, 20.0, 30.0])
    table = chapter.sweep_table(planted, copy_gbps=1.0).set_index("tensors")
    assert list(table["median_ms"]) == [2.0, 20.0] and list(table["repeats"]) == [3, 3]
    assert table.loc[2, "pct_of_copy_ceiling"] == pytest.approx(100 * 28 * 4096 / 2e-3 / 1e9)


def test_gotchas_probe_torch_adamw():
    table = chapter.gotchas({"torch AdamW": torch.optim.AdamW}, "cpu").set_index("question")
    assert table["torch AdamW"].to_dict() == {
        "default weight_decay": "0.01", "step counter in": "state[p]['step']",
        "zero_grad(set_to_none=True)": "works (grad is None: True)",
        "exp_avg dtype, bf16 params": "bfloat16", "master_weights=True alone": "no such argument"}
