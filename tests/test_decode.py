"""Split-key decoding (flash-decoding): partials merged by their LSE equal the unsplit answer."""
import dataclasses

import numpy as np
import pytest
import torch

import fmha
from conftest import DEVICE, check_against_reference, make_qkv, nan_like
from fmha import reference
from fmha.kernels import VARIANTS


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("sq,sk,splits,causal", [(1, 200, 3, False), (4, 257, 5, True), (16, 130, 2, True),
                                                 (7, 64, 8, False)])
@pytest.mark.parametrize("merge_in_split", [True, False])
def test_split_keys_match_reference(variant, sq, sk, splits, causal, merge_in_split, monkeypatch):
    if merge_in_split and variant != "tiled":
        pytest.skip("the seed's variants merge apart")
    monkeypatch.setattr(fmha.forward, "merge_in_split", lambda device: merge_in_split)
    q, k, v = make_qkv(2, 4, 1, sq, sk, 64, torch.bfloat16, seed=sk)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", variant=variant,
                            num_splits=splits, return_lse=True, out=out)
    check_against_reference(out, q, k, v, causal, "bottom_right")
    _, ref_lse = reference.dense_attention(q, k, v, causal=causal, causal_align="bottom_right", return_lse=True)
    np.testing.assert_allclose(lse.cpu().double().numpy(), ref_lse, atol=2e-3)


@pytest.mark.parametrize("return_lse", [True, False])
def test_a_split_merges_its_own_partials_in_one_launch(return_lse, monkeypatch):
    # the split that finishes a row block last merges it: one launch, the counters left at zero for the next
    from fmha import replay
    launched = []
    real = replay.launch
    monkeypatch.setattr(replay, "launch", lambda kernel, *a, **kw: (launched.append(kernel), real(kernel, *a, **kw)))
    q, k, v = make_qkv(2, 8, 2, 3, 300, 64, torch.float16, layout="bshd", seed=5)
    for _ in range(2):  # the second call meets the counters the first one left
        launched.clear()
        replay.clear(compiled=False)  # (on a GPU the second call would replay the first's launches)
        out = nan_like(q)
        got = fmha.attention(q, k, v, layout="bshd", num_splits=4, return_lse=return_lse, out=out)
        o, lse = got if return_lse else (got, None)
        assert launched == [VARIANTS["tiled"]]
        check_against_reference(out, q, k, v, False, layout="bshd", lse=lse)
    assert all(int(block.abs().sum()) == 0 for block in replay._TICKETS.values())


def test_a_call_that_holds_nothing_merges_apart(monkeypatch):
    # inside a custom op's call (compiled code, whose CUDA graphs warm up in their own memory pool) no counters
    # are held: the merge is a launch of its own
    from fmha import replay
    from fmha.kernels import combine
    launched = []
    real = replay.launch
    monkeypatch.setattr(replay, "launch", lambda kernel, *a, **kw: (launched.append(kernel), real(kernel, *a, **kw)))
    q, k, v = make_qkv(1, 4, 1, 1, 200, 64, torch.bfloat16, seed=2)
    replay.clear(compiled=False)
    with replay.transient():
        assert not replay.holding(q.device)
        o = fmha.attention(q, k, v, num_splits=3)
    assert replay.holding(q.device)
    assert launched == [VARIANTS["tiled"], combine.merge_kernel]
    check_against_reference(o, q, k, v, False)


def test_split_with_rows_that_see_nothing():
    # bottom-right with sq > sk: the first rows see no key in any split
    q, k, v = make_qkv(1, 2, 2, 12, 40, 32, torch.float16)
    q, k, v = q[:, :, :12], k[:, :, :5], v[:, :, :5]
    o, lse = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", num_splits=2, return_lse=True)
    assert (o[:, :, :7] == 0).all() and torch.isneginf(lse[:, :, :7]).all()
    check_against_reference(o, q, k, v, True, "bottom_right", lse=lse)


def test_split_bshd_and_seqused():
    q, k, v = make_qkv(2, 4, 2, 3, 150, 32, torch.float16, layout="bshd")
    used = torch.tensor([150, 61], dtype=torch.int32, device=DEVICE)
    a = fmha.attention(q, k, v, layout="bshd", seqused_k=used, num_splits=4)
    b = fmha.attention(q, k, v, layout="bshd", seqused_k=used, num_splits=1)
    torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)
    for i, n in enumerate(used.tolist()):
        check_against_reference(a[i:i + 1], q[i:i + 1], k[i:i + 1, :n], v[i:i + 1, :n], False, layout="bshd")
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        fmha.attention(q, k, v, layout="bshd", num_splits=-1)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("sq,heads,kv_heads,layout", [(16, 8, 1, "bhsd"), (5, 6, 2, "bshd"), (1, 12, 4, "bhsd")])
def test_packed_gqa_rows(variant, sq, heads, kv_heads, layout):
    # decoding with GQA packs each KV head's query heads into one block of rows (several
    # blocks when sq * group passes BLOCK_M); window and softcap see each row's own position
    q, k, v = make_qkv(2, heads, kv_heads, sq, 90, 32, torch.float16, layout=layout, seed=sq)
    assert "packed-gqa" in fmha.api.describe(*(t if layout == "bhsd" else t.transpose(1, 2) for t in (q, k, v)))
    for kw in ({"causal": True}, {"causal": True, "window": (20, 0), "softcap": 3.0}):
        out = nan_like(q)
        o, lse = fmha.attention(q, k, v, causal_align="bottom_right", variant=variant, layout=layout,
                                return_lse=True, out=out, **kw)
        ref, ref_lse = reference.dense_attention(*(t if layout == "bhsd" else t.transpose(1, 2) for t in (q, k, v)),
                                                 causal_align="bottom_right", return_lse=True, **kw)
        got = (out if layout == "bhsd" else out.transpose(1, 2)).cpu().double().numpy()
        np.testing.assert_allclose(got, ref, atol=4e-3)
        np.testing.assert_allclose(lse.cpu().double().numpy(), ref_lse, atol=2e-3)


def test_merge_matches_float64():
    # partials over disjoint keys, some rows reached by no partial at all
    from fmha.distributed.merge import merge_stack
    g = torch.Generator().manual_seed(3)
    o = torch.randn(21, 3, 5, 24, generator=g)
    lse = 4 * torch.randn(21, 3, 5, generator=g)
    lse[5:9, 1] = float("-inf")
    lse[:, 2, 3] = float("-inf")
    out, total = merge_stack(o.to(DEVICE), lse.to(DEVICE))
    ref_total = torch.logsumexp(lse.double(), 0)
    w = torch.exp(lse.double() - torch.where(torch.isneginf(ref_total), 0, ref_total))
    ref = (w[..., None] * o.double()).sum(0)
    torch.testing.assert_close(out.cpu().double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(total.cpu().double(), ref_total, atol=1e-5, rtol=1e-5)
    assert (out[2, 3] == 0).all() and torch.isneginf(total[2, 3])


def test_split_count_follows_programs_per_sm(monkeypatch):
    from fmha import configs, plan
    monkeypatch.setattr(plan, "device_facts", lambda index: (9, 100))
    prob = plan.Problem(2, 8, 8, 1, 1 << 16, 128, False, 0, 1.0)  # 16 programs before the split
    for per_sm, splits in ((0, 25), (2, 12), (3, 18), (8, 50)):
        cfg = configs.KernelConfig(16, 64, 4, 3, split_per_sm=per_sm)
        asked, split_len = plan._split_len(0, "sm90", prob, cfg, torch.device("cuda", 0))
        count = -(-prob.seqlen_k // split_len)
        assert asked == splits
        # the split length is rounded up to whole tiles: one split fewer at most, and never a
        # program past per_sm * SMs (no last wave of a few programs)
        assert split_len % 64 == 0 and splits - 1 <= count <= splits, (per_sm, split_len)
        assert 16 * count <= (per_sm or 4) * 100


@pytest.mark.parametrize("batch,kv_heads,seqlen_k,head_dim,splits,split_len", [
    (1, 8, 1024, 64, 16, 64),     # 8 programs: a tile a split fills 128 SMs (four tiles a split left 100 idle)
    (1, 4, 4096, 128, 33, 128),   # 4 programs: 33 splits asked, 32 of two tiles launched
    (1, 8, 4096, 128, 16, 256),   # four tiles a split already fill the SMs
    (8, 8, 1024, 64, 4, 256),     # head_dim 64: two programs an SM, four tiles each
    (8, 4, 1024, 128, 4, 256),    # head_dim 128: one program an SM
])
def test_a_split_leaves_no_sm_idle(batch, kv_heads, seqlen_k, head_dim, splits, split_len, monkeypatch):
    """The automatic split on a 132-SM GPU (GQA rows packed, one 16-row block a KV head): splits of four key tiles
    or more, unless fewer programs than SMs would run; then as many splits as fill each SM, down to one tile each."""
    from fmha import configs, plan
    monkeypatch.setattr(plan, "device_facts", lambda index: (9, 132))
    prob = plan.Problem(batch, 4 * kv_heads, kv_heads, 1, seqlen_k, head_dim, False, 0, 1.0, pack_gqa=True)
    cfg = configs.decode_config(4, seqlen_k, head_dim)
    assert plan._split_len(0, "sm90", prob, cfg, torch.device("cuda", 0)) == (splits, split_len)


@pytest.mark.parametrize("sq,layout,causal", [(1, "bhsd", False), (4, "bshd", True), (40, "bhsd", True)])
def test_kv_by_tma(sq, layout, causal):
    """``tiled`` with K/V read by TMA (config tma=1): split decoding with packed GQA and prefill,
    both layouts, per-batch key lengths whose padding holds NaN, against the float64 reference;
    strided K/V read in place; what it cannot take (rows that are not a multiple of 16 bytes, another
    variant) is refused with the reason."""
    b, h, kvh, sk, d = 2, 8, 2, 300, 64
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, layout=layout, seed=sq)
    used = [300, 131]
    for i, n in enumerate(used):
        pad = (i, slice(None), slice(n, None)) if layout == "bhsd" else (i, slice(n, None))
        k[pad], v[pad] = float("nan"), float("nan")
    cfg = fmha.KernelConfig(16 if sq < 16 else 32, 64, 4, 2, split_per_sm=1, tma=1)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", layout=layout, variant="tiled",
                            config=cfg, num_splits=3 if sq < 16 else 0, return_lse=True, out=out,
                            seqused_k=torch.tensor(used, dtype=torch.int32, device=DEVICE))
    for i, n in enumerate(used):
        own = (slice(i, i + 1),)
        keys = (slice(i, i + 1), slice(None), slice(0, n)) if layout == "bhsd" else (slice(i, i + 1), slice(0, n))
        check_against_reference(out[own], q[own], k[keys], v[keys], causal, "bottom_right", layout)
        bhsd = [t if layout == "bhsd" else t.transpose(1, 2) for t in (q[own], k[keys], v[keys])]
        _, ref_lse = reference.dense_attention(*bhsd, causal=causal, causal_align="bottom_right", return_lse=True)
        np.testing.assert_allclose(lse[own].cpu().double().numpy(), ref_lse, atol=2e-3)
    strided = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, layout=layout, contiguous=False)
    out = nan_like(strided[0])
    fmha.attention(*strided, layout=layout, variant="tiled", config=cfg, out=out)
    check_against_reference(out, *strided, False, "top_left", layout)
    narrow = [torch.zeros(*t.shape[:3], d + 4, dtype=t.dtype, device=t.device) for t in strided[1:]]  # 136-byte rows
    with pytest.raises(ValueError, match="16-byte aligned pointers and strides"):
        fmha.attention(q, *(t[..., :d] for t in narrow), layout=layout, variant="tiled", config=cfg)
    with pytest.raises(ValueError, match="is the tiled variant's"):
        fmha.attention(q, k, v, layout=layout, variant="pipelined", config=cfg)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("sq,heads", [(1, 4), (8, 8)])
def test_amd_decode_configs_match_reference(head_dim, sq, heads):
    """Decoding's AMD configs (:func:`fmha.configs.amd_decode_config`: 16- to 64-key tiles, one stage, GQA rows
    packed into 16-, 32- and 64-row blocks, 32 at most past head_dim 128) split and merged right, run by the
    interpreter."""
    from fmha import configs
    cfg = configs.decode_config(sq * heads, 300, head_dim, "hip")
    q, k, v = make_qkv(1, heads, 1, sq, 300, head_dim, torch.bfloat16, seed=head_dim)
    out = nan_like(q)
    fmha.attention(q, k, v, causal=True, causal_align="bottom_right", variant="tiled", config=cfg, num_splits=3,
                   out=out)
    check_against_reference(out, q, k, v, True, "bottom_right")


def test_only_tiled_takes_the_decode_table_on_a_split(monkeypatch):
    """A forced key split over 1074 query rows at head_dim 256 on sm_90: ``tiled`` runs the decode table's
    tiles; the seed's variants keep their own (the decode tiles, three 64 x 256 K/V stages, ask ``pipelined``
    for 256 KB of shared memory, past the H200's 227: a GPU fuzz problem that crashed)."""
    from fmha import configs, plan
    monkeypatch.setattr(plan, "arch_of", lambda device: "sm90")
    q = torch.zeros(1, 2, 1074, 256, dtype=torch.bfloat16)
    k = v = torch.zeros(1, 2, 1257, 256, dtype=torch.bfloat16)
    prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=True, scale=None)
    tiled = plan.plan(prob, q, k, v, q, "bhsd", "tiled", None, None, 4)
    assert tiled.config == configs.decode_config(1074, 1257, 256, "sm90") and tiled.split_len
    for variant in ("pipelined", "singlewave"):
        p = plan.plan(prob, q, k, v, q, "bhsd", variant, None, None, 4)
        own = configs.default_config(variant, "sm90", 256, True, 1257, False, per_sequence=False, seqlen_q=1074)
        assert p.config == own and p.split_len, (variant, p.config)


def test_a_growing_cache_is_read_by_pointer(monkeypatch):
    """On sm_90 a split decode reads K/V by TMA, as the decode table says, unless they are a cache that grows into a
    new tensor at every call (:func:`fmha.replay.growing`: two descriptors filled a call cost more host time than TMA
    saves) or float8; a caller's config with TMA keeps it."""
    from fmha import configs, plan
    monkeypatch.setattr(plan, "arch_of", lambda device: "sm90")
    q = torch.zeros(1, 32, 1, 128, dtype=torch.bfloat16)
    k = v = torch.zeros(1, 8, 4096, 128, dtype=torch.bfloat16)
    prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=False, scale=None)
    table = configs.decode_config(4, 4096, 128, "sm90")
    assert table.tma
    staying = plan.plan(prob, q, k, v, q, "bhsd", "auto", None, None, 4)
    growing = plan.plan(prob, q, k, v, q, "bhsd", "auto", None, None, 4, growing=True)
    assert staying.split_len and staying.config == table
    assert growing.split_len == staying.split_len and growing.config == dataclasses.replace(table, tma=0)
    fp8 = plan.plan(dataclasses.replace(prob, fp8=True), q, k, v, q, "bhsd", "auto", None, None, 4)
    assert not fp8.config.tma
    fixed = plan.plan(prob, q, k, v, q, "bhsd", "tiled", table, None, 4, growing=True)
    assert fixed.config.tma


@pytest.mark.parametrize("shared,head_dim,sq,sk,stages", [
    (101376, 128, 1, 16384, 2),   # sm_86 / sm_89: the 128-key tiles from 8k keys took 136 KB in three stages
    (101376, 256, 1, 4096, 2),    # 138 KB in three
    (101376, 256, 16, 4096, 1),   # 64 rows (16 queries of 4 heads a KV head): 104 KB in two
    (166912, 256, 16, 4096, 2),   # an A100: 168 KB in three
    (166912, 128, 1, 16384, 3)])  # fits as it is
def test_a_decode_takes_the_stages_its_gpu_holds(monkeypatch, shared, head_dim, sq, sk, stages):
    """On a GPU other than sm_90 the decode table's tiles take as many stages as its shared memory holds
    (:func:`fmha.configs.fit_shared`): three asked an A100 or an sm_89 for more than it has, which Triton refuses
    at the launch."""
    from fmha import plan
    monkeypatch.setattr(plan, "arch_of", lambda device: "sm80")
    monkeypatch.setattr(plan, "_shared", lambda device, arch: (8, shared))
    monkeypatch.setattr(plan, "device_facts", lambda index: (8, 108))
    monkeypatch.setattr(plan, "index_of", lambda device: 0)
    q = torch.zeros(1, 16, sq, head_dim, dtype=torch.bfloat16)
    k = v = torch.zeros(1, 4, sk, head_dim, dtype=torch.bfloat16)
    prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=False, scale=None)
    p = plan.plan(prob, q, k, v, q, "bhsd", "tiled", None, None, 0)
    assert p.split_len and p.config.num_stages == stages, p.config
