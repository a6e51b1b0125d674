"""q/k and v head dims that differ (DeepSeek-V3's MLA prefill: 192 and 128), head_dim 192 alike, and every other
multiple of 8 up to 256 (Phi-2's 80), against the float64 reference: forward on every path that takes it, split
decoding, packed sequences, gradients."""
import pytest
import torch

import fmha
from conftest import DEVICE, check_against_reference, nan_like, packed
from fmha.verify import check_grads


def qkv(b, h, kvh, sq, sk, d, dv, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (lambda n, s, x: (b, n, s, x)) if layout == "bhsd" else (lambda n, s, x: (b, s, n, x))
    return tuple(torch.randn(shape(n, s, x), generator=g).to(torch.bfloat16).to(DEVICE)
                 for n, s, x in ((h, sq, d), (kvh, sk, d), (kvh, sk, dv)))


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "bottom_right")])
def test_v_head_dim_other_than_qk(causal, align, layout):
    q, k, v = qkv(2, 4, 2, 21, 30, 192, 128, layout)
    out = torch.full((*q.shape[:-1], 128), float("nan"), dtype=q.dtype, device=DEVICE)
    _, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, out=out, return_lse=True)
    check_against_reference(out, q, k, v, causal, align, layout, lse=lse)
    on_hopper = q.is_cuda and torch.cuda.get_device_capability()[0] == 9
    assert fmha.api.describe(q, k, v, layout=layout).startswith("hopper" if on_hopper else "tiled")


@pytest.mark.parametrize("head_dim,head_dim_v", [(192, 128), (80, 80), (48, 24), (40, 40)])
def test_split_decoding_and_packed_sequences(head_dim, head_dim_v):
    q, k, v = qkv(2, 8, 2, 1, 300, head_dim, head_dim_v, "bhsd", seed=1)
    o = fmha.attention(q, k, v, num_splits=3)
    check_against_reference(o, q, k, v, False)
    lens_q, lens_k = [5, 17], [9, 30]
    q, cu_q = packed(lens_q, 4, head_dim, torch.bfloat16, 2)
    k, cu_k = packed(lens_k, 2, head_dim, torch.bfloat16, 3)
    v, _ = packed(lens_k, 2, head_dim_v, torch.bfloat16, 4)
    o = fmha.attention_varlen(q, k, v, cu_q, cu_k, 17, 30, causal=True)
    assert o.shape == (22, 4, head_dim_v)
    for b in range(2):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        check_against_reference(o[rq][None], q[rq][None], k[rk][None], v[rk][None], True, "bottom_right", "bshd")


def test_gradients_with_v_head_dim_other_than_qk():
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 4, 2, 19, 25, 192, 128, "bshd", seed=5))
    o = fmha.attention(q, k, v, causal=True, layout="bshd", softcap=10.0)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(6)).to(o)
    o.backward(do)
    check_grads((q.grad, k.grad, v.grad), q, k, v, do, True, "top_left", "bshd", softcap=10.0)


@pytest.mark.skipif(DEVICE != "cpu", reason="the AMD tables' tiles, run by the interpreter")
@pytest.mark.parametrize("family", ["rdna", "cdna"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_gradients_with_v_head_dim_other_than_qk_in_the_amd_tiles(monkeypatch, family, deterministic):
    """DeepSeek's 192/128 in the tiles the AMD tables take past head_dim 128 (RDNA: S and dP over 16 column chunks):
    dP = dO V^T reads V's 128 columns, 8 to a chunk, shallower than the matrix unit takes (the build died there, and
    the interpreter, which asserts the depth since, refused it), so that product takes V's columns in 8 chunks of 16.
    Against the float64 gradients."""
    from fmha import backward
    monkeypatch.setattr(backward, "family_of", lambda device: family)
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 1, 21, 27, 192, 128, "bhsd", seed=11))
    o = fmha.attention(q, k, v, causal=True, deterministic=deterministic)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(12)).to(o)
    o.backward(do)
    check_grads((q.grad, k.grad, v.grad), q, k, v, do, True, o=o.detach())


@pytest.mark.parametrize("variant", ["singlewave", "pipelined", "tiled"])
def test_head_dim_192_on_every_variant(variant):
    q, k, v = qkv(1, 2, 1, 33, 40, 192, 192, "bhsd", seed=7)
    out = nan_like(q)
    fmha.attention(q, k, v, causal=True, variant=variant, out=out)
    check_against_reference(out, q, k, v, True)


def test_what_differs_is_checked():
    q, k, v = qkv(1, 2, 1, 8, 8, 192, 128, "bhsd")
    with pytest.raises(ValueError, match="cannot take this call: a V head dim other than q/k's is the tiled"):
        fmha.attention(q, k, v, variant="singlewave")
    with pytest.raises(ValueError, match=r"out must have q's shape with v's head_dim"):
        fmha.attention(q, k, v, out=torch.empty_like(q))
    with pytest.raises(ValueError, match="v's head_dim must be a multiple of 8"):
        fmha.attention(q, k, v[..., :100])


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("sq,splits", [(1, 0), (1, 3), (3, 1)])
@pytest.mark.parametrize("v_of_k", [True, False], ids=["v-slice-of-k", "v-apart"])
def test_mla_absorbed_decoding(v_of_k, sq, splits, layout):
    """DeepSeek's MLA decoded in its absorbed form: q/k 576 (the 512-column latent and 64 rope columns), V the
    latent's 512, one KV head for 16 query heads, the keys split or not, causal bottom-right; V passed as a
    slice of the latent cache (read once, as K's tile) or apart; the output poisoned first."""
    from fmha import kernels, plan
    q, latent, _ = qkv(2, 16, 1, sq, 150, 576, 512, layout, seed=sq + splits)
    v = latent[..., :512] if v_of_k else latent[..., :512].contiguous()
    out = torch.full((*q.shape[:-1], 512), float("nan"), dtype=q.dtype, device=DEVICE)
    _, lse = fmha.attention(q, latent, v, causal=True, causal_align="bottom_right", layout=layout, out=out,
                            num_splits=splits, return_lse=True)
    check_against_reference(out, q, latent, v, True, "bottom_right", layout, lse=lse)
    prob = plan.problem(*plan.sizes(q, latent, layout), causal=True, scale=None, head_dim_v=512)
    assert (prob.block_d, prob.qk_lo) == (512, 64) and kernels.v_from_k(prob, latent, v) == v_of_k
    assert fmha.api.describe(q, latent, v, layout=layout).startswith("tiled")


@pytest.mark.parametrize("sq,splits", [(1, 0), (3, 2)])
@pytest.mark.parametrize("v_of_k", [True, False], ids=["v-slice-of-k", "v-apart"])
def test_mla_absorbed_decoding_with_q_k_in_column_chunks(v_of_k, sq, splits):
    """The absorbed form with Q K^T as one batched product over 16 column chunks of the latent, summed
    (``qk_chunks``: AMD's table, where 576 columns of Q held whole in the matrix unit's operand layout spilled),
    against the float64 reference, split or not, V a slice of the latent or apart, and as a paged cache."""
    config = fmha.KernelConfig(16, 16, 16, 2, qk_chunks=16)
    q, latent, _ = qkv(1, 16, 1, sq, 90, 576, 512, "bhsd", seed=sq + splits + 40)
    v = latent[..., :512] if v_of_k else latent[..., :512].contiguous()
    out = torch.full((*q.shape[:-1], 512), float("nan"), dtype=q.dtype, device=DEVICE)
    _, lse = fmha.attention(q, latent, v, causal=True, causal_align="bottom_right", out=out, num_splits=splits,
                            return_lse=True, config=config)
    check_against_reference(out, q, latent, v, True, "bottom_right", "bhsd", lse=lse)
    if v_of_k and splits:
        pool = latent[0, 0, :80].reshape(5, 16, 1, 576)  # 5 pages of 16 keys, in a shuffled table
        table = torch.tensor([[3, 0, 4, 1, 2]], dtype=torch.int32, device=DEVICE)
        o = fmha.attention_paged(q, pool, pool[..., :512], table, torch.tensor([77], dtype=torch.int32,
                                 device=DEVICE), causal=True, config=config)
        keys = pool[table[0].long()].reshape(-1, 1, 576)[:77].transpose(0, 1)[None]
        check_against_reference(o, q, keys, keys[..., :512], True, "bottom_right")


def test_mla_absorbed_in_a_paged_cache_and_packed():
    """The absorbed form against a paged latent cache (V its first 512 columns) and as packed sequences."""
    g = torch.Generator().manual_seed(9)
    pool = torch.randn(12, 16, 1, 576, generator=g).to(torch.bfloat16).to(DEVICE)  # 12 pages of 16 keys
    table = torch.tensor([[3, 7, 0, 11], [5, 1, 9, 2]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([50, 21], dtype=torch.int32, device=DEVICE)
    q = torch.randn(2, 8, 2, 576, generator=g).to(torch.bfloat16).to(DEVICE)
    o = fmha.attention_paged(q, pool, pool[..., :512], table, lens, causal=True)
    for b, n in enumerate(lens.tolist()):
        keys = pool[table[b].long()].reshape(-1, 1, 576)[:n].transpose(0, 1)[None]
        check_against_reference(o[b:b + 1], q[b:b + 1], keys, keys[..., :512], True, "bottom_right")
    lens_q, lens_k = [2, 1], [40, 17]
    qp, cu_q = packed(lens_q, 8, 576, torch.bfloat16, 10)
    kp, cu_k = packed(lens_k, 1, 576, torch.bfloat16, 11)
    o = fmha.attention_varlen(qp, kp, kp[..., :512], cu_q, cu_k, 2, 40, causal=True)
    for b in range(2):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        check_against_reference(o[rq][None], qp[rq][None], kp[rk][None], kp[rk][None][..., :512], True,
                                "bottom_right", "bshd")


def test_mla_absorbed_is_forward_only_and_tiled():
    q, k, v = qkv(1, 4, 1, 1, 20, 576, 512, "bhsd")
    with pytest.raises(NotImplementedError, match="absorbed form.*has no backward"):
        fmha.attention(q.requires_grad_(True), k, v)
    with pytest.raises(ValueError, match="576 .MLA's absorbed form. runs on the tiled variant"):
        fmha.attention(q.detach(), k, v, variant="singlewave")
    with pytest.raises(ValueError, match="head_dim must be a multiple of 8"):
        fmha.attention(q.detach(), k, v[..., :256])


def test_mla_absorbed_prefill_on_sm90_plans_tiled(monkeypatch):
    """On sm_90, ``auto`` picks ``hopper`` for more than 16 query rows; the absorbed form's 576 has no row in
    hopper's table, so the plan falls back to ``tiled`` before looking one up, and ``variant="hopper"`` says why."""
    from fmha import plan
    monkeypatch.setattr(plan, "arch_of", lambda device: "sm90")
    q, k, v = qkv(1, 4, 1, 64, 64, 576, 512, "bhsd")
    prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=True, scale=None, head_dim_v=512)
    assert plan.plan(prob, q, k, v, q, "bhsd", "auto", None, None, 1).variant == "tiled"
    with pytest.raises(ValueError, match="576 .MLA's absorbed form. runs on the tiled variant"):
        plan.plan(prob, q, k, v, q, "bhsd", "hopper", None, None, 1)


def test_describe_plans_what_the_call_plans(monkeypatch):
    """``describe`` (the ledger's config column) plans the problem the call plans, V's head dim included: planned as
    q/k's, DeepSeek's 192/128 would read as a 192/192 call (on sm_90 the 256-wide row, not ``split_qk``)."""
    from fmha import plan as planning
    seen = []
    real = planning.plan
    monkeypatch.setattr(planning, "plan", lambda prob, *a, **kw: seen.append(prob) or real(prob, *a, **kw))
    q, k, v = (torch.randn(1, 2, 40, d, dtype=torch.bfloat16).to(DEVICE) for d in (192, 192, 128))
    fmha.api.describe(q, k, v, causal=True)
    fmha.attention(q, k, v, causal=True)
    assert len(seen) >= 2 and seen[0].dv == seen[-1].dv == 128



@pytest.mark.parametrize("variant", ["singlewave", "pipelined", "tiled"])
@pytest.mark.parametrize("head_dim", [8, 40, 80, 112, 160, 248])
def test_every_multiple_of_8_on_every_variant(variant, head_dim):
    """Head dims off the powers of two (Phi-2's 80, StableLM's 80, any multiple of 8 up to 256) run in the tile of
    the next power of two with the columns past head_dim masked: forward with GQA in both alignments."""
    q, k, v = qkv(1, 4, 2, 37, 53, head_dim, head_dim, "bshd", seed=head_dim)
    for causal, align in ((False, "top_left"), (True, "bottom_right")):
        out = nan_like(q)
        fmha.attention(q, k, v, causal=causal, causal_align=align, layout="bshd", variant=variant, out=out)
        check_against_reference(out, q, k, v, causal, align, "bshd")


@pytest.mark.parametrize("head_dim,head_dim_v", [(80, 80), (40, 40), (248, 248), (112, 48), (48, 96)])
def test_gradients_at_every_multiple_of_8(head_dim, head_dim_v):
    """Gradients at head dims off the powers of two, V narrower or wider than q/k (``tiled`` takes either)."""
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 4, 2, 29, 41, head_dim, head_dim_v, "bhsd", seed=head_dim_v))
    o = fmha.attention(q, k, v, causal=True)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(9)).to(o)
    o.backward(do)
    check_grads((q.grad, k.grad, v.grad), q, k, v, do, True, o=o.detach())


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("head_dim,head_dim_v,config", [
    (40, 24, None), (24, 8, None), (56, 8, None), (72, 24, None), (104, 8, None), (48, 24, (64, 64, 4, 1)),
    (128, 16, (64, 64, 4, 1)), (40, 32, (64, 64, 4, 1))])
def test_a_narrow_v_beside_another_qk(head_dim, head_dim_v, config, causal):
    """A V narrower than 64 columns beside q/k's of another width, on ``tiled``: on sm_90 these pairs (in 16- or
    32-column V tiles) answered wrongly (errors 0.4-1.5) or faulted (72 with 24; 48 with 24 in 64 x 64 tiles of one
    stage); V's tile is now at least 64 columns there (:func:`fmha.plan.v_tile`).  Forward over 300 keys in bshd
    (rows a multiple of 8 elements apart), gradients at the first pair; the transformers integration takes them."""
    from fmha.integrations.transformers import _not_taken
    from fmha.plan import v_tile
    cfg = fmha.KernelConfig(*config) if config else None
    q, k, v = qkv(1, 4, 2, 37, 300, head_dim, head_dim_v, "bshd", seed=head_dim)
    out = torch.full((*q.shape[:-1], head_dim_v), float("nan"), dtype=q.dtype, device=DEVICE)
    _, lse = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", layout="bshd", variant="tiled",
                            config=cfg, out=out, return_lse=True)
    check_against_reference(out, q, k, v, causal, "bottom_right", "bshd", lse=lse)
    assert v_tile(head_dim, head_dim_v) == 64 and v_tile(head_dim_v, head_dim_v) < 64 and _not_taken(40, 24, {}) is None
    if (head_dim, head_dim_v) == (40, 24) and causal:
        q, k, v = (t[:, :40].detach().requires_grad_(True) for t in (q, k, v))
        o = fmha.attention(q, k, v, causal=True, layout="bshd")
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(3)).to(o)
        o.backward(do)
        check_grads((q.grad, k.grad, v.grad), q, k, v, do, True, "top_left", "bshd", o=o.detach())


def test_a_head_dim_the_gluon_kernels_lack_plans_tiled_on_sm90(monkeypatch):
    """On sm_90 ``auto`` takes ``tiled`` at head_dim 24 (the Gluon kernel takes 32 up), and ``variant="hopper"``
    says which it takes."""
    from fmha import plan
    monkeypatch.setattr(plan, "arch_of", lambda device: "sm90")
    q, k, v = qkv(1, 4, 2, 64, 64, 24, 24, "bhsd")
    prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=True, scale=None)
    assert plan.plan(prob, q, k, v, q, "bhsd", "auto", None, None, 1).variant == "tiled"
    with pytest.raises(ValueError, match="takes a multiple of 8 from 32 to 256"):
        plan.plan(prob, q, k, v, q, "bhsd", "hopper", None, None, 1)
