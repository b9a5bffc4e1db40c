"""The course's GPT built on the meta device (shapes only), then allocated with ``to_empty``
and initialised with ``reset_parameters``, as FSDP2's tutorial builds a model: ``to_empty``
unties the head from the token embedding and ``tie_weights`` ties them again; every weight is
re-initialised (none left as ``to_empty``'s garbage), and the weights equal those of a model
built on the device and re-initialised from the same seed."""

from __future__ import annotations

import torch

from helpers import gpt


def test_a_meta_built_gpt_initialises_like_one_built_on_the_device():
    cfg = gpt.TINY
    with torch.device("meta"):
        meta = gpt.GPT(cfg)
    assert all(p.is_meta for p in meta.parameters())
    meta.to_empty(device="cpu")  # allocated, uninitialised
    assert meta.head.weight is not meta.wte.weight  # to_empty untied them ...
    meta.tie_weights()
    assert meta.head.weight is meta.wte.weight  # ... and they share one matrix again
    torch.manual_seed(3)
    meta.reset_parameters()
    reference = gpt.GPT(cfg)
    torch.manual_seed(3)
    reference.reset_parameters()
    ours, theirs = dict(meta.named_parameters()), dict(reference.named_parameters())
    assert ours.keys() == theirs.keys()
    for name, p in ours.items():
        assert torch.equal(p, theirs[name]), name
    x = torch.randint(0, cfg.vocab, (2, cfg.seq_len))
    torch.testing.assert_close(meta(x, x), reference(x, x))


def test_reset_parameters_leaves_nothing_uninitialised():
    """Every tensor after to_empty is overwritten: the same model filled with NaN first ends
    finite, with the norms at 1 and the biases at 0."""
    with torch.device("meta"):
        model = gpt.GPT(gpt.TINY)
    model.to_empty(device="cpu")
    model.tie_weights()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    model.reset_parameters()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert torch.equal(model.ln_f.weight, torch.ones_like(model.ln_f.weight))
    bias = model.blocks[0].attn.qkv.bias
    assert torch.equal(bias, torch.zeros_like(bias))
