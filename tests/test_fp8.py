"""Float8 K and V (an FP8 KV cache; q float8 too or 16-bit) with FlashAttention-3's descale factors,
against the float64 reference of the dequantized inputs, beside PyTorch's bfloat16 attention of the
same values rounded to bfloat16."""
import numpy as np
import pytest
import torch

import fmha
from conftest import DEVICE
from fmha import reference
from fmha.verify import max_err, torch_lowp

F8 = torch.float8_e4m3fn


def fp8_inputs(b, h, kvh, sq, sk, d, q_dtype, seed=0):
    """float8 k, v (q float8 or ``q_dtype``) in bhsd, per-(batch, kv head) descale factors, and the
    dequantized float64 tensors they stand for."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, s, d, generator=g) * x for n, s, x in ((h, sq, 1.0), (kvh, sk, 3.0), (kvh, sk, 2.0)))
    scales = [torch.rand(b, kvh, generator=g) + 0.5 for _ in range(3)]
    q8 = q.to(F8) if q_dtype == F8 else q.to(q_dtype)
    k8, v8 = k.to(F8), v.to(F8)
    qs = scales[0] if q_dtype == F8 else torch.ones(b, kvh)
    full = [t.double() * s.double().repeat_interleave(t.shape[1] // kvh, 1)[:, :, None, None]
            for t, s in ((q8, qs), (k8, scales[1]), (v8, scales[2]))]
    descales = [s.to(DEVICE) for s in scales]
    if q_dtype != F8:
        descales[0] = None
    return (q8.to(DEVICE), k8.to(DEVICE), v8.to(DEVICE)), descales, full


def check_fp8(o, full, causal, align="top_left", **mods):
    """``o`` against the float64 reference of the dequantized inputs: within twice PyTorch's bfloat16
    attention of them (rounded to bfloat16) plus one bfloat16 step of the output's size."""
    ref = reference.dense_attention(*full, causal=causal, causal_align=align, **mods)
    base = max_err(torch_lowp(*(t.to(torch.bfloat16) for t in full), causal, align, **mods), ref)
    err = max_err(o.detach().cpu().double().numpy(), ref)
    assert err <= 2 * base + 2.0 ** -8 * np.abs(ref).max(), (err, base)
    return err, base


def check_fp8_p(o, lse, full, causal, align="top_left"):
    """``o`` and ``lse`` of a kernel that rounds P itself to float8 (the float8 wgmma's P V) against float64
    attention of the dequantized inputs.  Each probability's rounding is off by up to 2**-4 of it, at random,
    so an output's error is about ``2**-4 / sqrt(3) * sqrt(sum_j p_j**2 v_j**2) / sum_j p_j`` (sigma): within
    7 sigma, plus a bfloat16 step of the output and a thousandth of V's largest value (the float8 products'
    accumulation).  The LSE: within 2**-10 of the largest ``scale * |q| . |k|`` (the tensor core adds float8
    products in about 14 bits) plus 2e-3."""
    q, k, v = (t.double() for t in full)
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = q.shape[-1] ** -0.5
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        sq, sk = s.shape[-2:]
        shift = sk - sq if align == "bottom_right" else 0
        keep = torch.arange(sk)[None, :] <= torch.arange(sq)[:, None] + shift
        s = s.masked_fill(~keep, float("-inf"))
    p = torch.softmax(s, -1)
    ref = p @ v
    sigma = 2.0 ** -4 / 3 ** 0.5 * ((p * p) @ (v * v)).sqrt()
    err = (o.detach().cpu().double() - ref).abs()
    bound = 7 * sigma + 2.0 ** -7 * ref.abs() + 1e-3 * v.abs().max()
    assert (err <= bound).all(), (err.max().item(), (err / bound).max().item())
    lse_err = (lse.detach().cpu().double() - torch.logsumexp(s, -1)).abs().max().item()
    assert lse_err <= 2.0 ** -10 * scale * (q.abs() @ k.abs().transpose(-1, -2)).max().item() + 2e-3, lse_err
    return err.max().item()


@pytest.mark.parametrize("q_dtype", [F8, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_fp8_matches_the_dequantized_reference(q_dtype, causal, align, layout):
    """float8 K/V on ``tiled`` (dequantized on load) under each q dtype, in either layout, against the float64
    reference of the dequantized inputs (the Gluon kernel's float8 has its own test below)."""
    (q, k, v), descales, full = fp8_inputs(2, 4, 2, 37, 53, 64, q_dtype, seed=3)
    qq, kk, vv = (t if layout == "bhsd" else t.transpose(1, 2).contiguous() for t in (q, k, v))
    dtype = torch.bfloat16 if q_dtype == F8 else q_dtype
    out = torch.full((*qq.shape[:-1], 64), float("nan"), dtype=dtype, device=DEVICE)
    o, lse = fmha.attention(qq, kk, vv, causal=causal, causal_align=align, layout=layout, out=out, return_lse=True,
                            q_descale=descales[0], k_descale=descales[1], v_descale=descales[2], variant="tiled")
    assert o is out and o.dtype == dtype
    o = o if layout == "bhsd" else o.transpose(1, 2)
    check_fp8(o, full, causal, align)
    _, ref_lse = reference.dense_attention(*full, causal=causal, causal_align=align, return_lse=True)
    assert max_err(lse.cpu().double().numpy(), ref_lse) < 2e-3


def test_fp8_decoding_splits_the_keys_and_takes_the_modifiers():
    """One query row against 300 keys split three ways (each split's partial carries v's factor), and
    the score modifiers on the descaled scores."""
    (q, k, v), descales, full = fp8_inputs(2, 8, 2, 1, 300, 128, F8, seed=4)
    o = fmha.attention(q, k, v, num_splits=3, q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    check_fp8(o, full, False)
    o = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", window=(40, -1), softcap=20.0,
                       q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    check_fp8(o, full, True, "bottom_right", window=(40, -1), softcap=20.0)


@pytest.mark.parametrize("sq", [1, 40])
def test_fp8_kv_by_tma(sq):
    """float8 K/V read by TMA (config tma=1, as the sm_90 decode table asks): the split decode with packed
    GQA rows and a prefill, widened after the load, against the dequantized reference."""
    (q, k, v), descales, full = fp8_inputs(2, 8, 2, sq, 300, 128, F8, seed=6)
    cfg = fmha.KernelConfig(16 if sq < 16 else 32, 64, 4, 2, split_per_sm=1, tma=1)
    o = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", variant="tiled", config=cfg,
                       num_splits=3 if sq < 16 else 0, q_descale=descales[0], k_descale=descales[1],
                       v_descale=descales[2])
    check_fp8(o, full, True, "bottom_right")


def test_fp8_without_factors_reads_the_values_as_they_are():
    (q, k, v), _, _ = fp8_inputs(1, 2, 1, 16, 40, 32, F8, seed=5)
    full = [q.cpu().double(), k.cpu().double(), v.cpu().double()]  # factors of 1
    check_fp8(fmha.attention(q, k, v, causal=True), full, True)


def test_what_fp8_does_not_take_is_refused():
    (q, k, v), descales, _ = fp8_inputs(1, 2, 1, 8, 8, 32, F8)
    with pytest.raises(NotImplementedError, match="float8 attention has no backward"):
        fmha.attention(q.to(torch.bfloat16).requires_grad_(True), k, v)
    with pytest.raises(NotImplementedError, match="no attention sinks"):
        fmha.attention(q, k, v, sinks=torch.zeros(2, device=DEVICE))
    with pytest.raises(ValueError, match=r"k_descale must be a float32 tensor of shape \[batch, kv_heads\] = \[1, 1\]"):
        fmha.attention(q, k, v, k_descale=torch.ones(2, device=DEVICE))
    with pytest.raises(ValueError, match="q_descale scales a float8 q"):
        fmha.attention(q.to(torch.bfloat16), k, v, q_descale=descales[0])
    with pytest.raises(ValueError, match="scale float8 inputs"):
        fmha.attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16), v_descale=descales[2])
    with pytest.raises(TypeError, match="float8_e4m3fn k and v"):
        fmha.attention(q, k, v.to(torch.bfloat16))
    with pytest.raises(ValueError, match="variant 'singlewave' cannot take this call: float8 K/V run on the tiled"):
        fmha.attention(q, k, v, variant="singlewave")
    with pytest.raises(TypeError, match="float8 inputs run through fmha.attention"):
        fmha.attention_varlen(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                              torch.tensor([0, 8], dtype=torch.int32, device=DEVICE),
                              torch.tensor([0, 8], dtype=torch.int32, device=DEVICE), 8, 8)


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


@pytest.mark.gpu
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "bottom_right"), (True, "top_left")])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("d,sq,sk", [(128, 300, 300), (128, 200, 333), (96, 129, 130), (128, 1000, 1000),
                                     (64, 300, 300), (64, 200, 333), (64, 640, 2560), (64, 2048, 2048)])
def test_fp8_on_hopper_matches_the_dequantized_reference(causal, align, layout, d, sq, sk):
    """float8 q, k, v on the Gluon kernel (wgmma's float8 form, V transposed for P V, P rounded to float8):
    GQA, per-(batch, kv head) factors, lengths off the tiles, against the float64 reference of the
    dequantized inputs; the output poisoned first."""
    if not _sm90():
        pytest.skip("the Gluon kernel needs an sm_90 GPU")
    (q, k, v), descales, full = fp8_inputs(2, 8, 2, sq, sk, d, F8, seed=sq + d)
    qq, kk, vv = (t if layout == "bhsd" else t.transpose(1, 2).contiguous() for t in (q, k, v))
    out = torch.full((*qq.shape[:-1], d), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    o, lse = fmha.attention(qq, kk, vv, causal=causal, causal_align=align, layout=layout, out=out, return_lse=True,
                            variant="hopper", q_descale=descales[0], k_descale=descales[1], v_descale=descales[2])
    o = o if layout == "bhsd" else o.transpose(1, 2)
    check_fp8_p(o, lse, full, causal, align)
    assert fmha.api.describe(q, k, v, causal=causal).startswith("hopper")  # auto's pick for float8 q on sm_90
    kw = dict(causal=causal, causal_align=align, layout=layout, q_descale=descales[0], k_descale=descales[1],
              v_descale=descales[2])
    again = fmha.attention(qq, kk, vv, **kw)  # auto: a new kind (no out=), then its replay
    again = fmha.attention(qq, kk, vv, **kw)
    assert torch.equal(again if layout == "bhsd" else again.transpose(1, 2), o)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "bottom_right"), (True, "top_left")])
@pytest.mark.parametrize("rows", [128, 192])
@pytest.mark.parametrize("d,sq,sk", [(128, 300, 300), (128, 200, 333), (96, 129, 130), (64, 640, 2560)])
def test_fp8_on_hopper_in_64_key_tiles(causal, align, rows, d, sq, sk):
    """float8 in 64-key tiles (P V's K 64 a tile, V^T's boxes 64 bytes wide), two warpgroups or three taking turns:
    lengths off the tiles, GQA, against the float64 reference of the dequantized inputs; the output poisoned."""
    if not _sm90():
        pytest.skip("the Gluon kernel needs an sm_90 GPU")
    (q, k, v), descales, full = fp8_inputs(2, 8, 2, sq, sk, d, F8, seed=sq + d + rows)
    out = torch.full((*q.shape[:-1], d), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    config = fmha.KernelConfig(rows, 64, 4, 2, pingpong=int(rows == 192))
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, out=out, return_lse=True, variant="hopper",
                            q_descale=descales[0], k_descale=descales[1], v_descale=descales[2], config=config)
    check_fp8_p(o, lse, full, causal, align)


@pytest.mark.gpu
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "bottom_right"), (True, "top_left")])
@pytest.mark.parametrize("keys", [128, 256])
@pytest.mark.parametrize("d,sq,sk", [(128, 300, 300), (128, 200, 333), (96, 129, 130), (64, 640, 2560),
                                     (128, 1000, 1000)])
def test_fp8_on_hopper_with_p_in_shared_memory(causal, align, keys, d, sq, sk):
    """float8 P written to each warpgroup's shared tile for P V (``p_smem``; its columns reordered as V^T's keys
    are), in 128- and 256-key tiles (256 only so: in registers it spilled): lengths off the tiles, GQA, against the
    float64 reference of the dequantized inputs; the output poisoned."""
    if not _sm90():
        pytest.skip("the Gluon kernel needs an sm_90 GPU")
    (q, k, v), descales, full = fp8_inputs(2, 8, 2, sq, sk, d, F8, seed=sq + d + keys)
    out = torch.full((*q.shape[:-1], d), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    config = fmha.KernelConfig(128, keys, 4, 2, fence=1, p_smem=1)
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, out=out, return_lse=True, variant="hopper",
                            q_descale=descales[0], k_descale=descales[1], v_descale=descales[2], config=config)
    check_fp8_p(o, lse, full, causal, align)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim,rows,keys,p_smem", [(64, 128, 128, 0), (64, 192, 128, 0), (128, 128, 128, 0),
                                                       (128, 192, 64, 0), (128, 128, 256, 1), (64, 128, 256, 1)])
@pytest.mark.parametrize("lazy", [0, 1])
def test_fp8_on_hopper_sees_through_a_huge_key(lazy, head_dim, rows, keys, p_smem):
    """One key far above the rest (its probability near 1, the others rounded to float8's small values), and
    scores rising along the keys: the online softmax's rescales with float8 P, with the exact pivot and with the
    lazy one (``lazy=1``: a pivot that lags the max by up to 0.75, P up to 2**8.75, inside float8's 448)."""
    if not _sm90():
        pytest.skip("the Gluon kernel needs an sm_90 GPU")
    config = fmha.KernelConfig(rows, keys, 4, 2, lazy=lazy, pingpong=int(rows == 192), p_smem=p_smem)  # (192: in turns)
    (q, k, v), descales, full = fp8_inputs(1, 4, 4, 256, 512, head_dim, F8, seed=11)
    k = k.clone()
    k[:, :, 300] = (q[:, :, 0].float() * 4).clamp(-448, 448).to(F8)  # the first query's huge key
    full[1] = k.cpu().double() * descales[1].cpu().double()[:, :, None, None]
    o, lse = fmha.attention(q, k, v, variant="hopper", q_descale=descales[0], k_descale=descales[1],
                            v_descale=descales[2], return_lse=True, config=config)
    check_fp8_p(o, lse, full, False)


def test_fp8_plans_hopper_for_float8_q(monkeypatch):
    """On sm_90 ``auto`` and ``variant="hopper"`` take float8 q at head_dim 64, 96 or 128 past 16 query rows with
    the float8 table row of its tile; ``hopper`` refuses float8 K/V under a 16-bit q and other head dims, where
    ``auto`` (and decoding) keeps ``tiled`` with its float8 config."""
    from fmha import configs, kernels, plan
    monkeypatch.setattr(plan, "arch_of", lambda device: "sm90")
    monkeypatch.setattr(kernels.hopper, "supports", lambda prob, cfg, q, *rest: kernels.hopper.fp8_reason(prob, cfg, q))

    def planned(q_dtype, d, sq, variant="hopper"):
        (q, k, v), _, _ = fp8_inputs(1, 4, 2, sq, 64, d, q_dtype)
        prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=True, scale=None, fp8=True)
        return plan.plan(prob, q, k, v, q, "bhsd", variant, None, None, 1)
    row = {}  # the first causal row of each tile width: the one for 64 keys
    for d, causal, _, cfg in configs.HOPPER_FP8:
        if causal:
            row.setdefault(d, cfg)
    for d in (64, 96, 128):
        for variant in ("hopper", "auto"):
            p = planned(F8, d, 64, variant)
            assert p.variant == "hopper" and p.config == row[64 if d <= 64 else 128], (d, variant)
    for q_dtype, d, says in ((torch.bfloat16, 128, "float8 K/V with torch.bfloat16 q"),
                             (F8, 32, "takes head_dim 64, 96 or 128")):
        with pytest.raises(ValueError, match=says):
            planned(q_dtype, d, 64)
    for q_dtype, d in ((torch.bfloat16, 128), (F8, 32)):
        p = planned(q_dtype, d, 64, "auto")
        assert p.variant == "tiled" and p.config == configs.tiled_config("sm90", d, fp8=True), (q_dtype, d)
    assert planned(F8, 128, 8, "auto").variant == "tiled"  # decoding: the keys split


def test_fp8_at_head_dim_64_takes_three_warpgroups_past_its_short_rows():
    """Float8 at head_dim 64 runs 192 rows in turns (ping-pong) past 1k keys (2k causal), the lazy pivot without
    causal; shorter, beside the modifiers, with lengths per sequence or a ragged last key tile, 128 rows in two
    warpgroups (three spill there, as the 16-bit rows do)."""
    from fmha import configs
    for causal, short in ((False, 1024), (True, 2048)):
        short_row = configs.hopper_config(64, causal, short, fp8=True)
        long_row = configs.hopper_config(64, causal, 2 * short, fp8=True)
        assert (short_row.block_m, short_row.pingpong, long_row.block_m, long_row.pingpong) == (128, 0, 192, 1)
        assert short_row.lazy == long_row.lazy == int(not causal)
        for kw in (dict(modifiers=True), dict(per_sequence=True), dict(seqlen_k=2 * short + 100)):
            args = {"seqlen_k": 2 * short, **kw}
            narrow = configs.hopper_config(64, causal, fp8=True, **args)
            assert (narrow.block_m, narrow.pingpong) == (128, 0), kw
    assert configs.hopper_config(128, False, 16384, fp8=True).block_m == 128


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("seqlen", [1, 45, 64])
def test_v_transposed_for_the_float8_wgmma(layout, seqlen):
    """V^T as the float8 wgmma reads it: ``[batch * kv_heads, head_dim, keys]``, each group of 32 keys in the
    order P's registers take (key ``16a + 8b + 2t + e`` at column ``16a + 4t + 2b + e``), zeros past the keys."""
    from fmha.kernels.hopper import transpose
    (_, _, v), _, _ = fp8_inputs(2, 2, 2, 1, seqlen, 96, F8, seed=seqlen)
    vv = v if layout == "bhsd" else v.transpose(1, 2).contiguous()
    vt = transpose.transposed(vv, layout).cpu()
    keys = -(-seqlen // 32) * 32
    assert vt.shape == (4, 96, keys) and vt.dtype == F8
    expect = torch.zeros(4, 96, keys, dtype=torch.float32)
    for s in range(seqlen):
        col = s & ~31 | s & 16 | (s & 6) << 1 | (s & 8) >> 2 | s & 1
        expect[:, :, col] = v.reshape(4, seqlen, 96)[:, s].cpu().float()
    assert torch.equal(vt.float(), expect)
    # the consumer's reorder of P (its ``_p_operand``, the same reshape and permute) pairs with it: P' V' = P V
    p = torch.rand(8, keys, dtype=torch.float64, generator=torch.Generator().manual_seed(seqlen))
    p_reordered = p.reshape(8, keys // 32, 2, 2, 4, 2).permute(0, 1, 2, 4, 3, 5).reshape(8, keys)
    full_v = torch.zeros(4, keys, 96, dtype=torch.float64)
    full_v[:, :seqlen] = v.reshape(4, seqlen, 96).cpu().double()
    assert torch.allclose(p_reordered @ vt.double()[1].T, p @ full_v[1], rtol=0, atol=1e-9)  # (summed in another order)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("seqlen", [5, 64, 100])
def test_v_transposed_for_the_float8_kernel(layout, seqlen):
    """``hopper``'s float8 V^T: [batch * kv_heads, head_dim, keys rounded up to 32], key 16a + 8b + 2t + e of
    each group of 32 in column 16a + 4t + 2b + e (P's registers as they lie), zeros past seqlen.  The pass
    moves bytes whatever their type, so a 16-bit V stands in where the interpreter has no float8."""
    from fmha.kernels.hopper import transpose
    b, h, d = 2, 3, 64
    v = torch.randn(b, h, seqlen, d, generator=torch.Generator().manual_seed(seqlen)).to(DEVICE, torch.float16)
    vt = transpose.transposed(v if layout == "bhsd" else v.transpose(1, 2).contiguous(), layout)
    row = -(-seqlen // 32) * 32
    want = torch.zeros(b * h, d, row, dtype=v.dtype, device=DEVICE)
    keys = torch.arange(seqlen)
    cols = (keys & ~31) | (keys & 16) | ((keys & 6) << 1) | ((keys & 8) >> 2) | (keys & 1)
    want[:, :, cols.to(DEVICE)] = v.reshape(b * h, seqlen, d).transpose(1, 2)
    assert vt.shape == want.shape and torch.equal(vt, want)
