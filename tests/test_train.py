"""Notebook 05's training paths on the CPU: same batches, same start, a falling loss, and the
report arithmetic (MFU, peaks, verdict)."""

import math

import pandas as pd
import pytest
import torch

from helpers import breakdown, corpus, gpt, train, trainreport

CPU = torch.device("cpu")
CFG = gpt.GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=32)


@pytest.fixture(scope="module")
def data():
    return corpus.load_corpus(cap_mb=0.6)


def _experiment(data, steps=12, profile_steps=0, **kw) -> train.Experiment:
    hp = train.Hyper(steps=steps, batch=4, lr=3e-3, warmup=2, timing_warmup=2,
                     profile_steps=profile_steps, **kw)
    return train.make_experiment(CFG, hp, data.train, data.val, CPU, eval_batches=2)


def test_lr_schedule():
    hp = train.Hyper(steps=100, batch=1, lr=1e-3, warmup=10, min_lr_ratio=0.1)
    assert train.lr_at(0, hp) == pytest.approx(1e-4)
    assert train.lr_at(9, hp) == pytest.approx(1e-3)
    assert train.lr_at(55, hp) == pytest.approx(0.55e-3)
    assert train.lr_at(100, hp) == pytest.approx(1e-4) == train.lr_at(150, hp)
    lrs = [train.lr_at(s, hp) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:], strict=False))


def test_weight_decay_only_on_matrices_and_explicit():
    model = gpt.GPT(CFG)
    hp = train.Hyper(steps=1, batch=1, weight_decay=0.07)
    for kind in ("adamw", "adamw_fused"):
        opt = train.make_optimizer(kind, model, hp)
        decay, no_decay = opt.param_groups
        assert decay["weight_decay"] == 0.07 and no_decay["weight_decay"] == 0.0
        assert all(p.dim() >= 2 for p in decay["params"])
        assert all(p.dim() < 2 for p in no_decay["params"])
        assert sum(p.numel() for g in opt.param_groups for p in g["params"]) == \
            gpt.count_params(model)
        assert decay["betas"] == hp.betas and decay["eps"] == hp.eps


def test_every_path_starts_from_the_same_weights(data):
    exp = _experiment(data)
    a = train._build(train.PATHS["1"], exp).state_dict()
    b = train._build(train.PATHS["3"], exp).state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_same_batches_for_every_path_and_loss_decreases(data):
    exp = _experiment(data, steps=25)
    runs = [train.run_path(train.PATHS[k], exp) for k in ("1", "3")]
    assert all(r.skipped is None for r in runs)
    expected = sum(int(corpus.token_checksum(exp.plan.batch(i)[0])) * (i + 1) for i in range(25))
    assert runs[0].checksum == runs[1].checksum == expected
    for run in runs:
        assert len(run.losses) == 25
        first, last = sum(run.losses[:3]) / 3, run.final_train_loss
        assert last < first - 0.5, (first, last)
        assert math.isfinite(run.val_loss)
    # fp32 and bf16-autocast training of the same model on the same batches stay close
    assert runs[0].val_loss == pytest.approx(runs[1].val_loss, rel=0.05)


def test_checksum_sees_the_order_of_batches(data):
    exp = _experiment(data, steps=4)
    same = train.run_path(train.PATHS["1"], exp).checksum
    exp.plan.offsets[[0, 1]] = exp.plan.offsets[[1, 0]]  # the same batches, two swapped
    assert train.run_path(train.PATHS["1"], exp).checksum != same


def test_profiler_breakdown_fits_in_the_traced_step(data):
    exp = _experiment(data, steps=4, profile_steps=2)
    run = train.run_path(train.PATHS["1"], exp)
    # operator self times are measured by the profiler, the traced step by the wall clock: the
    # self times of operators that run one after another cannot add up to more than the step
    assert 0 < run.breakdown["kernel_ms"] <= run.breakdown["traced_step_ms"] * 1.05
    assert run.breakdown["matmul_ms"] > 0 and run.breakdown["optimizer_ms"] > 0
    table = trainreport.breakdown_table([run])
    assert list(table["path"]) == ["1"] and table["gap_ms"].notna().all()


def test_gpu_only_paths_skip_on_cpu_with_one_line(data):
    exp = _experiment(data)
    for key in ("1b", "2", "4"):
        run = train.run_path(train.PATHS[key], exp)
        assert run.skipped and "\n" not in run.skipped and f"Path {key}" in run.skipped


def test_out_of_memory_marks_the_path_skipped(data, monkeypatch):
    def boom(path, exp):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")

    monkeypatch.setattr(train, "_build", boom)
    run = train.run_path(train.PATHS["1"], _experiment(data))
    assert run.skipped and "smaller batch_size" in run.skipped


def test_failing_torch_compile_marks_the_path_skipped(data, monkeypatch):
    def no_compiler(model, *args, **kwargs):
        raise RuntimeError("InductorError: no working C compiler found\n  long traceback ...")

    monkeypatch.setattr(torch, "compile", no_compiler)
    monkeypatch.setattr(train, "skip_reason", lambda path, device: None)  # run it on the CPU
    run = train.run_path(train.PATHS["4"], _experiment(data))
    assert run.skipped == (
        "Path 4 (Native + torch.compile) skipped: torch.compile failed: InductorError: no working "
        "C compiler found; it needs a C compiler and Triton (or skip path 4).")
    assert str(run) == run.skipped


def test_other_errors_of_an_eager_path_still_raise(data, monkeypatch):
    def broken(path, exp):
        raise RuntimeError("a bug")

    monkeypatch.setattr(train, "_build", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        train.run_path(train.PATHS["1"], _experiment(data))


def test_dynamo_style_error_keeps_the_line_that_says_what_failed():
    err = RuntimeError("backend='inductor' raised:\nRuntimeError: Cannot find a working triton\n")
    assert train._first_line(err) == ("backend='inductor' raised: RuntimeError: Cannot find a "
                                      "working triton")


@pytest.mark.parametrize("steps, timing_warmup, message", [
    (3, 3, r"steps \(3\) must be larger than timing_warmup \(3\).*set steps to 4 or more"),
    (2, 3, r"steps \(2\) must be larger than timing_warmup \(3\)"),
    (5, 0, r"timing_warmup \(0\) must be at least 1"),
])
def test_too_few_steps_to_time_is_one_clear_error(data, steps, timing_warmup, message):
    hp = train.Hyper(steps=steps, batch=4, timing_warmup=timing_warmup)
    with pytest.raises(ValueError, match=message) as err:
        train.make_experiment(CFG, hp, data.train, data.val, CPU, eval_batches=2)
    assert "\n" not in str(err.value)


def test_run_line_leaves_out_memory_it_did_not_measure(data):
    run = train.run_path(train.PATHS["1"], _experiment(data, steps=4))
    assert "GiB" not in str(run) and "nan" not in str(run)


@pytest.mark.parametrize("name, category", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "matmul"),
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "matmul"),
    ("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>", "attention"),
    ("fmha_cutlassB_f32_aligned_64x64_k64_sm80", "attention"),
    ("void cuApplyLayerNorm<c10::BFloat16, float, c10::BFloat16>", "norm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float>", "norm"),
    ("triton_per_fused_add_native_layer_norm_3", "norm"),
    ("void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>", "optimizer"),
    ("void at::native::vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", "elementwise"),
    ("triton_poi_fused_gelu_5", "elementwise"),
    ("aten::addmm", "matmul"),
    ("aten::_fused_adamw_", "optimizer"),
    ("aten::native_layer_norm_backward", "norm"),
    ("aten::embedding_dense_backward", "other"),
])
def test_kernel_categories(name, category):
    assert breakdown.categorize(name) == category


def test_peak_lookup_and_mfu():
    assert trainreport.peak_bf16_tflops("NVIDIA H200")[0] == 989.0
    assert trainreport.peak_bf16_tflops("NVIDIA H100 80GB HBM3")[0] == 989.0
    assert trainreport.peak_bf16_tflops("NVIDIA H100 PCIe")[0] == 756.0
    assert trainreport.peak_bf16_tflops("NVIDIA A100-SXM4-80GB")[0] == 312.0
    assert trainreport.peak_bf16_tflops("NVIDIA L40S")[0] == 362.0
    assert trainreport.peak_bf16_tflops("NVIDIA L40")[0] == 181.05
    assert trainreport.peak_bf16_tflops("NVIDIA L4")[0] == 121.0
    assert trainreport.peak_bf16_tflops("NVIDIA A10")[0] == 125.0
    assert trainreport.peak_bf16_tflops("NVIDIA H100 NVL")[0] == 835.0
    assert trainreport.peak_bf16_tflops("NVIDIA GH200 480GB")[0] == 989.0
    assert trainreport.peak_bf16_tflops("NVIDIA A100 80GB PCIe")[0] == 312.0
    # not in the table: an A10G is not an A10, so its measured ceiling is used
    value, source = trainreport.peak_bf16_tflops("NVIDIA A10G", {"matmul_tflops": {"bf16": 70.0}})
    assert value == 70.0 and "measured" in source
    value, source = trainreport.peak_bf16_tflops("CPU", {"matmul_tflops": {"fp32": 0.1}})
    assert value == 0.1 and "fp32" in source
    value, source = trainreport.peak_bf16_tflops("Some GPU", {"matmul_tflops": {"bf16": 500.0}})
    assert value == 500.0 and "measured" in source
    with pytest.raises(ValueError):
        trainreport.peak_bf16_tflops("Some GPU", {})
    cfg = gpt.GPT2_SMALL
    # 568_138_752 FLOP/token at 1e6 tokens/s on a 989 TFLOP/s peak
    assert trainreport.mfu(1e6, cfg, 989.0) == pytest.approx(568_138_752e6 / 989e12)


def _fake_table(step_2: float, step_3: float) -> pd.DataFrame:
    rows = [("1", "FP32", 300.0), ("2", "Apex", step_2), ("3", "Native", step_3)]
    table = pd.DataFrame([{"path": p, "label": lab, "status": "ran", "step_ms": ms,
                           "mfu": 0.1, "speedup_vs_fp32": 300.0 / ms} for p, lab, ms in rows])
    return table


def test_verdict_follows_the_numbers():
    slower = trainreport.verdict(_fake_table(50.0, 40.0))
    assert "Path 2 (50 ms) is 1.25x slower than path 3 (40 ms)" in slower
    assert "are not faster than PyTorch's own" in slower
    faster = trainreport.verdict(_fake_table(30.0, 40.0))
    assert "is 1.33x faster than path 3" in faster and "are faster than PyTorch's own" in faster
    level = trainreport.verdict(_fake_table(40.5, 40.0))
    assert "indistinguishable on this run (within 3%)" in level and "not faster" in level
    assert "fastest path was 2 (Apex) at 30.0 ms per step, 10.0% MFU, 10.00x the FP32" in faster


def test_verdict_calls_overlapping_iqrs_a_tie():
    table = _fake_table(48.0, 42.0)
    table["step_ms_q1"], table["step_ms_q3"] = [299.0, 40.0, 38.0], [301.0, 50.0, 47.0]
    assert "indistinguishable on this run (IQRs overlap)" in trainreport.verdict(table)
    table["step_ms_q1"], table["step_ms_q3"] = [299.0, 47.5, 41.5], [301.0, 48.5, 42.5]
    assert "is 1.14x slower than path 3" in trainreport.verdict(table)


def test_verdict_names_paths_tied_with_the_fastest():
    table = _fake_table(40.5, 40.0)
    assert "fastest path was 3 (Native)" in trainreport.verdict(table)
    assert "Path 2 cannot be told apart from it" in trainreport.verdict(table)


def test_verdict_reports_the_peak_memory_of_paths_2_and_3():
    table = _fake_table(50.0, 40.0)
    table["peak_mem_gib"] = [19.7, 10.8, 12.0]
    assert "Peak memory: path 2 10.80 GiB, path 3 12.00 GiB (1.20 GiB less for path 2)." in \
        trainreport.verdict(table)
    table["peak_mem_gib"] = float("nan")  # the CPU measures none: no memory sentence
    assert "Peak memory" not in trainreport.verdict(table)


def test_verdict_without_the_fp32_baseline_or_any_path():
    table = _fake_table(50.0, 40.0)
    table.loc[0, "status"] = "Path 1 skipped: ..."
    table["speedup_vs_fp32"] = float("nan")
    text = trainreport.verdict(table)
    assert "nan" not in text and "baseline" not in text and "fastest path was 3" in text
    table["status"] = "skipped"
    assert trainreport.verdict(table) == "No path ran, so there is nothing to compare."


def test_summary_lists_what_ran_and_omits_what_it_cannot_compute():
    table = _fake_table(50.0, 40.0)
    table["tokens_per_s"], table["final_val_loss"] = 1000.0, [2.0, 2.02, 2.01]
    table = pd.concat([table, pd.DataFrame([{
        "path": "4", "label": "Compiled", "status": "ran", "step_ms": 30.0, "mfu": 0.2,
        "speedup_vs_fp32": 10.0, "tokens_per_s": 1000.0, "final_val_loss": 2.0,
        "compile_s": 20.0}])], ignore_index=True)
    text = trainreport.summary(table, where="GPU X", tokens_per_step=64, steps=10)
    assert text.startswith("On this run (GPU X, 64 tokens per step, 10 steps per path):")
    assert "- path 1 (FP32): 300.0 ms/step, 1,000 tokens/s, MFU 10.0%, val loss 2.000" in text
    assert "- path 2 (Apex): 50.0 ms/step, 1,000 tokens/s, MFU 10.0%, 6.00x path 1" in text
    assert "torch.compile took 20.0 s, paid back after 2000 steps" in text
    assert text.endswith("- fastest: path 4; validation losses differ by 1.00%")
    table.loc[0, "status"] = "Path 1 skipped: ..."
    table["speedup_vs_fp32"] = float("nan")
    text = trainreport.summary(table, where="GPU X", tokens_per_step=64, steps=10)
    assert "nan" not in text and "x path 1" not in text
    table["status"] = "skipped"
    assert "No path ran" in trainreport.summary(table, where="CPU", tokens_per_step=64, steps=10)


def test_targets_mark_each_goal_from_the_numbers():
    table = pd.DataFrame([
        {"path": "1", "status": "ran", "mfu": 0.05, "step_ms": 500.0, "final_val_loss": 2.00},
        {"path": "2", "status": "ran", "mfu": 0.40, "step_ms": 90.0, "final_val_loss": 2.03},
        {"path": "3", "status": "ran", "mfu": 0.46, "step_ms": 80.0, "final_val_loss": 2.01},
    ])
    table["speedup_vs_fp32"] = 500.0 / table["step_ms"]
    lines = trainreport.targets(table).splitlines()
    assert lines[0].startswith("fastest path >= 45% MFU: met (best 46.0%)")
    assert "path 2 >= 5x path 1: met (5.56x)" in lines[1]
    assert "path 2 at most 10% slower than path 3: MISSED (step-time ratio 1.125)" in lines[2]
    assert lines[3].endswith("met (spread 1.50%)")
    table.loc[1, "final_val_loss"] = 2.10
    assert trainreport.targets(table).splitlines()[3].endswith("MISSED (spread 5.00%)")
    assert "not evaluated" in trainreport.targets(table, applies=False)
    table.loc[1, "step_ms"] = 60.0  # faster than path 3 by any margin still meets it
    assert "path 2 at most 10% slower than path 3: met (step-time ratio 0.750)" in \
        trainreport.targets(table).splitlines()[2]


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
    row.update({f"{k}_ms": 4.0 for k in breakdown.NAMES if k not in ("matmul", "attention")})
    row.update(matmul_ms=25.0, attention_ms=5.0)
    text = trainreport.mfu_limits(pd.DataFrame([row]), table, cfg, tokens, 989.0, 780.0)
    mm_rate = (fpt - att) * tokens / 25e-3 / 1e12
    assert f"at {mm_rate:.0f} TFLOP/s, {mm_rate / 780:.0%} of the measured" in text
    assert "path 4 (compiled" in text and "20.0 ms (40%)" in text and "idle GPU" in text
    bound = fpt * tokens / 30e-3 / 1e12 / 989
    assert f"would reach {bound:.0%} MFU" in text
    assert "not measured" in trainreport.mfu_limits(pd.DataFrame(), table, cfg, tokens, 989.0)
