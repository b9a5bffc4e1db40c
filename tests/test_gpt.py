"""The GPT notebooks 05-07 share: the model (shapes, causality, attention, size and FLOP
formulas), the byte corpus and batch plan, the recipe and the full batch, running a path with its
failures as one line, and the tables of runs (paths, start). Notebook 05's own readings are
tested in tests/test_end_to_end.py."""

import dataclasses
import math

import pytest
import torch

from helpers import bench, ceilings, errors, gpt, kernels, machine, run_profile

CPU = torch.device("cpu")


# ------------------------------------------------------------------ the model
def _tiny(**kw) -> gpt.GPTConfig:
    return gpt.GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=256, **kw)


def test_forward_shapes_and_loss():
    torch.manual_seed(0)
    cfg = _tiny()
    model = gpt.GPT(cfg)
    idx = torch.randint(0, cfg.vocab, (3, cfg.seq_len))
    logits = model(idx)
    assert logits.shape == (3, cfg.seq_len, cfg.padded_vocab)
    loss = model(idx, torch.randint(0, cfg.vocab, (3, cfg.seq_len)))
    assert loss.dim() == 0 and torch.isfinite(loss)
    # freshly initialised: close to uniform over the 256 bytes, ln(256) = 5.55 nats
    assert abs(loss.item() - torch.log(torch.tensor(256.0)).item()) < 0.3


def test_vocab_padding():
    assert gpt.pad_vocab(256) == 256
    assert gpt.pad_vocab(257) == 320
    assert gpt.pad_vocab(50257) == 50304


@pytest.mark.parametrize("attention", ["manual", "sdpa"])
def test_causal_masking(attention):
    torch.manual_seed(0)
    cfg = _tiny()
    model = gpt.GPT(cfg, attention=attention)
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq_len))
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % cfg.vocab  # alter only the future of position 9
    with torch.no_grad():
        a, b = model(idx), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert (a[:, 10:] - b[:, 10:]).abs().max() > 1e-4  # and the future does see the change


def test_manual_attention_matches_sdpa():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 33, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(gpt.manual_attention(q, k, v), gpt.sdpa_attention(q, k, v),
                               rtol=1e-10, atol=1e-10)


def test_models_with_either_attention_agree():
    torch.manual_seed(0)
    cfg = _tiny()
    manual = gpt.GPT(cfg, attention="manual")
    fused = gpt.GPT(cfg, attention="sdpa")
    fused.load_state_dict(manual.state_dict())
    idx = torch.randint(0, cfg.vocab, (2, cfg.seq_len))
    with torch.no_grad():
        torch.testing.assert_close(manual(idx), fused(idx), rtol=1e-4, atol=1e-5)


def test_head_is_tied_to_embedding():
    model = gpt.GPT(_tiny())
    assert model.head.weight is model.wte.weight


@pytest.mark.parametrize("cfg", [_tiny(), gpt.TINY, gpt.GPTConfig(n_layer=3, d_model=48,
                                                                   n_head=3, seq_len=8)])
def test_parameter_count_formula(cfg):
    model = gpt.GPT(cfg)
    assert gpt.count_params(model) == gpt.non_embedding_params(cfg) + gpt.embedding_params(cfg)


def test_gpt2_small_counts_and_flops():
    cfg = gpt.GPT2_SMALL
    # 12 * (12 * 768^2 + 13 * 768) + 2 * 768, worked by hand
    assert gpt.non_embedding_params(cfg) == 85_056_000
    # 6 * (85_056_000 + 768 * 256) + 6 * 12 * 768 * 1024
    assert gpt.flops_per_token(cfg) == 568_138_752
    assert gpt.flops_per_token(cfg, include_head=False) == 6 * 85_056_000 + 56_623_104


def test_gpt2_init_scales():
    torch.manual_seed(0)
    cfg = gpt.GPTConfig(n_layer=8, d_model=256, n_head=4, seq_len=32)
    model = gpt.GPT(cfg)
    std = model.blocks[0].mlp.fc.weight.std().item()
    resid = model.blocks[0].mlp.proj.weight.std().item()
    assert abs(std - 0.02) < 0.002
    assert abs(resid - 0.02 / (2 * cfg.n_layer) ** 0.5) < 0.001
    assert torch.all(model.blocks[0].ln1.weight == 1)
    assert torch.all(model.blocks[0].attn.qkv.bias == 0)


def test_injected_norm_is_used():
    calls = []

    class CountingNorm(torch.nn.LayerNorm):
        def forward(self, x):
            calls.append(1)
            return super().forward(x)

    cfg = _tiny()
    model = gpt.GPT(cfg, norm=CountingNorm)
    model(torch.zeros(1, cfg.seq_len, dtype=torch.long))
    assert len(calls) == 2 * cfg.n_layer + 1


@pytest.fixture(scope="module")
def small():
    return gpt.load_corpus(cap_mb=0.5)


# ------------------------------------------------------------------ the corpus
def test_corpus_is_deterministic(small):
    again = gpt.load_corpus(cap_mb=0.5)
    assert torch.equal(small.train, again.train) and torch.equal(small.val, again.val)
    assert small.train_files == again.train_files


def test_splits_are_disjoint_and_cover_the_files(small):
    assert not set(small.train_files) & set(small.val_files)
    assert len(small.val_files) >= 1 and len(small.train_files) > 10 * len(small.val_files)
    files = gpt.source_files(cap_bytes=int(0.5 * 2**20))
    rel = {str(p.relative_to(gpt.stdlib_root())) for p in files}
    assert rel == set(small.train_files) | set(small.val_files)


def test_files_are_sorted_and_exclude_installed_packages():
    files = gpt.source_files(cap_bytes=2**20)
    assert files == sorted(files)
    root = gpt.stdlib_root()
    for path in files:
        assert not gpt.EXCLUDED_DIRS.intersection(path.relative_to(root).parts)


def test_cap_is_respected(small):
    total = small.train.numel() + small.val.numel()
    assert total <= 0.5 * 2**20 + len(small.train_files) + len(small.val_files)
    assert small.train.dtype == torch.uint8


def test_same_seed_same_batches(small):
    a = gpt.BatchPlan.draw(small.train, steps=5, batch=4, seq_len=32, seed=7)
    b = gpt.BatchPlan.draw(small.train, steps=5, batch=4, seq_len=32, seed=7)
    c = gpt.BatchPlan.draw(small.train, steps=5, batch=4, seq_len=32, seed=8)
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    for step in range(a.steps):
        for ta, tb in zip(a.batch(step), b.batch(step), strict=True):
            assert torch.equal(ta, tb)


def test_batch_targets_are_next_bytes(small):
    plan = gpt.BatchPlan.draw(small.train, steps=2, batch=3, seq_len=16, seed=0)
    x, y = plan.batch(1)
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    start = int(plan.offsets[1, 0])
    assert torch.equal(x[0], small.train[start:start + 16].long())


def test_checksum_is_order_sensitive():
    x = torch.arange(12).view(3, 4)
    assert gpt.token_checksum(x) != gpt.token_checksum(x.flip(0))
    # token k weighted by k + 1: sum of k (k + 1) for k < 12 = 506 + 66, worked by hand
    assert int(gpt.token_checksum(x)) == 572
    swapped = x.clone()
    swapped[1, 2], swapped[1, 3] = x[1, 3], x[1, 2]  # two neighbouring tokens trade places
    assert gpt.token_checksum(swapped) != gpt.token_checksum(x)


def test_run_checksum_sees_two_batches_swapped(small):
    plan = gpt.BatchPlan.draw(small.train, steps=4, batch=2, seq_len=16, seed=0)
    batches = [plan.batch(i)[0] for i in range(plan.steps)]
    swapped = [batches[0], batches[2], batches[1], batches[3]]

    def run_total(xs):
        return sum(int(gpt.step_checksum(x, i)) for i, x in enumerate(xs))

    assert run_total(batches) != run_total(swapped)
    # a plain sum of batch checksums, as before, cannot tell the two orders apart
    assert sum(int(gpt.token_checksum(x)) for x in batches) == \
        sum(int(gpt.token_checksum(x)) for x in swapped)
    assert gpt.step_checksum(batches[1], 2).dtype == torch.int64


# ------------------------------------------------------------------ training a path on the CPU
def _train(data, *, steps=25, amp=None, swap=False, seed=0):
    """The notebook's step in miniature: same plan, same start, step-weighted checksum."""
    cfg = gpt.GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=32)
    torch.manual_seed(seed)
    model = gpt.GPT(cfg)
    plan = gpt.BatchPlan.draw(data.train, steps=steps, batch=4, seq_len=cfg.seq_len, seed=0)
    if swap:
        plan.offsets[[0, 1]] = plan.offsets[[1, 0]]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    checksum = torch.zeros((), dtype=torch.int64)

    def step(i):
        x, y = plan.batch(i)
        checksum.add_(gpt.step_checksum(x, i))
        with torch.autocast("cpu", dtype=amp, enabled=amp is not None):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # foreach norm: "optimizer"
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    run = bench.train(step, steps, device=CPU, warmup=2, label="cpu")
    return run, int(checksum), plan, step


@pytest.mark.slow
def test_fp32_and_bf16_runs_see_the_same_batches_and_learn(small):
    fp32, sum32, plan, _ = _train(small)
    bf16, sum16, _, _ = _train(small, amp=torch.bfloat16)
    expected = sum(int(gpt.token_checksum(plan.batch(i)[0])) * (i + 1) for i in range(25))
    assert sum32 == sum16 == expected
    assert fp32.learned and bf16.learned
    assert fp32.final_loss == pytest.approx(bf16.final_loss, rel=0.05)


def test_run_checksum_sees_the_order_of_batches(small):
    assert _train(small, steps=4)[1] != _train(small, steps=4, swap=True)[1]


def test_paths_table_keeps_a_row_for_every_path(small):
    run, checksum, _, _ = _train(small, steps=6)
    run.extra.update(tokens_per_step=128, checksum=checksum, val_loss=3.0)
    failed = bench.Run("P3", "cpu", error="out of GPU memory (...)")
    labels = {"1": "P1", "1b": "P1b", "3": "P3"}
    table = gpt.paths_table({"1": run, "3": failed}, labels, flops_per_token=1e6,
                            peak_tflops=1.0, baseline="1")
    assert list(table["path"]) == ["1", "1b", "3"]
    assert list(table["status"]) == ["ran", "not run on this machine",
                                     "FAILED: out of GPU memory (...)"]
    row = table.iloc[0]
    assert row["speedup_vs_fp32"] == 1.0 and row["batch_checksum"] == str(checksum)
    assert row["mfu"] == pytest.approx(1e6 * row["tokens_per_s"] / 1e12)
    assert row["final_train_loss"] == run.final_loss and row["final_val_loss"] == 3.0
    assert math.isnan(table.iloc[1]["step_ms"])
    # the speedup is over the baseline given; none given (or one that did not run): NaN
    slower = dataclasses.replace(run, label="P2", step_ms=[2 * t for t in run.step_ms])
    two = gpt.paths_table({"1": run, "2": slower}, {"1": "P1", "2": "P2"}, flops_per_token=1e6,
                          peak_tflops=1.0, baseline="2")
    assert list(two["speedup_vs_fp32"]) == pytest.approx([2.0, 1.0])
    for baseline in (None, "3"):
        assert gpt.paths_table({"1": run, "3": failed}, labels, flops_per_token=1e6,
                               peak_tflops=1.0, baseline=baseline)["speedup_vs_fp32"].isna().all()


# ------------------------------------------------------------------ failures as one line
def test_out_of_memory_becomes_one_line_in_the_run():
    def boom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB\nmore")

    run = gpt.attempt(boom, "P1", CPU)
    assert not run.ok and "\n" not in run.error and "smaller batch_size" in run.error
    assert run.status().startswith("FAILED: out of GPU memory")


def test_failing_torch_compile_becomes_one_line_with_the_fix():
    def no_compiler():
        raise RuntimeError("InductorError: no working C compiler found\n  long traceback ...")

    run = gpt.attempt(no_compiler, "P4", CPU, compile_fix="set run_compile = False")
    assert run.error == ("torch.compile failed (RuntimeError: InductorError: no working C "
                         "compiler found); set run_compile = False")


def test_other_errors_of_an_eager_path_still_raise():
    def broken():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        gpt.attempt(broken, "P1", CPU)


def test_compile_guard_is_the_one_that_is_used():
    assert issubclass(errors.CompileFailed, errors.CourseError)


# ------------------------------------------------------------------ kernels, peaks and MFU
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
    assert kernels.categorize(name) == category


def test_peak_lookup_and_mfu():
    assert ceilings.peak_tflops("NVIDIA H200")[0] == 989.0
    assert ceilings.peak_tflops("NVIDIA H100 80GB HBM3")[0] == 989.0
    assert ceilings.peak_tflops("NVIDIA H100 PCIe")[0] == 756.0
    assert ceilings.peak_tflops("NVIDIA A100-SXM4-80GB")[0] == 312.0
    assert ceilings.peak_tflops("NVIDIA L40S")[0] == 362.0
    assert ceilings.peak_tflops("NVIDIA L40")[0] == 181.05
    assert ceilings.peak_tflops("NVIDIA L4")[0] == 121.0
    assert ceilings.peak_tflops("NVIDIA A10")[0] == 125.0
    assert ceilings.peak_tflops("NVIDIA H100 NVL")[0] == 835.0
    assert ceilings.peak_tflops("NVIDIA GH200 480GB")[0] == 989.0
    assert ceilings.peak_tflops("NVIDIA A100 80GB PCIe")[0] == 312.0
    # not in the table: an A10G is not an A10, so its measured ceiling is used
    value, source = ceilings.peak_tflops("NVIDIA A10G", {"matmul_tflops": {"bf16": 70.0}})
    assert value == 70.0 and "measured" in source
    value, source = ceilings.peak_tflops("CPU", {"matmul_tflops": {"fp32": 0.1}})
    assert value == 0.1 and "fp32" in source
    value, source = ceilings.peak_tflops("Some GPU", {"matmul_tflops": {"bf16": 500.0}})
    assert value == 500.0 and "measured" in source
    with pytest.raises(ValueError):
        ceilings.peak_tflops("Some GPU", {})
    cfg = gpt.GPT2_SMALL
    # 568_138_752 FLOP/token at 1e6 tokens/s on a 989 TFLOP/s peak
    assert ceilings.mfu(gpt.flops_per_token(cfg), 1e6, 989.0) == \
        pytest.approx(568_138_752e6 / 989e12)


@pytest.mark.parametrize("usable, batch", [(139.8, 32), (24.0, 32), (15.0, 16), (14.7, 16),
                                           (11.0, 8), (None, 32)])
def test_the_full_batch_fits_the_gpu(usable, batch):
    got, why = gpt.full_batch(usable)
    assert got == batch and f"batch {batch} sequences" in why
    if usable is not None:  # the FP32 path's predicted peak fits with headroom
        assert gpt.PEAK_FIXED_GIB + gpt.PEAK_PER_SEQUENCE_GIB * got <= 0.85 * usable
        assert ("halved" in why) == (batch < gpt.FULL_BATCH)


def test_usable_gpu_memory_follows_the_per_process_fraction(monkeypatch):
    from types import SimpleNamespace

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert machine.usable_gpu_gib() is None  # no GPU: nothing to size by
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda _i: SimpleNamespace(total_memory=140 * 2**30))
    monkeypatch.setattr(torch.cuda, "get_per_process_memory_fraction", lambda *_: 15 / 140,
                        raising=False)
    assert machine.usable_gpu_gib() == pytest.approx(15.0)
    assert gpt.full_batch(machine.usable_gpu_gib())[0] == 16  # a 15 GiB cap halves the batch


def test_the_recipe_is_the_measured_one_and_warms_up_over_three_quarters():
    recipe = gpt.Recipe.scaled(80)
    assert (recipe.lr, recipe.warmup, recipe.steps) == (gpt.PEAK_LR, 60, 80)
    assert recipe.lr_at(0) == pytest.approx(gpt.PEAK_LR / 60)
    assert recipe.lr_at(59) == gpt.PEAK_LR and recipe.lr_at(80) == pytest.approx(gpt.PEAK_LR / 10)
    assert all(recipe.lr_at(i) >= recipe.lr_at(i + 1) for i in range(59, 90))  # decays, then flat
    assert gpt.Recipe.scaled(30).warmup == 22
    with pytest.raises(ValueError, match="warm-up"):
        gpt.Recipe(steps=10, warmup=10)
    model = gpt.GPT(gpt.TINY)
    decay, no_decay = recipe.param_groups(model)
    assert all(p.dim() >= 2 for p in decay["params"]) and no_decay["weight_decay"] == 0.0
    assert sum(p.numel() for p in decay["params"] + no_decay["params"]) == gpt.count_params(model)


def test_the_05_recipe_cell_matches_the_recipe_06_and_07_import():
    """05 writes lr_at out; its cell asserts it equals gpt.Recipe - and that assertion is real."""
    import nbformat

    nb = nbformat.read(gpt.Path(__file__).resolve().parents[1] / "notebooks" /
                       "05_end_to_end_transformer.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if "def lr_at(i):" in c.source)
    assert "recipe = gpt.Recipe(steps=steps, lr=lr, warmup=lr_warmup)" in cell
    namespace = {"math": math, "gpt": gpt, "profile": run_profile.resolve("smoke"), "steps": 24,
                 "lr": None}
    exec(cell, namespace)  # noqa: S102 - the notebook's own cell, as the notebook runs it
    broken = cell.replace("0.1 + 0.45", "0.2 + 0.4")  # a schedule that drifted from the recipe
    with pytest.raises(AssertionError):
        exec(broken, dict(namespace, lr=None))  # noqa: S102


def test_an_unhealthy_start_is_flagged_and_a_healthy_one_is_not():
    healthy = bench.Run("ok", "cpu", losses=[5.6, 4.6, 4.3, 3.8], extra={"grad_norms": [60.0] * 4})
    spiky = bench.Run("spike", "cpu", losses=[5.63, 4.6, 7.47, 5.0])
    assert gpt.unhealthy_start({"1": healthy}) == ""
    flag = gpt.unhealthy_start({"1": healthy, "2": spiky})
    assert flag.startswith("CHECK: unhealthy start")
    assert "2 (step 2: 7.470 > step 0's 5.630)" in flag
    table = gpt.start_table({"1": healthy, "2": spiky}, first=3)
    assert table.loc["1", "step 0"] == "5.60 (60.0)" and table.loc["2", "step 2"] == "7.47"
