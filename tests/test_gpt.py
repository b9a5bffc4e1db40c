"""The notebook-05 model: shapes, causality, attention equivalence, size and FLOP formulas."""

import pytest
import torch

from helpers import gpt


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


def test_score_matrix_size():
    # 32 x 12 x 1024 x 1024 float32 values: 1.61 GB per layer at GPT-2 small's shape
    assert gpt.score_matrix_bytes(gpt.GPT2_SMALL, 32) == 1_610_612_736
    assert gpt.score_matrix_bytes(_tiny(), 3, bytes_per_element=2) == 3 * 4 * 16 * 16 * 2


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
