"""Sliding window, soft-capping and ALiBi against the float64 reference (Triton variants)."""
import numpy as np
import pytest
import torch

import fmha
from conftest import DEVICE, check_against_reference, make_qkv, max_err, nan_like, torch_lowp
from fmha import reference
from fmha.kernels import VARIANTS

F16, BF16 = torch.float16, torch.bfloat16
CASES = [  # (sq, sk, causal, align, window)
    (40, 40, False, "top_left", (5, 3)),
    (40, 40, True, "top_left", (7, -1)),
    (33, 70, True, "bottom_right", (20, -1)),
    (70, 33, False, "bottom_right", (0, 0)),      # each query sees one key, or none
    (64, 64, False, "top_left", (-1, 2)),
    (17, 50, False, "top_left", (3, 40)),
]


def run(variant, sq, sk, causal, align, window=(-1, -1), softcap=0.0, alibi=None, dtype=F16, d=64):
    q, k, v = make_qkv(1, 4, 2, sq, sk, d, dtype, seed=sq * sk)
    if alibi is not None:
        alibi = torch.tensor(alibi, dtype=torch.float32, device=DEVICE)
    out = nan_like(q)
    fmha.attention(q, k, v, causal=causal, causal_align=align, variant=variant, out=out, window=window,
                   softcap=softcap, alibi_slopes=alibi)
    o = out.cpu().double().numpy()
    assert np.isfinite(o).all()
    ref = reference.dense_attention(q, k, v, causal=causal, causal_align=align, window=window,
                                    softcap=softcap, alibi_slopes=alibi)
    return o, ref, q


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_sliding_window(variant, case):
    o, ref, q = run(variant, *case)
    assert max_err(o, ref) < 4e-3


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_window_covering_everything_is_plain_attention(variant):
    q, k, v = make_qkv(1, 2, 2, 30, 45, 32, F16)
    a = fmha.attention(q, k, v, causal=True, variant=variant, window=(1000, 1000))
    b = fmha.attention(q, k, v, causal=True, variant=variant)
    torch.testing.assert_close(a, b)
    check_against_reference(a, q, k, v, True)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("dtype", [F16, BF16], ids=str)
def test_softcap(variant, dtype):
    q, k, v = make_qkv(1, 2, 1, 37, 51, 64, dtype, seed=3)
    q = q * 4  # large scores, where the cap bites
    out = fmha.attention(q, k, v, causal=True, variant=variant, softcap=5.0)
    ref = reference.dense_attention(q, k, v, causal=True, softcap=5.0)
    uncapped = reference.dense_attention(q, k, v, causal=True)
    err = max_err(out.cpu().double().numpy(), ref)
    assert err < (4e-3 if dtype == F16 else 3e-2)
    assert max_err(uncapped, ref) > 10 * err  # the cap changed the answer, and we followed it


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_alibi(variant):
    slopes = [2 ** -(i + 1) for i in range(4)]
    o, ref, _ = run(variant, 45, 60, True, "bottom_right", alibi=slopes)
    assert max_err(o, ref) < 4e-3
    o, ref, _ = run(variant, 45, 60, False, "top_left", window=(10, 10), softcap=30.0, alibi=slopes)
    assert max_err(o, ref) < 4e-3


@pytest.mark.parametrize("variant", ["auto", *VARIANTS])
def test_alibi_slopes_per_batch_and_head(variant):
    """FlashAttention's other form of the slopes, ``[batch, heads]``: each batch's own row, bottom-right causal and
    with a window, against the reference given the same table; a table whose rows are equal answers as its row
    does as ``[heads]``.  ``auto`` on sm_90 runs them on ``tiled`` (the Gluon kernel reads a slope a head)."""
    q, k, v = make_qkv(3, 4, 2, 45, 60, 64, F16, seed=11)
    slopes = torch.rand(3, 4, generator=torch.Generator().manual_seed(5)).to(DEVICE)
    for causal, align, window in ((True, "bottom_right", (-1, -1)), (False, "top_left", (9, 4))):
        out = nan_like(q)
        fmha.attention(q, k, v, causal=causal, causal_align=align, window=window, variant=variant,
                       alibi_slopes=slopes, out=out)
        ref = reference.dense_attention(q, k, v, causal=causal, causal_align=align, window=window,
                                        alibi_slopes=slopes)
        assert max_err(out.cpu().double().numpy(), ref) < 4e-3
        one_row = reference.dense_attention(q, k, v, causal=causal, causal_align=align, window=window,
                                            alibi_slopes=slopes[0])
        assert max_err(one_row, ref) > 1e-2  # the rows differ, and each batch followed its own
    same = slopes[:1].expand(3, 4)
    torch.testing.assert_close(fmha.attention(q, k, v, causal=True, variant=variant, alibi_slopes=same),
                               fmha.attention(q, k, v, causal=True, variant=variant, alibi_slopes=slopes[0]))
    if variant == "auto" and DEVICE == "cuda" and torch.cuda.get_device_capability()[0] == 9:
        assert fmha.api.describe(q, k, v, alibi_slopes=slopes).startswith("tiled")


def test_modifiers_errors():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 32, F16)
    with pytest.raises(ValueError, match="window must be"):
        fmha.attention(q, k, v, window=(-2, 0))
    with pytest.raises(ValueError, match="softcap must be"):
        fmha.attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match=r"alibi_slopes must be a float32 tensor of shape \(2,\) or \(1, 2\)"):
        fmha.attention(q, k, v, alibi_slopes=torch.ones(3, device=DEVICE))
    with pytest.raises(ValueError, match=r"alibi_slopes must be a float32 tensor of shape \(2,\) or \(1, 2\)"):
        fmha.attention(q, k, v, alibi_slopes=torch.ones(2, 2, device=DEVICE))
    if DEVICE == "cpu":
        used = torch.full((1,), 8, dtype=torch.int32)
        for kw in ({}, {"seqused_k": used}):  # the Gluon kernel takes the window and key lengths, on its GPU
            with pytest.raises(ValueError, match="sm_90"):
                fmha.attention(q, k, v, variant="hopper", window=(4, 0), **kw)


def test_reference_window_is_a_band():
    m = reference.visible(6, 6, False, "top_left", (1, 2))
    expected = np.array([[abs(j - i) <= (2 if j > i else 1) for j in range(6)] for i in range(6)])
    np.testing.assert_array_equal(m, expected)
    o_a = reference.dense_attention(*(np.random.default_rng(0).standard_normal((1, 2, 20, 16)) for _ in range(3)),
                                    window=(3, 3))
    assert np.isfinite(o_a).all()


def test_torch_yardstick_still_applies():
    # the plain-attention yardstick, with a window the size of the sequence
    q, k, v = make_qkv(1, 2, 2, 20, 20, 32, BF16)
    o = fmha.attention(q, k, v, window=(19, 19))
    check_against_reference(o, q, k, v, False)
    assert max_err(torch_lowp(q, k, v, False, "top_left"), reference.dense_attention(q, k, v)) < 1e-1
