"""What notebooks 05-07 share: the GPT, its corpus, recipe, full batch, failures and tables."""

import math
from unittest.mock import Mock

import pytest
import torch

from helpers import bench, ceilings, gpt, kernels, run_profile

CPU = torch.device("cpu")
SMALL = gpt.GPTConfig(n_layer=2, d_model=32, n_head=4, seq_len=16, vocab=256)


def test_forward_shapes_loss_and_norms_and_either_attention_is_causal_and_both_agree():
    torch.manual_seed(0)
    calls = []

    def counting(d: int) -> torch.nn.LayerNorm:  # an injected norm, counting its calls
        norm = torch.nn.LayerNorm(d)
        norm.register_forward_hook(lambda *_: calls.append(1))
        return norm

    manual, fused = gpt.GPT(SMALL, attention="manual", norm=counting), gpt.GPT(SMALL)  # sdpa
    fused.load_state_dict(manual.state_dict())
    idx = torch.randint(0, SMALL.vocab, (2, SMALL.seq_len))
    assert manual(idx).shape == (2, SMALL.seq_len, SMALL.padded_vocab)
    assert len(calls) == 2 * SMALL.n_layer + 1
    loss = manual(idx, torch.randint(0, SMALL.vocab, (2, SMALL.seq_len)))
    assert loss.dim() == 0 and abs(loss.item() - math.log(256)) < 0.3  # near uniform
    assert [gpt.pad_vocab(v) for v in (256, 257, 50257)] == [256, 320, 50304]
    changed = idx.clone()
    changed[:, 10:] = (changed[:, 10:] + 1) % SMALL.vocab  # alter only the future of position 9
    with torch.no_grad():
        torch.testing.assert_close(manual(idx), fused(idx), rtol=1e-4, atol=1e-5)
        for model in (manual, fused):
            a, b = model(idx), model(changed)
            torch.testing.assert_close(a[:, :10], b[:, :10])
            assert (a[:, 10:] - b[:, 10:]).abs().max() > 1e-4  # the future sees the change


def test_parameter_counts_and_flops():
    small = gpt.GPTConfig(n_layer=3, d_model=48, n_head=3, seq_len=8)
    assert gpt.count_params(gpt.GPT(small)) == (gpt.non_embedding_params(small)
                                                + gpt.embedding_params(small))
    cfg = gpt.GPT2_SMALL
    assert gpt.non_embedding_params(cfg) == 85_056_000  # 12 * (12 * 768^2 + 13 * 768) + 2 * 768
    assert gpt.flops_per_token(cfg) == 568_138_752  # 6 (N + 768 * 256) + 6 * 12 * 768 * 1024
    assert gpt.flops_per_token(cfg, include_head=False) == 6 * 85_056_000 + 56_623_104


def test_a_meta_built_gpt_initialises_every_weight_like_one_built_on_the_device():
    with torch.device("meta"):
        meta = gpt.GPT(gpt.TINY)
    meta.to_empty(device="cpu")  # allocated, uninitialised, and the head untied
    assert meta.head.weight is not meta.wte.weight
    meta.tie_weights()
    assert meta.head.weight is meta.wte.weight
    with torch.no_grad():  # NaN everywhere: reset_parameters must overwrite every tensor
        for p in meta.parameters():
            p.fill_(float("nan"))
    reference = gpt.GPT(gpt.TINY)
    for model in (meta, reference):
        torch.manual_seed(3)
        model.reset_parameters()
    theirs = dict(reference.named_parameters())
    assert [n for n, p in meta.named_parameters() if not torch.equal(p, theirs[n])] == []


@pytest.fixture(scope="module")
def small():
    return gpt.load_corpus(cap_mb=0.5)


def test_corpus_is_sorted_capped_and_split_by_file(small):
    assert not set(small.train_files) & set(small.val_files)
    assert len(small.train_files) > 10 * len(small.val_files) >= 10
    files, root = gpt.source_files(cap_bytes=int(0.5 * 2**20)), gpt.stdlib_root()
    rel = [str(p.relative_to(root)) for p in files]
    assert files == sorted(files) and set(rel) == set(small.train_files) | set(small.val_files)
    assert not any(gpt.EXCLUDED_DIRS.intersection(p.relative_to(root).parts) for p in files)
    total = small.train.numel() + small.val.numel()
    assert total <= 0.5 * 2**20 + len(rel) and small.train.dtype == torch.uint8


def test_same_seed_same_batches_targets_are_next_bytes_and_checksums_see_swaps(small):
    a, b, c = (gpt.BatchPlan.draw(small.train, steps=5, batch=3, seq_len=16, seed=s)
               for s in (7, 7, 8))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()
    assert all(torch.equal(a.batch(i)[0], b.batch(i)[0]) for i in range(5))
    x, y = a.batch(1)
    assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    start = int(a.offsets[1, 0])
    assert torch.equal(x[0], small.train[start:start + 16].long())
    x = torch.arange(12).view(3, 4)
    assert int(gpt.token_checksum(x)) == 572  # sum of k (k + 1) for k < 12, by hand
    swapped = x.clone()
    swapped[1, 2], swapped[1, 3] = x[1, 3], x[1, 2]  # two neighbouring tokens trade places
    assert gpt.token_checksum(swapped) != gpt.token_checksum(x)
    plan = gpt.BatchPlan.draw(small.train, steps=4, batch=2, seq_len=16, seed=0)
    batches = [plan.batch(i)[0] for i in range(plan.steps)]
    order = [batches[0], batches[2], batches[1], batches[3]]
    total = [sum(int(gpt.step_checksum(x, i)) for i, x in enumerate(xs))
             for xs in (batches, order)]
    assert total[0] != total[1]  # a plain sum of batch checksums would not see the swap
    assert gpt.step_checksum(batches[1], 2).dtype == torch.int64


def test_paths_table_keeps_a_row_for_every_path_and_an_unhealthy_start_is_flagged():
    run = bench.Run("P1", "cpu", losses=[5.0, 4.0, 3.0, 2.5], step_ms=[10.0] * 4, warmup=1,
                    extra={"tokens_per_step": 128, "checksum": 42, "val_loss": 3.0})
    failed = bench.Run("P3", "cpu", error="out of GPU memory (...)")
    slower = bench.Run("P2", "cpu", losses=run.losses, step_ms=[20.0] * 4, warmup=1,
                       extra=run.extra)
    labels = {"1": "P1", "1b": "P1b", "2": "P2", "3": "P3"}
    runs = {"1": run, "2": slower, "3": failed}
    table = gpt.paths_table(runs, labels, flops_per_token=1e6, peak_tflops=1.0, baseline="2")
    assert list(table["status"]) == ["ran", "not run on this machine", "ran",
                                     "FAILED: out of GPU memory (...)"]
    row = table.iloc[0]
    assert row["batch_checksum"] == "42" and row["final_val_loss"] == 3.0
    assert row["mfu"] == pytest.approx(1e6 * row["tokens_per_s"] / 1e12)
    assert list(table["speedup_vs_fp32"])[::2] == pytest.approx([2.0, 1.0])
    table = gpt.paths_table(runs, labels, flops_per_token=1e6, peak_tflops=1.0, baseline="3")
    assert table["speedup_vs_fp32"].isna().all()  # a baseline that did not run: NaN
    healthy = bench.Run("ok", "cpu", losses=[5.6, 4.6, 4.3, 3.8], extra={"grad_norms": [60.0] * 4})
    spiky = bench.Run("spike", "cpu", losses=[5.63, 4.6, 7.47, 5.0])
    assert gpt.unhealthy_start({"1": healthy}) == ""
    flag = gpt.unhealthy_start({"1": healthy, "2": spiky})
    assert flag.startswith("CHECK: unhealthy start")
    assert "2 (step 2: 7.470 > step 0's 5.630)" in flag
    table = gpt.start_table({"1": healthy, "2": spiky}, first=3)
    assert table.loc["1", "step 0"] == "5.60 (60.0)" and table.loc["2", "step 2"] == "7.47"


def test_out_of_memory_and_a_failing_compile_become_one_line_and_a_bug_still_raises():
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB\nmore")
    run = gpt.attempt(Mock(side_effect=oom), "P1", CPU)
    assert not run.ok and "\n" not in run.error and "smaller batch_size" in run.error
    assert run.status().startswith("FAILED: out of GPU memory")
    inductor = RuntimeError("InductorError: no working C compiler found\n  long traceback ...")
    run = gpt.attempt(Mock(side_effect=inductor), "P4", CPU, compile_fix="set run_compile = False")
    assert run.error == ("torch.compile failed (RuntimeError: InductorError: no working C "
                         "compiler found); set run_compile = False")
    with pytest.raises(RuntimeError, match="a bug"):
        gpt.attempt(Mock(side_effect=RuntimeError("a bug")), "P1", CPU)


def test_kernel_categories_and_the_peak_lookup_tells_similar_names_apart():
    cases = {"sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "matmul",
             "pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64>>": "attention",
             "triton_per_fused_add_native_layer_norm_3": "norm",
             "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float>>":
                 "optimizer",
             "triton_poi_fused_gelu_5": "elementwise", "aten::addmm": "matmul",
             "aten::embedding_dense_backward": "other"}
    assert {name: kernels.categorize(name) for name in cases} == cases
    table = {"NVIDIA H100 80GB HBM3": 989.0, "NVIDIA H100 PCIe": 756.0, "NVIDIA L40S": 362.0,
             "NVIDIA L40": 181.05, "NVIDIA L4": 121.0, "NVIDIA A10": 125.0,
             "NVIDIA H200": 989.0, "NVIDIA H200 NVL": 835.0}
    assert {name: ceilings.peak_tflops(name)[0] for name in table} == table
    a10g = ceilings.peak_tflops("NVIDIA A10G", {"matmul_tflops": {"bf16": 70.0}})
    assert a10g[0] == 70.0 and "measured bf16" in a10g[1]  # an A10G is not an A10
    assert ceilings.peak_tflops("CPU", {"matmul_tflops": {"fp32": 0.1}})[0] == 0.1
    with pytest.raises(ValueError):
        ceilings.peak_tflops("mystery")


@pytest.mark.parametrize("usable, batch", [(139.8, 32), (15.0, 16), (14.7, 16), (11.0, 8),
                                           (None, 32)])
def test_the_full_batch_fits_the_gpu(usable, batch):
    got, why = gpt.full_batch(usable)
    assert got == batch and f"batch {batch} sequences" in why
    if usable is not None:  # the FP32 path's predicted peak fits with headroom
        assert gpt.PEAK_FIXED_GIB + gpt.PEAK_PER_SEQUENCE_GIB * got <= 0.85 * usable
        assert ("halved" in why) == (batch < gpt.FULL_BATCH)


def test_the_recipe_is_the_measured_one_warms_up_over_three_quarters_and_05_writes_it_out():
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
    import nbformat  # 05 writes lr_at out; its cell's assertion that it is gpt.Recipe is real

    nb = nbformat.read(gpt.Path(__file__).resolve().parents[1] / "notebooks" /
                       "05_end_to_end_transformer.ipynb", as_version=4)
    cell = next(c.source for c in nb.cells if "def lr_at(i):" in c.source)
    assert "recipe = gpt.Recipe(steps=steps, lr=lr, warmup=lr_warmup)" in cell
    namespace = {"math": math, "gpt": gpt, "profile": run_profile.resolve("smoke"), "steps": 24,
                 "lr": None}
    exec(cell, namespace)  # noqa: S102 - the notebook's own cell, as the notebook runs it
    broken = cell.replace("0.1 + 0.45", "0.2 + 0.4")  # a schedule that drifted from the recipe
    assert broken != cell
    with pytest.raises(AssertionError):
        exec(broken, dict(namespace, lr=None))  # noqa: S102
