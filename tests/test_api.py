"""Validation messages and the edges with defined answers."""
import math
import re

import pytest
import torch
import triton
import triton.language as tl

import fmha
from fmha.kernels import VARIANTS
from fmha.kernels.common import mma
from conftest import DEVICE, check_against_reference, make_qkv, nan_like

F16 = torch.float16


def t(*shape, dtype=F16):
    return torch.randn(shape, dtype=torch.float32).to(dtype).to(DEVICE)


@pytest.mark.parametrize("kwargs,args,match", [
    ({}, (t(2, 16, 64), t(1, 2, 16, 64), t(1, 2, 16, 64)), "q must have 4 dimensions"),
    ({}, (t(1, 2, 16, 64, dtype=torch.float32),) * 3, "float16 or bfloat16"),
    ({}, (t(1, 2, 16, 64), t(1, 2, 16, 64, dtype=torch.bfloat16), t(1, 2, 16, 64)), "share a dtype"),
    ({}, (t(1, 2, 16, 64), t(2, 2, 16, 64), t(2, 2, 16, 64)), "k has batch 2"),
    ({}, (t(1, 2, 16, 64), t(1, 2, 16, 32), t(1, 2, 16, 32)), "k has head_dim 32"),
    ({}, (t(1, 2, 16, 64), t(1, 2, 16, 64), t(1, 2, 17, 64)), "k and v must agree"),
    ({}, (t(1, 3, 16, 64), t(1, 2, 16, 64), t(1, 2, 16, 64)), r"heads \(3\) must be a multiple"),
    ({}, (t(1, 2, 16, 50), t(1, 2, 16, 50), t(1, 2, 16, 50)), "head_dim must be a multiple of 8"),
    ({"variant": "nope"}, (t(1, 2, 16, 64),) * 3, "variant must be 'auto' or one of"),
    ({"layout": "sbhd"}, (t(1, 2, 16, 64),) * 3, "layout must be one of"),
    ({"causal_align": "center"}, (t(1, 2, 16, 64),) * 3, "causal_align must be one of"),
    ({"scale": "0.1"}, (t(1, 2, 16, 64),) * 3, "scale must be a finite number"),
    ({"scale": math.nan}, (t(1, 2, 16, 64),) * 3, "scale must be a finite number"),
])
def test_errors_name_the_argument(kwargs, args, match):
    with pytest.raises((ValueError, TypeError), match=match):
        fmha.attention(*args, **kwargs)


def test_out_must_not_alias_an_input():
    q, k, v = make_qkv(1, 2, 2, 16, 16, 64, F16)
    with pytest.raises(ValueError, match="out overlaps q"):
        fmha.attention(q, k, v, out=q)
    with pytest.raises(ValueError, match="out must have q's shape with v's head_dim"):
        fmha.attention(q, k, v, out=torch.empty_like(q)[:, :1])
    with pytest.raises(ValueError, match="out has elements that share memory"):  # a broadcast: heads on one place
        fmha.attention(q, k, v, out=torch.empty_like(q)[:, :1].expand_as(q))


def test_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q = torch.randn(1, 1, 4, 32, dtype=F16)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        fmha.attention(q, q, q)


@pytest.mark.parametrize("shape_q,shape_kv", [((0, 2, 8, 64), (0, 2, 8, 64)), ((1, 0, 8, 64), (1, 0, 8, 64)),
                                              ((1, 2, 0, 64), (1, 2, 8, 64))])
def test_empty_problems_return_empty(shape_q, shape_kv):
    q, k = t(*shape_q), t(*shape_kv)
    o, lse = fmha.attention(q, k, k, return_lse=True)
    assert o.shape == q.shape and lse.shape == (shape_q[0], shape_q[1], shape_q[2])


def test_no_keys_gives_zeros_and_neg_inf_lse():
    q, k = t(1, 2, 5, 64), t(1, 2, 0, 64)
    o, lse = fmha.attention(q, k, k, return_lse=True)
    assert (o == 0).all() and torch.isneginf(lse).all()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_large_scores_stay_finite(variant):
    # scores of order 1e4: only the running-max subtraction keeps exp2 finite
    q, k, v = make_qkv(1, 1, 1, 20, 40, 64, F16)
    q, k = q * 12, k * 12
    o = fmha.attention(q, k, v, variant=variant, out=nan_like(q))
    check_against_reference(o, q, k, v, False)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_output_stays_inside_its_buffer(variant):
    q, k, v = make_qkv(1, 2, 2, 19, 23, 96, F16)
    guard = torch.full((3 * q.numel(),), 7.0, dtype=F16, device=DEVICE)
    out = guard[q.numel():2 * q.numel()].view(q.shape)
    fmha.attention(q, k, v, variant=variant, causal=True, out=out)
    assert (guard[:q.numel()] == 7).all() and (guard[2 * q.numel():] == 7).all()
    check_against_reference(out, q, k, v, True)


def test_hopper_off_its_chip_is_a_clear_error():
    q, k, v = make_qkv(1, 2, 2, 128, 128, 64, F16)
    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] == 9:
        pytest.skip("on sm_90 the hopper variant takes this call")
    with pytest.raises(ValueError, match="variant 'hopper' cannot take this call: needs an sm_90 GPU"):
        fmha.attention(q, k, v, variant="hopper")
    assert "hopper" in fmha.variants()


def test_more_errors_name_the_argument():
    q = t(1, 2, 16, 64)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got ndarray"):
        fmha.attention(q, q.cpu().numpy(), q)
    with pytest.raises(TypeError, match="k must be a torch.Tensor, got NoneType"):  # (on a GPU: not replayable)
        fmha.attention(q, None, q)
    with pytest.raises(TypeError, match="cu_seqlens_q must be an int32 torch.Tensor"):
        fmha.attention_varlen(q[0], q[0], q[0], None, None, 16, 16)
    with pytest.raises(ValueError, match="q, k, v must be on one device"):
        fmha.attention(q, torch.empty(1, 2, 16, 64, dtype=F16, device="meta"), q)
    with pytest.raises(ValueError, match="k and v must agree"):
        fmha.attention(q, t(1, 1, 16, 64), t(1, 2, 16, 64))
    with pytest.raises(ValueError, match=r"heads \(2\) must be a multiple of kv_heads \(0\)"):
        fmha.attention(q, t(1, 0, 16, 64), t(1, 0, 16, 64))
    with pytest.raises(ValueError, match="scale must be a finite number"):
        fmha.attention(q, q, q, scale=float("inf"))


def test_column_chunks_come_in_a_power_of_two_of_at_least_16_columns():
    """Q K^T over ``qk_chunks`` column chunks: a count that is no power of two is refused by name; a count past the
    head dim's chunks of 16 columns (the matrix unit's least depth) takes as many of them as there are. AMD's 256-wide
    row (16 chunks) passed at head_dim 96 died in Triton's compiler on a GPU, 8 columns a chunk (the fuzzer's draw):
    it runs in 8 chunks of 16, exact, as at 256 in its 16."""
    for d in (96, 256):
        q = t(1, 2, 16, d)
        with pytest.raises(ValueError, match="config qk_chunks=3: Q K\\^T's column chunks come in a power of two"):
            fmha.attention(q, q, q, variant="tiled", config=fmha.KernelConfig(32, 16, 16, 1, qk_chunks=3))
        out = nan_like(q)
        fmha.attention(q, q, q, variant="tiled", config=fmha.KernelConfig(32, 16, 16, 1, qk_chunks=16), out=out)
        check_against_reference(out, q, q, q, False)


@triton.jit
def _product(A, B, O, K: tl.constexpr):
    """O = A @ B through the kernels' one product (``[16, K] @ [K, 16]``)."""
    a = tl.load(A + tl.arange(0, 16)[:, None] * K + tl.arange(0, K)[None, :])
    b = tl.load(B + tl.arange(0, K)[:, None] * 16 + tl.arange(0, 16)[None, :])
    tl.store(O + tl.arange(0, 16)[:, None] * 16 + tl.arange(0, 16)[None, :], mma(a, b, tl.zeros([16, 16], tl.float32)))


def test_a_product_shallower_than_the_matrix_units_step_fails_under_the_interpreter_too():
    """The compiled ``tl.dot`` takes a depth of 16 at least; the interpreter would multiply any, so the kernels' one
    product (:func:`fmha.kernels.common.mma`) asserts it on both, and a tiling a GPU build refuses fails on the CPU
    as well (the fuzzer's 8-column chunks showed only on a GPU)."""
    a, b = t(16, 16), t(16, 16)
    o = torch.empty(16, 16, device=DEVICE)
    _product[(1,)](a, b, o, K=16)
    torch.testing.assert_close(o, a.float() @ b.float(), rtol=1e-3, atol=1e-3)
    with pytest.raises(Exception) as caught:
        _product[(1,)](a[:, :8].contiguous(), b[:8].contiguous(), o, K=8)
    said, e = [], caught.value  # a GPU build's error names the caller's line; the assert's words are in its cause
    while e is not None:
        said.append(str(e))
        e = e.__cause__ or e.__context__
    assert re.search("depth .* must be 16 at least", "\n".join(said)), said


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_seqlen_one_both_sides(variant):
    q, k, v = make_qkv(2, 2, 1, 1, 1, 32, F16)
    o = fmha.attention(q, k, v, causal=True, variant=variant, out=nan_like(q))
    torch.testing.assert_close(o, v.repeat_interleave(2, 1))  # one key: the output is its value row


@pytest.mark.parametrize("variant", [*VARIANTS, "auto"])
@pytest.mark.parametrize("scale", [0.0, -0.3])
def test_any_finite_scale_as_sdpa_takes(variant, scale):
    """A scale of 0 (every visible key weighs the same) or below it (the lowest scores weigh most), as torch SDPA takes
    any float: the forward against float64, rows that see one key, and (on ``tiled``) the gradients."""
    from fmha import verify
    from fmha.verify import check_grads
    q, k, v = make_qkv(2, 4, 2, 19, 40, 64, torch.bfloat16, seed=3)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, causal=True, scale=scale, variant=variant, return_lse=True, out=out)
    check_against_reference(out, q, k, v, True, scale=scale, lse=lse)
    # the LSE's accumulation slack as for |scale| (negative, it made the bound negative: the fuzz's large scores)
    assert (verify._accumulation(q, k, scale) == verify._accumulation(q, k, abs(scale))).all()
    if scale == 0:  # uniform: row i averages the values of keys 0..i
        want = v.float().repeat_interleave(2, 1).cumsum(2)[:, :, :19] / torch.arange(1, 20, device=DEVICE)[:, None]
        torch.testing.assert_close(out.float(), want, atol=2e-2, rtol=0)
    if variant in ("tiled", "auto"):
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]
        o = fmha.attention(*leaves, causal=True, scale=scale, variant=variant)
        do = torch.randn(o.shape, generator=torch.Generator().manual_seed(4)).to(o)
        o.backward(do)
        check_grads([x.grad for x in leaves], q, k, v, do, True, scale=scale)


def test_the_gluon_kernels_leave_a_scale_they_divide_by_to_the_triton_ones():
    """The Gluon forward divides by the scale (and its backward starts S^T at -LSE / scale): a scale of 0, below it
    or under 2^-60 / log2(e) is refused by name, so ``auto`` sends it to ``tiled`` (above)."""
    from fmha import plan as planning
    from fmha.kernels import hopper
    q, k, v = make_qkv(1, 2, 2, 256, 256, 128, torch.bfloat16)
    cfg = fmha.KernelConfig(128, 128, 8, 2)
    for scale in (0.0, -0.1, 1e-19):
        prob = planning.problem(*planning.sizes(q, k, "bhsd"), causal=False, scale=scale)
        assert "the kernel divides by it" in hopper.supports(prob, cfg, q, k, v, q, "bhsd")
    prob = planning.problem(*planning.sizes(q, k, "bhsd"), causal=False, scale=0.1)
    assert "divides" not in (hopper.supports(prob, cfg, q, k, v, q, "bhsd") or "")


def test_auto_picks_by_shape_on_sm90():
    """The measured choices (``select_variant``): decoding and packed causal D=64 on ``tiled``, other prefill on the
    Gluon kernel, every head dim."""
    pick = fmha.select_variant
    prefill = {"head_dim": 128, "seqlen_q": 4096, "seqlen_k": 4096, "causal": True}
    assert pick("sm90", prefill) == "hopper"
    assert pick("sm90", dict(prefill, seqlen_q=1)) == "tiled"
    assert pick("sm90", dict(prefill, head_dim=96)) == "hopper"
    assert pick("sm90", dict(prefill, varlen=True)) == "hopper"
    assert pick("sm90", dict(prefill, varlen=True, head_dim=64)) == "tiled"
    assert pick("sm90", dict(prefill, varlen=True, head_dim=64, causal=False)) == "hopper"
    assert pick("sm80", prefill) == "tiled"
    # causal heads of one 64-row block: hopper 1.5-3.3x tiled (docs/PERF.md)
    assert pick("sm90", dict(prefill, head_dim=64, seqlen_q=40, seqlen_k=40)) == "hopper"
