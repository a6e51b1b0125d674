"""Gradients through fmha: autograd of attention and attention_varlen against the float64 backward of the
definition (:func:`fmha.reference.dense_attention_backward`, itself checked against float64 autograd),
within the forward's yardstick (:func:`fmha.verify.check_grads`); torch.compile and transformers
train through it; what has no backward says so."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fmha
from conftest import DEVICE, make_qkv, packed, drawn_inputs, replays_as_it_ran
from fmha import backward, reference
from fmha.gradients import PAGED_MESSAGE
from fmha.verify import check_grads

SHAPES = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim)
    (1, 2, 2, 20, 24, 32),
    (2, 4, 2, 33, 17, 64),    # GQA, sq > sk
    (1, 4, 1, 17, 40, 96),    # MQA, masked head_dim
    (1, 2, 2, 40, 37, 128),
]
ALIGNS = [(False, "top_left"), (True, "top_left"), (True, "bottom_right")]


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def grads_of(out, inputs, seed=0):
    do = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32).to(out)
    out.backward(do)
    return [t.grad for t in inputs], do


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("causal,align", ALIGNS)
def test_gradients_match_the_reference(causal, align, shape):
    i = SHAPES.index(shape) + ALIGNS.index((causal, align))
    dtype, layout = (torch.float16, torch.bfloat16)[i % 2], ("bhsd", "bshd")[i // 2 % 2]
    q, k, v = leaves(*make_qkv(*shape, dtype, layout, seed=i))
    o = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, deterministic=i % 3 == 0)
    grads, do = grads_of(o, (q, k, v), seed=i)
    check_grads(grads, q, k, v, do, causal, align, layout)


@pytest.mark.skipif(DEVICE != "cpu", reason="the AMD tables' tiles, run by the interpreter")
@pytest.mark.parametrize("family", ["rdna", "cdna"])
@pytest.mark.parametrize("head_dim,causal,deterministic", [(64, True, False), (64, False, True), (128, True, False),
                                                           (256, False, False), (256, True, True), (80, True, True)])
def test_amd_tiles_have_the_reference_gradients(monkeypatch, family, head_dim, causal, deterministic):
    """The tiles the AMD tables pick (:data:`fmha.backward.AMD_TILES`: 16- and 32-row blocks, dQ by atomics or
    its own kernel), run by the interpreter: the walks over ragged ends and the causal band hold for them."""
    from fmha import backward
    monkeypatch.setattr(backward, "family_of", lambda device: family)
    q, k, v = leaves(*make_qkv(1, 2, 1, 37, 45, head_dim, torch.bfloat16, "bhsd", seed=head_dim))
    o = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", deterministic=deterministic)
    grads, do = grads_of(o, (q, k, v), seed=1)
    check_grads(grads, q, k, v, do, causal, "bottom_right", "bhsd")


@pytest.mark.skipif(DEVICE != "cpu", reason="the AMD tables' tiles, run by the interpreter")
@pytest.mark.parametrize("family", ["rdna", "cdna"])
@pytest.mark.parametrize("head_dim,causal,deterministic,mask", [(64, True, False, "bool"), (64, False, True, "bias"),
                                                                (128, True, False, "bias"), (256, True, True, "bool")])
def test_amd_tiles_beside_a_mask_have_the_reference_gradients(monkeypatch, family, head_dim, causal, deterministic,
                                                              mask):
    """The tiles the AMD tables pick beside an attn_mask (:data:`fmha.backward.AMD_TILES_MASKED`), run by the
    interpreter: dQ, dK, dV and a bias's own gradient against float64."""
    from fmha import backward
    from fmha.verify import check_mask_grad
    monkeypatch.setattr(backward, "family_of", lambda device: family)
    q, k, v = leaves(*make_qkv(1, 2, 1, 37, 45, head_dim, torch.bfloat16, "bhsd", seed=head_dim))
    g = torch.Generator().manual_seed(head_dim)
    keep = (torch.rand(1, 1, 37, 45, generator=g) < 0.7).to(DEVICE)
    attn_mask = keep if mask == "bool" else torch.randn(1, 2, 37, 45, generator=g).to(DEVICE).requires_grad_(True)
    o = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", deterministic=deterministic,
                       attn_mask=attn_mask)
    inputs = (q, k, v) if mask == "bool" else (q, k, v, attn_mask)
    grads, do = grads_of(o, inputs, seed=1)
    full = attn_mask.detach().expand(1, 2, 37, 45)
    check_grads(grads[:3], q, k, v, do, causal, "bottom_right", "bhsd", attn_mask=full)
    if mask == "bias":
        check_mask_grad(grads[3], q, k, v, do, causal, "bottom_right", attn_mask=attn_mask.detach())


@pytest.mark.skipif(DEVICE != "cpu", reason="the sm80 table's tiles, run by the interpreter")
@pytest.mark.parametrize("head_dim,causal,deterministic,mask", [(64, True, False, None), (64, False, True, "bool"),
                                                                (64, True, False, "bias"), (128, True, False, None),
                                                                (128, False, False, "bias"), (128, True, True, "bool")])
def test_sm80_tiles_have_the_reference_gradients(monkeypatch, head_dim, causal, deterministic, mask):
    """The tiles NVIDIA GPUs before Hopper take (:data:`fmha.backward.SM80_TILES`, beside a mask
    :data:`fmha.backward.SM80_TILES_MASKED`: one stage, 32- to 128-row blocks, dQ by atomics or its own kernel),
    run by the interpreter: dQ, dK, dV and a bias's own gradient against float64."""
    from fmha.verify import check_mask_grad
    monkeypatch.setattr(backward, "family_of", lambda device: "sm80")
    q, k, v = leaves(*make_qkv(1, 2, 1, 37, 45, head_dim, torch.bfloat16, "bhsd", seed=head_dim))
    g = torch.Generator().manual_seed(head_dim)
    attn_mask = None
    if mask == "bool":
        attn_mask = (torch.rand(1, 1, 37, 45, generator=g) < 0.7).to(DEVICE)
    elif mask == "bias":
        attn_mask = torch.randn(1, 2, 37, 45, generator=g).to(DEVICE).requires_grad_(True)
    o = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", deterministic=deterministic,
                       attn_mask=attn_mask)
    grads, do = grads_of(o, (q, k, v) if mask != "bias" else (q, k, v, attn_mask), seed=1)
    full = None if attn_mask is None else attn_mask.detach().expand(1, 2, 37, 45)
    check_grads(grads[:3], q, k, v, do, causal, "bottom_right", "bhsd", attn_mask=full)
    if mask == "bias":
        check_mask_grad(grads[3], q, k, v, do, causal, "bottom_right", attn_mask=attn_mask.detach())
    if mask is None:  # the table's row ran
        kv, _ = backward.tiles(head_dim, causal, deterministic, "sm80")
        assert f"dK/dV {kv['BLOCK_M']}x{kv['BLOCK_N']} warps=8 stages=1" in backward.describe(
            q, k, v, causal=causal, deterministic=deterministic)


@pytest.mark.parametrize("shared,head_dim,causal,deterministic", [
    (101376, 256, True, False), (101376, 256, False, True), (166912, 256, True, False), (101376, 128, True, False)])
def test_small_shared_memory_tiles_have_the_reference_gradients(monkeypatch, shared, head_dim, causal, deterministic):
    """The NVIDIA tiles of a GPU with less shared memory than sm_90's (:data:`fmha.backward.SMALL_SHARED`: 32 x 32
    past head_dim 128, dQ in its own kernel; 64 x 64 dQ tiles at 128 under 105 KB), run by the interpreter on the CPU
    and compiled on a GPU: the walks over ragged ends and the causal band hold for them."""
    monkeypatch.setattr(backward, "family_of", lambda device: "nvidia")
    monkeypatch.setattr(backward, "_shared", lambda device: shared)
    q, k, v = leaves(*make_qkv(1, 2, 1, 37, 45, head_dim, torch.bfloat16, "bhsd", seed=head_dim))
    o = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", deterministic=deterministic)
    grads, do = grads_of(o, (q, k, v), seed=1)
    check_grads(grads, q, k, v, do, causal, "bottom_right", "bhsd")
    small = backward.SMALL_SHARED[256 if head_dim > 128 else 128][1]
    assert f"dQ {small[0]}x{small[1]} warps={small[2]}" in backward.describe(q, k, v, causal=causal,
                                                                             deterministic=deterministic)


@pytest.mark.parametrize("head_dim,head_dim_v,causal,deterministic,layout", [
    (256, 256, False, False, "bhsd"), (256, 256, True, True, "bshd"), (192, 128, True, False, "bhsd"),
    (160, 160, False, True, "bhsd"), (192, 32, False, False, "bshd"), (136, 136, True, False, "bhsd")])
def test_column_halves_have_the_reference_gradients(monkeypatch, head_dim, head_dim_v, causal, deterministic,
                                                    layout):
    """The dK/dV kernel with a block's columns in two programs (``HALVES``: each program one half of dK, dV and dQ,
    both computing P and dS over every column from the operands' two halves; the second half of a V narrower than
    its tile holds none of it), beside GQA, ragged ends, the causal band and both dQ modes."""
    table = backward.tiles
    rows = (16, 16, 4, 1) if DEVICE == "cpu" else (64, 64, 8, 1)

    def tiles(*args, **kw):
        kv, dq = table(*args, **kw)
        return backward._t(*rows, 0, True), dq and backward._t(*rows)
    monkeypatch.setattr(backward, "tiles", tiles)
    q, k, _ = make_qkv(2, 4, 2, 37, 45, head_dim, torch.bfloat16, layout, seed=head_dim)
    v = make_qkv(2, 4, 2, 37, 45, head_dim_v, torch.bfloat16, layout, seed=1)[2]
    q, k, v = leaves(q, k, v)
    o = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", layout=layout, deterministic=deterministic)
    grads, do = grads_of(o, (q, k, v), seed=2)
    check_grads(grads, q, k, v, do, causal, "bottom_right", layout)
    assert "in column halves" in backward.describe(q, k, v, causal=causal, layout=layout, deterministic=deterministic)


def test_describe_names_the_backward_that_runs(monkeypatch):
    """:func:`fmha.backward.describe` says which backward runs and with which tiles, as :func:`fmha.backward.dense`
    picks them: the table's tiles (AMD's here, the family patched), dQ from its own kernel when deterministic; the
    Gluon kernel's tiles (V's own 128-wide tiles and two stages at DeepSeek's 192/128)."""
    from fmha import backward
    q, k, v = make_qkv(1, 2, 1, 37, 45, 64, torch.bfloat16, "bhsd", seed=0)
    monkeypatch.setattr(backward, "family_of", lambda device: "cdna")
    (m, n, w), _, (qm, qn, qw), _ = backward.AMD_TILES["cdna"][64]
    assert backward.describe(q, k, v, deterministic=True) == (
        f"triton backward dK/dV {m}x{n} warps={w} stages=1, dQ {qm}x{qn} warps={qw} stages=1, deterministic")
    assert backward.describe(q, k, v, causal=True).endswith(", dQ added atomically")
    monkeypatch.setattr(backward, "family_of", lambda device: "rdna")
    q, k, v = make_qkv(1, 2, 1, 37, 45, 256, torch.bfloat16, "bhsd", seed=0)
    assert backward.describe(q, k, v) == ("triton backward dK/dV 16x32 warps=16 stages=1 qk_chunks=16, "
                                          "dQ 32x16 warps=16 stages=1 qk_chunks=16")
    # where the Gluon kernel would run (patched in: it needs sm_90), its tiles past head_dim 128 as the call takes them
    monkeypatch.setattr(backward, "kernel", lambda *a, **kw: "hopper")
    q, k, _ = make_qkv(1, 2, 1, 37, 45, 192, torch.bfloat16, "bhsd", seed=0)
    v = make_qkv(1, 2, 1, 37, 45, 128, torch.bfloat16, "bhsd", seed=1)[2]
    assert backward.describe(q, k, v) == ("hopper backward BLOCK_M=64 BLOCK_N=64 stages=2 ds_bufs=1 rs=0 dq_rows=64 "
                                          "dq_cols=64 dk_dv in column halves early_free v_tiles=128")
    q, k, v = make_qkv(1, 2, 1, 37, 45, 256, torch.bfloat16, "bhsd", seed=0)
    assert "stages=1" in backward.describe(q, k, v) and "v_tiles" not in backward.describe(q, k, v)


@pytest.mark.parametrize("mods", [{"window": (6, 0)}, {"window": (4, 3)}, {"softcap": 5.0},
                                  {"alibi_slopes": "alibi"}, {"softcap": 8.0, "window": (9, -1)}], ids=str)
def test_modifiers_have_their_gradients(mods):
    q, k, v = leaves(*make_qkv(1, 4, 2, 29, 35, 32, torch.bfloat16, seed=3))
    if mods.get("alibi_slopes") == "alibi":
        mods = {"alibi_slopes": torch.tensor([0.5, 0.25, 0.125, 0.0625], device=DEVICE)}
    o = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", **mods)
    grads, do = grads_of(o, (q, k, v))
    check_grads(grads, q, k, v, do, True, "bottom_right", **mods)


def test_alibi_slopes_per_batch_and_head_have_their_gradients():
    """``[batch, heads]`` slopes through the Triton backward: each batch's gradients those of its own row."""
    q, k, v = leaves(*make_qkv(2, 4, 2, 29, 35, 32, torch.bfloat16, seed=8))
    slopes = torch.tensor([[0.5, 0.25, 0.125, 0.0625], [0.03, 0.7, 0.2, 0.4]], device=DEVICE)
    o = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", alibi_slopes=slopes)
    grads, do = grads_of(o, (q, k, v))
    check_grads(grads, q, k, v, do, True, "bottom_right", alibi_slopes=slopes)


def test_seqused_k_keys_get_no_gradient_past_their_length():
    q, k, v = leaves(*make_qkv(2, 2, 2, 16, 40, 32, torch.float16, seed=4))
    used = torch.tensor([40, 13], dtype=torch.int32, device=DEVICE)
    o = fmha.attention(q, k, v, seqused_k=used)
    (dq, dk, dv), do = grads_of(o, (q, k, v))
    for b, n in enumerate((40, 13)):
        one = (slice(b, b + 1),)
        keys = (slice(b, b + 1), slice(None), slice(0, n))
        check_grads((dq[one], dk[keys], dv[keys]), q[one], k[keys], v[keys], do[one], False)
    assert not dk[1, :, 13:].any() and not dv[1, :, 13:].any()


@pytest.mark.parametrize("deterministic", [False, True])
def test_varlen_gradients_are_each_sequence_alone(deterministic):
    lens_q, lens_k = [5, 17, 1], [9, 17, 30]
    q, cu_q = packed(lens_q, 4, 64, torch.bfloat16, 5)
    k, cu_k = packed(lens_k, 2, 64, torch.bfloat16, 6)
    v, _ = packed(lens_k, 2, 64, torch.bfloat16, 7)
    q, k, v = leaves(q, k, v)
    o = fmha.attention_varlen(q, k, v, cu_q, cu_k, 17, 30, causal=True, deterministic=deterministic)
    (dq, dk, dv), do = grads_of(o, (q, k, v))
    for b in range(3):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        as_bshd = lambda t, rows: t[rows][None]  # noqa: E731
        check_grads([as_bshd(g, r) for g, r in ((dq, rq), (dk, rk), (dv, rk))], as_bshd(q, rq), as_bshd(k, rk),
                    as_bshd(v, rk), as_bshd(do, rq), True, "bottom_right", "bshd")


def test_the_cast_of_packed_rows_skips_each_sequences_room():
    """The Gluon backward's float32 dQ holds packed sequence b's rows ``b * gap`` rows further on (a last tile's
    rows past a sequence's end are added into that room): the cast reads each sequence's rows from there into
    its place in q's packed rows, and writes nothing else."""
    lens, heads, d, gap = [5, 0, 70, 3], 2, 40, 16
    cu = packed(lens, 1, 1, torch.float32, 0)[1]
    src = torch.randn(heads, sum(lens) + len(lens) * gap, 64, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    dst = torch.full((sum(lens), heads, d), float("nan"), dtype=torch.float16, device=DEVICE)
    backward._cast(src, (0, src.stride(0), src.stride(1)), dst, (0, dst.stride(1), dst.stride(0)), len(lens), heads,
                   max(lens), d, cu, gap)
    for b in range(len(lens)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        want = src[:, int(cu[b]) + b * gap:int(cu[b + 1]) + b * gap, :d].transpose(0, 1).to(torch.float16)
        assert torch.equal(dst[rows], want), b


CALLS = {  # the Triton kernels' paths: dQ added atomically, dQ's own kernel, a window and softcap, packed rows
    "atomic-d64": ((2, 4, 2, 512, 512, 64), dict(causal=True)),
    "dq-kernel-d128": ((2, 4, 2, 300, 700, 128), dict()),
    "window-softcap": ((1, 4, 2, 400, 400, 64), dict(causal=True, window=(100, 0), softcap=20.0)),
    "varlen": (None, dict(causal=True)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", list(CALLS))
def test_the_triton_backward_replays_as_it_ran(case, deterministic, monkeypatch):
    """The Triton kernels' backward, replayed (:mod:`fmha.replay`, conftest's ``replays_as_it_ran``): a float32
    dQ zeroed and cast by launches again at every call, packed sequences returned in their own shapes."""
    shape, kw = CALLS[case]
    if shape is None:
        lens = [300, 129, 77]
        inputs = [(packed(lens, 8, 64, torch.bfloat16, s)[0], packed(lens, 2, 64, torch.bfloat16, s + 1)[0],
                   packed(lens, 2, 64, torch.bfloat16, s + 2)[0]) for s in (3, 6, 9)]
        cu = packed(lens, 1, 1, torch.bfloat16, 0)[1]
        run = lambda q, k, v: fmha.attention_varlen(q, k, v, cu, cu, 300, 300, deterministic=deterministic,  # noqa: E731
                                                    **kw)
    else:
        inputs = [make_qkv(*shape, torch.bfloat16, seed=60 + s) for s in range(3)]
        run = lambda q, k, v: fmha.attention(q, k, v, deterministic=deterministic, **kw)  # noqa: E731

    def grads(qkv, seed):
        q, k, v = leaves(*qkv)
        o = run(q, k, v)
        do = torch.randn(o.shape, generator=torch.Generator(device=DEVICE).manual_seed(seed), device=DEVICE,
                         dtype=o.dtype)
        return torch.autograd.grad(o, (q, k, v), do), (q, k, v, do)
    for found, (q, k, v, do) in replays_as_it_ran(inputs, grads, deterministic, monkeypatch):
        assert [g.shape for g in found] == [q.shape, k.shape, v.shape]
        if shape is not None:  # (packed rows: their shapes; their values are replay-checked as the rest)
            mods = {n: kw[n] for n in ("window", "softcap") if n in kw}
            check_grads(found, q, k, v, do, kw.get("causal", False), "top_left", **mods)


def test_strided_inputs_and_rows_that_see_no_key():
    """Views of larger buffers read in place; bottom-right with more queries than keys leaves rows with no
    visible key: zero gradients there, never NaN."""
    q, k, v = leaves(*make_qkv(1, 2, 1, 30, 12, 64, torch.float16, contiguous=False, seed=8))
    o = fmha.attention(q, k, v, causal=True, causal_align="bottom_right")
    (dq, dk, dv), do = grads_of(o, (q, k, v))
    check_grads((dq, dk, dv), q, k, v, do, True, "bottom_right")
    assert not dq[:, :, :18].any()


@st.composite
def problems(draw):
    kv_heads = draw(st.integers(1, 2))
    return dict(batch=draw(st.integers(1, 2)), kv_heads=kv_heads, heads=kv_heads * draw(st.sampled_from([1, 2, 3])),
                seqlen_q=draw(st.integers(1, 40)), seqlen_k=draw(st.integers(1, 40)),
                head_dim=draw(st.sampled_from([32, 64, 96])), dtype=draw(st.sampled_from([torch.float16,
                                                                                          torch.bfloat16])),
                layout=draw(st.sampled_from(["bhsd", "bshd"])), contiguous=draw(st.booleans()),
                causal=draw(st.booleans()), align=draw(st.sampled_from(["top_left", "bottom_right"])),
                window=(draw(st.integers(-1, 45)), draw(st.integers(-1, 45))),
                softcap=draw(st.sampled_from([0.0, 0.0, 4.0])), alibi=draw(st.booleans()),
                seqused=draw(st.booleans()), sinks=draw(st.booleans()), deterministic=draw(st.booleans()),
                seed=draw(st.integers(0, 2 ** 16)))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=problems())
def test_random_problems_have_the_reference_gradients(p):
    """Shapes, layouts, alignments and every modifier drawn together; with ``seqused``, keys past each
    batch's drawn length hold NaN, which must never reach a gradient."""
    q, k, v, mods, used = drawn_inputs(p)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    o = fmha.attention(q, k, v, causal=p["causal"], causal_align=p["align"], layout=p["layout"],
                       seqused_k=used.to(DEVICE) if p["seqused"] else None, deterministic=p["deterministic"], **mods)
    (dq, dk, dv), do = grads_of(o, (q, k, v), seed=p["seed"])
    for b, n in enumerate(used.tolist()):
        keys = (slice(b, b + 1), slice(None), slice(0, n)) if p["layout"] == "bhsd" else (slice(b, b + 1), slice(0, n))
        own = slice(b, b + 1)
        check_grads((dq[own], dk[keys], dv[keys]), q[own], k[keys], v[keys], do[own], p["causal"], p["align"],
                    p["layout"], **mods)


def test_deterministic_repeats_bit_for_bit():
    """``deterministic=True``: the same gradients on every run; the fast backward agrees with it within
    rounding (float32 sums in another order)."""
    q, k, v = make_qkv(2, 4, 2, 70, 90, 64, torch.bfloat16, seed=9)
    runs = []
    for deterministic in (True, True, False):
        leaf = leaves(q, k, v)
        o = fmha.attention(*leaf, causal=True, causal_align="bottom_right", deterministic=deterministic)
        runs.append(grads_of(o, leaf)[0])
    assert all(torch.equal(a, b) for a, b in zip(runs[0], runs[1]))
    for fast, exact in zip(runs[2], runs[0]):  # another kernel on sm_90 (the Gluon one), other sums elsewhere
        torch.testing.assert_close(fast, exact, rtol=1e-2, atol=1e-2)


def test_only_what_requires_grad_gets_it():
    q, k, v = make_qkv(1, 2, 2, 9, 9, 32, torch.bfloat16)
    (v,) = leaves(v)
    o, lse = fmha.attention(q, k, v, return_lse=True)
    assert not lse.requires_grad
    o.float().sum().backward()
    assert v.grad is not None and q.grad is None and k.grad is None


def test_no_grad_and_inference_record_nothing():
    q, k, v = leaves(*make_qkv(1, 2, 2, 9, 9, 32, torch.float16))
    with torch.no_grad():
        assert fmha.attention(q, k, v).grad_fn is None
    with torch.inference_mode():
        assert fmha.attention(q, k, v).grad_fn is None


def test_what_has_no_backward_says_so():
    q, k, v = leaves(*make_qkv(1, 2, 2, 9, 9, 32, torch.float16))
    with pytest.raises(ValueError, match="out= is not differentiable"):
        fmha.attention(q, k, v, out=torch.empty_like(q))
    o = fmha.attention(q, k, v)
    with pytest.raises(RuntimeError, match="first-order only"):
        torch.autograd.grad(o.float().sum(), q, create_graph=True)
    pool = torch.randn(2, 16, 2, 32, dtype=torch.float16, device=DEVICE, requires_grad=True)
    table = torch.tensor([[1, 0]], dtype=torch.int32, device=DEVICE)
    o = fmha.attention_paged(q.detach()[:, :, :3].transpose(1, 2), pool, pool, table,
                             torch.tensor([20], dtype=torch.int32, device=DEVICE), layout="bshd")
    with pytest.raises(RuntimeError, match="inference-only"):
        o.sum().backward()
    assert "inference-only" in PAGED_MESSAGE


@pytest.mark.parametrize("modified", [False, True], ids=["plain", "window-softcap-alibi-seqused-sinks"])
def test_torch_compile_traces_forward_and_backward(modified):
    """fullgraph=True: the custom op and its backward op carry every modifier and the sinks (their gradient
    included)."""
    q, k, v = leaves(*make_qkv(2, 2, 2, 17, 23, 64, torch.bfloat16))
    eager = leaves(q, k, v)
    mods, sinks = {}, [None, None]
    if modified:
        mods = dict(causal_align="bottom_right", window=(5, 0), softcap=4.0,
                    alibi_slopes=torch.tensor([0.5, 0.25], device=DEVICE),
                    seqused_k=torch.tensor([23, 9], dtype=torch.int32, device=DEVICE))
        sinks = leaves(torch.tensor([0.7, -0.4], device=DEVICE), torch.tensor([0.7, -0.4], device=DEVICE))

    def block(q, k, v, sinks):
        return (fmha.attention(q * 1.0, k, v, causal=True, sinks=sinks, **mods).float() ** 2).sum()

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    compiled(q, k, v, sinks[0]).backward()
    block(*eager, sinks[1]).backward()
    for a, b in zip((q, k, v, *sinks[:1]), (*eager, *sinks[1:])):
        if a is not None:
            torch.testing.assert_close(a.grad, b.grad)


class TinyAttention(torch.nn.Module):
    """A projection to q, k, v, fmha's causal attention and a projection out: a step of it trains
    fmha's backward through whatever compiles the module."""

    def __init__(self, dim=64, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = torch.nn.Linear(dim, 3 * dim, bias=False)
        self.out = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        return self.out(fmha.attention(q, k, v, causal=True, layout="bshd").reshape(b, s, d))


def train_steps(model, x, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = (model(x).float() ** 2).mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_torch_compile_trains_a_step():
    """torch.compile(fullgraph=True) of a module around fmha takes optimizer steps: its losses and weights
    follow the eager module's from the same start."""
    torch.manual_seed(0)
    eager = TinyAttention().to(DEVICE, torch.bfloat16)
    compiled_model = TinyAttention().to(DEVICE, torch.bfloat16)
    compiled_model.load_state_dict(eager.state_dict())
    x = torch.randn(2, 24, 64, device=DEVICE, dtype=torch.bfloat16)
    backend = "inductor" if DEVICE == "cuda" else "aot_eager"
    got = train_steps(torch.compile(compiled_model, backend=backend, fullgraph=True), x)
    want = train_steps(eager, x)
    assert got[-1] < got[0]
    np.testing.assert_allclose(got, want, rtol=2e-2)
    for a, b in zip(compiled_model.parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


def test_reference_backward_is_float64_autograd():
    """The float64 backward written out (P, dV, dP, delta, dS) equals autograd of the definition."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 4, n, 16, generator=g, dtype=torch.float64) for n in (11, 13, 13))
    k, v = k[:, :2], v[:, :2]
    do = torch.randn(1, 4, 11, 16, generator=g, dtype=torch.float64)
    slopes = torch.tensor([0.3, 0.2, 0.1, 0.05], dtype=torch.float64)
    kw = dict(causal=True, causal_align="bottom_right", window=(5, -1), softcap=3.0, alibi_slopes=slopes)
    ref = reference.dense_attention_backward(q, k, v, do, **kw)
    qa, ka, va = (t.clone().requires_grad_(True) for t in (q, k, v))
    s = (qa @ ka.repeat_interleave(2, 1).transpose(-1, -2)) / 4.0
    s = 3.0 * torch.tanh(s / 3.0)
    i = torch.arange(11)[:, None] + 2
    s = s - slopes[None, :, None, None] * (i - torch.arange(13)[None, :]).abs()
    s = s.masked_fill(~torch.from_numpy(reference.visible(11, 13, True, "bottom_right", (5, -1))), float("-inf"))
    (torch.softmax(s, -1) @ va.repeat_interleave(2, 1)).backward(do)
    for a, r in zip((qa, ka, va), ref):
        np.testing.assert_allclose(a.grad.numpy(), r, atol=1e-12)


def test_transformers_trains_through_fmha():
    """One training step of a small Llama with attn_implementation="fmha": the loss and every
    parameter's gradient agree with "sdpa"'s from the same weights."""
    transformers = pytest.importorskip("transformers")
    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    models = {impl: transformers.LlamaForCausalLM._from_config(cfg, attn_implementation=impl,
                                                               dtype=torch.bfloat16).to(DEVICE)
              for impl in ("sdpa", "fmha")}
    models["fmha"].load_state_dict(models["sdpa"].state_dict())
    ids = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    losses = {}
    for impl, m in models.items():
        m.train()
        losses[impl] = m(ids, labels=ids).loss
        losses[impl].backward()
    torch.testing.assert_close(losses["fmha"], losses["sdpa"], atol=2e-2, rtol=0)
    named = dict(models["sdpa"].named_parameters())
    for name, p in models["fmha"].named_parameters():
        ref = named[name].grad
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert (p.grad - ref).norm() <= 0.05 * ref.norm() + 1e-6, name


def test_train_demo_curves_agree():
    """Three steps of ``python -m fmha train-demo``'s run: the same losses to bfloat16 noise, falling."""
    from fmha import train_demo
    out = train_demo.run(3, "tiny", DEVICE, seed=1)
    assert len(out["fmha"]) == len(out["sdpa"]) == 3 and out["max_diff"] < 2e-2, out
    assert out["fmha"][-1] < out["fmha"][0]


@pytest.mark.skipif(DEVICE != "cpu", reason="float32 kernels are exact only in the interpreter (ieee dots)")
@pytest.mark.parametrize("mods,deterministic", [(dict(causal=True, causal_align="bottom_right", softcap=2.0), False),
                                               (dict(window=(2, 1)), True)], ids=str)
def test_gradcheck_through_the_interpreter(mods, deterministic):
    """``torch.autograd.gradcheck`` on the autograd function itself (the entry points take only fp16/bf16):
    float64 inputs, float32 kernels in the interpreter, finite differences against the backward kernels,
    the sinks' gradient included."""
    from fmha import gradients
    kw = dict(causal=False, scale=None, variant="auto", causal_align="top_left", layout="bhsd", config=None,
              window=(-1, -1), softcap=0.0, num_splits=0)
    kw.update(mods)

    def f(q, k, v, sinks):
        o, _ = gradients.Attention.apply(q.float(), k.float(), v.float(), None, None, sinks.float(), kw, deterministic)
        return o.double()
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 3, 16, generator=g, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(1, 1, 5, 16, generator=g, dtype=torch.float64, requires_grad=True) for _ in "kv")
    sinks = torch.tensor([0.3, -1.0], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (q, k, v, sinks), eps=1e-3, atol=2e-3, rtol=2e-3)
    assert torch.autograd.gradcheck(f, (q, k, v, sinks), eps=1e-3, atol=2e-3, rtol=2e-3, fast_mode=True)


TILE = max(max(t["BLOCK_M"], t["BLOCK_N"]) for t in backward.tiles(32, True, True, "interpreter"))


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter's tiles")
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_gradients_at_every_band_edge(causal, deterministic):
    """The backward's whole-tile skips and masks at every alignment of an edge against its tiles: a window's
    lower edge moved through every residue of the tile, over several tiles, with the keys ending mid-tile;
    causal, the diagonal too (bottom-right, the keys one more each time)."""
    n = 5 * TILE + 3
    q0, k0, v0 = make_qkv(1, 2, 1, n, n + TILE, 32, torch.float16, seed=7)
    cases = [(n, "top_left", (left, -1)) for left in range(2 * TILE, 3 * TILE + 1)]
    cases += [(n + extra, "bottom_right", (-1, -1)) for extra in range(TILE + 1)] if causal else []
    for i, (sk, align, window) in enumerate(cases):
        q, k, v = leaves(q0, k0[:, :, :sk], v0[:, :, :sk])
        o = fmha.attention(q, k, v, causal=causal, causal_align=align, window=window, deterministic=deterministic)
        grads, do = grads_of(o, (q, k, v), seed=i)
        check_grads(grads, q, k, v, do, causal, align, window=window)


@pytest.mark.parametrize("deterministic", [False, True])
def test_keys_past_the_end_stay_out_when_every_score_is_far_below_zero(deterministic):
    """A key tile past the keys' end reads zeros, whose score 0 would stand e^140 above a row's LSE here: unless
    the keys past the end are masked, the zeros' P overflows and dQ turns NaN (inf * 0)."""
    q, k, v = make_qkv(1, 2, 1, 20, 37, 32, torch.float16, seed=8)
    q, k = leaves(torch.full_like(q, 5.0) + 0.1 * q, torch.full_like(k, -5.0) + 0.1 * k)
    (v,) = leaves(v)
    o = fmha.attention(q, k, v, deterministic=deterministic)
    grads, do = grads_of(o, (q, k, v))
    assert all(torch.isfinite(g).all() for g in grads)
    check_grads(grads, q, k, v, do, False)
