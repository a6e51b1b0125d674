"""Attention sinks (:mod:`fmha.sinks`): every variant, split decoding, packed sequences and the paged cache
against the float64 reference; rows that see no key; gradients, the sinks' own included; gpt-oss in
transformers against its eager attention."""
import pytest
import torch

import fmha
from conftest import DEVICE, check_against_reference, make_qkv, nan_like, packed
from fmha import reference
from fmha.verify import check_grads, check_lse, check_sinks_grad, greedy_partings

SINKS = [0.5, -3.0, 6.0, 0.0]  # one head's sink well above its scores, one well below


def sinks_for(heads):
    return torch.tensor((SINKS * heads)[:heads], dtype=torch.float32, device=DEVICE)


@pytest.mark.parametrize("variant", ["auto", "singlewave", "pipelined", "tiled"])
@pytest.mark.parametrize("causal,align,window", [(False, "top_left", (-1, -1)), (True, "bottom_right", (-1, -1)),
                                                 (True, "top_left", (7, 0))])
def test_sinks_match_the_reference(variant, causal, align, window):
    q, k, v = make_qkv(2, 4, 2, 33, 29, 64, torch.bfloat16, "bshd", seed=3)
    sinks = sinks_for(4)
    out = nan_like(q)
    _, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout="bshd", variant=variant, out=out,
                            window=window, sinks=sinks, return_lse=True)
    check_against_reference(out, q, k, v, causal, align, "bshd", lse=lse, window=window, sinks=sinks)


def test_a_row_that_sees_no_key_returns_zero_and_the_sink():
    q, k, v = make_qkv(1, 4, 4, 20, 8, 32, torch.float16, seed=4)
    sinks = sinks_for(4)
    o, lse = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", sinks=sinks, return_lse=True)
    assert not o[:, :, :12].any()  # rows 0..11 see no key
    torch.testing.assert_close(lse[:, :, :12], sinks[None, :, None].expand(1, 4, 12))


def test_split_decoding_counts_the_sink_once():
    q, k, v = make_qkv(2, 8, 2, 1, 300, 64, torch.bfloat16, seed=5)
    sinks = sinks_for(8)
    o, lse = fmha.attention(q, k, v, num_splits=3, sinks=sinks, return_lse=True)
    check_against_reference(o, q, k, v, False, lse=lse, sinks=sinks)


def test_packed_sequences_and_the_paged_cache_take_sinks():
    lens_q, lens_k = [5, 17], [9, 30]
    q, cu_q = packed(lens_q, 4, 32, torch.float16, 6)
    k, cu_k = packed(lens_k, 2, 32, torch.float16, 7)
    v, _ = packed(lens_k, 2, 32, torch.float16, 8)
    sinks = sinks_for(4)
    o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, 17, 30, causal=True, sinks=sinks, return_lse=True)
    for b in range(2):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        check_against_reference(o[rq][None], q[rq][None], k[rk][None], v[rk][None], True, "bottom_right", "bshd",
                                sinks=sinks)
        _, ref_lse = reference.dense_attention(q[rq][None].transpose(1, 2), k[rk][None].transpose(1, 2),
                                               v[rk][None].transpose(1, 2), causal=True, causal_align="bottom_right",
                                               return_lse=True, sinks=sinks)
        check_lse(lse[:, rq][None], ref_lse)
    pool = torch.randn(4, 16, 2, 32, dtype=torch.float16, device=DEVICE)
    table = torch.tensor([[2, 0], [1, 3]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([20, 32], dtype=torch.int32, device=DEVICE)
    qd = torch.randn(2, 4, 1, 32, dtype=torch.float16, device=DEVICE)
    od = fmha.attention_paged(qd, pool, pool, table, lens, sinks=sinks)
    for b in range(2):
        kv = pool[table[b].long()].reshape(1, 32, 2, 32)[:, :int(lens[b])].transpose(1, 2)
        check_against_reference(od[b:b + 1], qd[b:b + 1], kv, kv, False, sinks=sinks)


def test_sink_gradients():
    q, k, v = (t.requires_grad_(True) for t in make_qkv(1, 4, 2, 21, 26, 32, torch.bfloat16, seed=9))
    sinks = sinks_for(4).requires_grad_(True)
    o = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", sinks=sinks)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(1)).to(o)
    o.backward(do)
    check_grads((q.grad, k.grad, v.grad), q, k, v, do, True, "bottom_right", sinks=sinks.detach())
    check_sinks_grad(sinks.grad, q, k, v, do, True, "bottom_right", o=o, sinks=sinks)


def test_sinks_are_checked():
    q, k, v = make_qkv(1, 4, 2, 8, 8, 32, torch.float16)
    for bad in (torch.zeros(3, device=DEVICE), torch.zeros(4, dtype=torch.float16, device=DEVICE), [0.0] * 4):
        with pytest.raises(ValueError, match=r"sinks must be a float32 tensor of shape \(4,\)"):
            fmha.attention(q, k, v, sinks=bad)


def _gpt_oss():
    """A small gpt-oss (sinks in every layer, sliding and full layers alternating), with its eager attention and
    with fmha, the same random weights (sinks of some weight)."""
    transformers = pytest.importorskip("transformers")
    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    cfg = transformers.GptOssConfig(vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=2,
                                    num_experts_per_tok=1, sliding_window=8, max_position_embeddings=64)
    torch.manual_seed(0)
    models = {impl: transformers.GptOssForCausalLM._from_config(cfg, attn_implementation=impl,
                                                                dtype=torch.bfloat16).to(DEVICE)
              for impl in ("eager", "fmha")}
    for m in models.values():
        for layer in m.model.layers:
            torch.nn.init.normal_(layer.self_attn.sinks, std=2.0)
    models["fmha"].load_state_dict(models["eager"].state_dict())
    return models


def test_gpt_oss_generates_a_left_padded_batch_as_its_eager_attention(monkeypatch):
    """gpt-oss's generate() on a left-padded batch: the prompt as packed sequences, each decoding step with the mask
    as ``attn_mask`` beside the sinks; the tokens are those of its eager attention, or part from them only at a
    bf16 tie of the eager model's own rating."""
    import fmha.integrations.transformers as fmha_hf
    models = _gpt_oss()
    masked = []
    real = fmha_hf.fmha.attention
    monkeypatch.setattr(fmha_hf.fmha, "attention",
                        lambda *a, **kw: masked.append(kw.get("attn_mask") is not None) or real(*a, **kw))
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    with torch.no_grad():
        got, want = (models[impl].eval().generate(ids, attention_mask=mask, max_new_tokens=5, do_sample=False)
                     for impl in ("fmha", "eager"))
    assert masked.count(True) >= 4  # the full layers' decoding steps at least
    for row, at, gap, step in greedy_partings(got, want, models["eager"], mask):
        assert gap <= step, (row, at, gap, step)


@pytest.mark.parametrize("left_padded", [False, True], ids=["all-ones", "left-padded"])
def test_gpt_oss_generates_with_a_static_cache_as_its_eager_attention(left_padded):
    """gpt-oss's generate() with a static cache, whose masks (the unused slots after the real keys, the sliding
    layers' window) fmha reads as no padding it knows: with the sinks, which SDPA lacks, fmha runs with the mask
    itself (``attn_mask``; there are no gradients); the tokens are its eager attention's, up to a bf16 tie."""
    models = _gpt_oss()
    ids = torch.randint(1, 64, (2, 10), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    mask = torch.ones_like(ids)
    if left_padded:
        mask[1, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False, cache_implementation="static")
    with torch.no_grad():
        got, want = (models[impl].eval().generate(ids, **kw) for impl in ("fmha", "eager"))
    for row, at, gap, step in greedy_partings(got, want, models["eager"], mask):
        assert gap <= step, (row, at, gap, step)


def test_sinks_with_any_mask_run_fmha_with_it():
    """transformers' attention call with sinks and a boolean mask that is no padding fmha knows (keys hidden at
    random): fmha with the mask as ``attn_mask``, against float64, eagerly and compiled whole (``fullgraph``: the
    mask is not read on the host); its gradients, sinks' included, against float64 autograd, eagerly and compiled;
    an additive float mask (a bias, the hidden keys at bfloat16's lowest value) alike (SDPA has no sinks)."""
    import fmha.integrations.transformers as fmha_hf
    module = torch.nn.Module()
    module.is_causal = True
    q, k, v = make_qkv(2, 4, 2, 9, 30, 64, torch.bfloat16, seed=4)  # transformers' [batch, heads, seq, dim]
    sinks = sinks_for(4)
    mask = torch.rand(2, 1, 9, 30, generator=torch.Generator().manual_seed(5)).to(DEVICE) < 0.6
    mask[0, :, 2] = False  # a row that sees no key

    def call(q, k, v, mask):
        return fmha_hf.attention_forward(module, q, k, v, mask, scaling=0.125, s_aux=sinks)[0]
    with torch.no_grad():
        for run in (call, torch.compile(call, fullgraph=True, backend="eager")):
            out = run(q, k, v, mask)  # [batch, seq, heads, dim]
            check_against_reference(out, *(t.transpose(1, 2) for t in (q, k, v)), False, layout="bshd", scale=0.125,
                                    attn_mask=mask.expand(2, 4, 9, 30), sinks=sinks)
    do = torch.randn(2, 9, 4, 64, generator=torch.Generator().manual_seed(6)).to(DEVICE)
    want = [t.detach().double().requires_grad_() for t in (q, k, v, sinks)]
    kk, vv = (t.repeat_interleave(2, 1) for t in want[1:3])  # float64 autograd: the sink a column of the softmax
    scores = (want[0] @ kk.transpose(-1, -2) * 0.125).masked_fill(~mask, float("-inf"))
    logits = torch.cat([scores, want[3][None, :, None, None].expand(2, 4, 9, 1)], dim=-1)
    ((torch.softmax(logits, -1)[..., :-1] @ vv).transpose(1, 2) * do.double()).sum().backward()

    def with_sinks(q, k, v, mask, s):
        return fmha_hf.attention_forward(module, q, k, v, mask, scaling=0.125, s_aux=s)[0]
    for run in (with_sinks, torch.compile(with_sinks, fullgraph=True, backend="aot_eager")):
        leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, sinks)]
        (run(*leaves[:3], mask, leaves[3]).float() * do).sum().backward()
        for got, w in zip(leaves, want):
            torch.testing.assert_close(got.grad.double(), w.grad, atol=3e-2, rtol=3e-2)
    bias = torch.randn(2, 1, 9, 30, generator=torch.Generator().manual_seed(7)).to(DEVICE, torch.bfloat16)
    additive = bias.masked_fill(~mask, torch.finfo(torch.bfloat16).min)  # a float mask, as transformers builds one
    with torch.no_grad():
        for run in (call, torch.compile(call, fullgraph=True, backend="eager")):
            check_against_reference(run(q, k, v, additive), *(t.transpose(1, 2) for t in (q, k, v)), False,
                                    layout="bshd", scale=0.125, attn_mask=additive.expand(2, 4, 9, 30), sinks=sinks)


def test_gpt_oss_matches_its_eager_attention():
    """A small gpt-oss (sinks in every layer, sliding and full layers alternating) with fmha: hidden
    states as its own eager attention computes them, and a training step's sink gradients."""
    models = _gpt_oss()
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    out = {}
    for impl, m in models.items():
        out[impl] = m(ids, labels=ids, output_hidden_states=True)
        out[impl].loss.backward()
    for a, b in zip(out["eager"].hidden_states, out["fmha"].hidden_states):
        torch.testing.assert_close(b.float(), a.float(), atol=5e-2, rtol=5e-2)
    for le, lf in zip(models["eager"].model.layers, models["fmha"].model.layers):
        ge, gf = le.self_attn.sinks.grad.float(), lf.self_attn.sinks.grad.float()
        assert (gf - ge).norm() <= 0.1 * ge.norm() + 1e-3
