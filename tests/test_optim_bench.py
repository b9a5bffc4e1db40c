"""Notebook 02's helpers: bytes per parameter, the model, candidates and the verdict text."""

import sys
import types

import pandas as pd
import pytest
import torch

from helpers import bench, optim_bench, optim_gotchas


def test_bytes_per_param_fp32_adamw_is_28():
    assert optim_bench.adamw_bytes_per_param() == {"read": 16, "write": 12, "total": 28}


def test_bytes_per_param_bf16_params_with_fp32_state():
    # read p(2) + g(2) + m(4) + v(4) = 12, write p(2) + m(4) + v(4) = 10
    assert optim_bench.adamw_bytes_per_param(2, 2, 4) == {"read": 12, "write": 10, "total": 22}


def test_model_size_matches_formula():
    model = optim_bench.build_model(hidden=16, blocks=3)
    params = list(model.parameters())
    assert (sum(p.numel() for p in params), len(params)) == optim_bench.expected_size(16, 3)


def test_split_shapes_keeps_the_total_and_rejects_uneven_splits():
    shapes = optim_bench.split_shapes(4096, 16)
    assert len(shapes) == 16 and sum(s[0] for s in shapes) == 4096
    with pytest.raises(ValueError):
        optim_bench.split_shapes(100, 3)


def test_grads_are_reproducible_from_the_seed():
    a = optim_bench.make_grads([(3, 4), (5,)], seed=7, device="cpu")
    b = optim_bench.make_grads([(3, 4), (5,)], seed=7, device="cpu")
    c = optim_bench.make_grads([(3, 4), (5,)], seed=8, device="cpu")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
    assert not torch.equal(a[0], c[0])


# No value equals a default of torch's AdamW or Apex's FusedAdam, so a candidate that drops one
# of them is caught.
ODD_HPARAMS = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6, "weight_decay": 0.3}


def test_every_native_candidate_takes_the_given_hyper_parameters():
    params = [torch.nn.Parameter(torch.zeros(3))]
    for name in optim_bench.native_candidates("cpu"):
        group = optim_bench.make_optimizer(name, params, hparams=ODD_HPARAMS).param_groups[0]
        assert group["lr"] == 0.05 and group["eps"] == 1e-6, name
        assert tuple(group["betas"]) == (0.8, 0.95) and group["weight_decay"] == 0.3, name
    groups = [optim_bench.make_optimizer(n, params, hparams=ODD_HPARAMS).param_groups[0]
              for n in optim_bench.native_candidates("cpu")]
    assert [g["foreach"] for g in groups[:2]] == [False, True]


def test_apex_candidate_passes_every_hyper_parameter(monkeypatch):
    calls = []

    class FakeFusedAdam:
        def __init__(self, params, **kwargs):
            calls.append((list(params), kwargs))

    apex = types.ModuleType("apex")
    apex_optimizers = types.ModuleType("apex.optimizers")
    apex_optimizers.FusedAdam = FakeFusedAdam
    apex.optimizers = apex_optimizers
    monkeypatch.setitem(sys.modules, "apex", apex)
    monkeypatch.setitem(sys.modules, "apex.optimizers", apex_optimizers)
    params = [torch.nn.Parameter(torch.zeros(3))]
    optimizer = optim_bench.make_optimizer(optim_bench.APEX, params, hparams=ODD_HPARAMS)
    assert isinstance(optimizer, FakeFusedAdam)
    (got_params, kwargs), = calls
    assert got_params == params
    # adam_w_mode=True: decoupled weight decay, as AdamW; FusedAdam's default would be 0.0
    assert kwargs == {"adam_w_mode": True, **ODD_HPARAMS}
    calls.clear()
    optim_bench.make_optimizer(optim_bench.APEX, params)
    assert calls[0][1] == {"adam_w_mode": True, **optim_bench.HPARAMS}


def test_unknown_candidate_is_refused():
    with pytest.raises(KeyError):
        optim_bench.make_optimizer("nope", [torch.nn.Parameter(torch.zeros(1))])


def test_native_candidates_agree_with_the_float64_reference_on_cpu():
    model = optim_bench.build_model(hidden=16, blocks=2)
    table = optim_bench.correctness(list(model.parameters()),
                                    optim_bench.native_candidates("cpu"), steps=3)
    assert table["ok"].all(), table
    assert (table["max_abs_vs_float64"] > 0).all()  # fp32 really differs from float64


def test_correctness_catches_a_wrong_weight_decay(monkeypatch):
    model = optim_bench.build_model(hidden=16, blocks=1)
    real = optim_bench.make_optimizer

    def wrong(name, params, hparams=None):
        hp = dict(optim_bench.HPARAMS, weight_decay=0.0) if name == optim_bench.FOREACH else None
        return real(name, params, hp)

    monkeypatch.setattr(optim_bench, "make_optimizer", wrong)
    # FusedAdam's default weight_decay=0 against AdamW's 0.01 moves parameters by lr*wd*p:
    # visible after a step with a large learning rate
    monkeypatch.setitem(optim_bench.HPARAMS, "lr", 0.5)
    table = optim_bench.correctness(list(model.parameters()),
                                    [optim_bench.FORLOOP, optim_bench.FOREACH], steps=2)
    assert table.set_index("candidate").loc[optim_bench.FOREACH, "ok"] == False  # noqa: E712


def _timing(label, ms):
    return bench.Timing(label=label, samples_ms=[ms * 0.99, ms, ms * 1.01], device="cpu")


def test_step_table_bandwidth_and_speedups():
    numel = 1_000_000
    table = optim_bench.step_table([_timing("for-loop", 10.0), _timing("foreach", 5.0),
                                    _timing("fused", 2.0)], numel, copy_gbps=100.0)
    fused = table.set_index("candidate").loc["fused"]
    assert fused.gbps == pytest.approx(28e6 / 2e-3 / 1e9)
    assert fused.pct_of_copy_ceiling == pytest.approx(fused.gbps)
    assert fused.speedup_vs_forloop == pytest.approx(5.0)
    assert fused.speedup_vs_foreach == pytest.approx(2.5)
    for column in ("candidate", "median_ms", "q1_ms", "q3_ms", "iqr_ms", "gbps",
                   "pct_of_copy_ceiling", "speedup_vs_foreach", "speedup_vs_forloop"):
        assert column in table.columns


def test_verdict_flips_when_the_numbers_flip():
    def table(apex_ms, fused_ms):
        return optim_bench.step_table([_timing("foreach", 5.0), _timing("fused", fused_ms),
                                       _timing("apex FusedAdam", apex_ms)], 1000, 1.0)

    assert "apex FusedAdam (1 ms) is 2.00x faster than fused" in optim_bench.verdict(table(1, 2))
    assert "apex FusedAdam (2 ms) is 2.00x slower than fused" in optim_bench.verdict(table(2, 1))
    assert optim_bench.verdict(table(1, 2)).startswith("Fastest on this run: apex FusedAdam")
    assert optim_bench.verdict(table(2, 1)).startswith("Fastest on this run: fused")


def test_verdict_names_no_single_winner_in_a_tie():
    table = optim_bench.step_table([_timing("foreach", 5.0), _timing("fused", 2.0),
                                    _timing("apex FusedAdam", 2.02)], 1000, 1.0)
    first = optim_bench.verdict(table).splitlines()[0]
    assert first == "Fastest on this run: fused (indistinguishable from apex FusedAdam)."
    assert "indistinguishable" in optim_bench.verdict(table).splitlines()[1]


def test_step_table_counts_bytes_from_the_parameter_dtype():
    timings = [_timing("fused", 1.0), _timing("apex FusedAdam", 1.0)]
    fp32 = optim_bench.step_table(timings, 1000, 1.0).set_index("candidate")
    assert list(fp32["bytes_per_param"]) == [28, 28]
    bf16 = optim_bench.step_table(timings, 1000, 1.0, param_dtype=torch.bfloat16)
    bf16 = bf16.set_index("candidate")
    # torch keeps bf16 moments (7 x 2 B); Apex fp32 moments (p, g: 2 x 2 B read, p: 2 B written)
    assert bf16.loc["fused", "bytes_per_param"] == 14
    assert bf16.loc["apex FusedAdam", "bytes_per_param"] == 22
    assert bf16.loc["apex FusedAdam", "bytes_per_step"] == 22_000
    assert bf16.loc["fused", "gbps"] == pytest.approx(14_000 / 1e-3 / 1e9)


def test_workload_gradients_follow_the_parameter_dtype():
    model = optim_bench.build_model(hidden=16, blocks=1).to(torch.bfloat16)
    work = optim_bench.workload(list(model.parameters()))
    assert {g.dtype for g in work.grads} == {torch.bfloat16}
    params, optimizer = work.prepared(optim_bench.FORLOOP)
    before = params[1].detach().clone()
    optimizer.step()
    assert not torch.equal(before, params[1].detach())


def test_kernel_counts_fall_with_fusion_on_cpu():
    work = optim_bench.workload(list(optim_bench.build_model(hidden=16, blocks=2).parameters()))
    table = optim_bench.kernel_table(work, optim_bench.native_candidates("cpu")).set_index(
        "candidate")
    assert table.loc["for-loop", "per_step"] > table.loc["foreach", "per_step"]
    if "fused" in table.index:
        assert table.loc["fused", "per_step"] < table.loc["foreach", "per_step"]


def test_sweep_and_its_reading():
    table = optim_bench.tensor_count_sweep(4096, [2, 32], [optim_bench.FOREACH], "cpu",
                                           warmup=0, repeats=2)
    assert list(table["tensors"]) == [2, 32]
    assert "foreach:" in optim_bench.sweep_reading(table)
    fake = pd.DataFrame({"candidate": ["x", "x"], "tensors": [4, 64], "median_ms": [1.0, 3.0]})
    assert "3.0x the time" in optim_bench.sweep_reading(fake)


def test_gotchas_probe_torch_adamw():
    table = optim_gotchas.gotchas("cpu", apex=False).set_index("question")["torch AdamW"]
    assert table["default weight_decay"] == "0.01"
    assert table["step counter kept in"] == "state[p]['step']"
    assert table["master_weights=True alone"] == "no such argument"
