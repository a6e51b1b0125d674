"""``attn_mask``: SDPA's boolean mask joined with the band and its additive float mask (a bias on the scores), on the
tiled variant (every split and layout), against the float64 reference; their gradients (a bias's own included)
against the float64 backward; the refusals; and the custom op under ``torch.compile``, forward and backward."""
import numpy as np
import pytest
import torch

import fmha
from conftest import DEVICE, check_against_reference, make_qkv, nan_like
from fmha.verify import check_grads, check_mask_grad


def _mask(shape, seed, keep=0.6):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) < keep).to(DEVICE)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("b,h,kvh,sq,sk,d,mask_shape,causal,splits", [
    (2, 4, 2, 37, 90, 64, (2, 1, 37, 90), False, 0),     # transformers' [batch, 1, q, k]
    (2, 4, 2, 1, 300, 64, (2, 1, 1, 300), False, 3),     # a decoding step, keys split and merged
    (1, 8, 2, 5, 200, 32, (8, 5, 200), True, 2),         # per head, GQA rows packed, with the band
    (2, 4, 4, 20, 20, 128, (20, 20), False, 1),          # one [q, k] mask for every batch and head
    (2, 2, 1, 70, 130, 96, (2, 2, 70, 130), True, 1),    # the full shape, bottom-right band beside it
])
def test_a_mask_joins_the_band(layout, b, h, kvh, sq, sk, d, mask_shape, causal, splits):
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, layout=layout, seed=sk + sq)
    mask = _mask(mask_shape, seed=sq)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, attn_mask=mask, layout=layout, causal=causal, causal_align="bottom_right",
                            num_splits=splits, return_lse=True, out=out)
    assert o is out
    check_against_reference(out, q, k, v, causal, "bottom_right", layout=layout, lse=lse,
                            attn_mask=mask.expand(b, h, sq, sk))
    again = fmha.attention(q, k, v, attn_mask=mask, layout=layout, causal=causal, causal_align="bottom_right",
                           num_splits=splits)  # the fast path (no out=): the same bits
    assert torch.equal(again, out)


def test_rows_the_mask_leaves_empty_give_zero():
    q, k, v = make_qkv(1, 2, 2, 6, 40, 64, torch.float16)
    mask = _mask((1, 2, 6, 40), seed=1)
    mask[0, 1, 2] = False
    mask[0, 0, 5] = False
    o, lse = fmha.attention(q, k, v, attn_mask=mask, num_splits=2, return_lse=True)
    assert (o[0, 1, 2] == 0).all() and (o[0, 0, 5] == 0).all()
    assert torch.isneginf(lse[0, 1, 2]) and torch.isneginf(lse[0, 0, 5])
    check_against_reference(o, q, k, v, False, lse=lse, attn_mask=mask)


def test_a_key_the_mask_hides_may_hold_nan():
    # its score is NaN, and the mask must make it -inf all the same (where(), not a multiplication)
    q, k, v = make_qkv(1, 2, 1, 3, 64, 64, torch.bfloat16)
    mask = torch.ones(1, 1, 3, 64, dtype=torch.bool, device=DEVICE)
    mask[..., 17] = False
    k[:, :, 17] = float("nan")
    o = fmha.attention(q, k, v, attn_mask=mask)
    assert torch.isfinite(o).all()
    keep = [j for j in range(64) if j != 17]
    check_against_reference(o, q, k[:, :, keep], v[:, :, keep], False)


def test_what_a_mask_call_refuses():
    q, k, v = make_qkv(1, 2, 2, 4, 16, 64, torch.float16)
    with pytest.raises(ValueError, match="attn_mask must be boolean .* or a float16, bfloat16 or float32 bias"):
        fmha.attention(q, k, v, attn_mask=torch.zeros(4, 16, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="does not broadcast"):
        fmha.attention(q, k, v, attn_mask=torch.ones(4, 15, dtype=torch.bool, device=DEVICE))
    with pytest.raises(ValueError, match="cannot take this call: an attn_mask runs on the tiled variant"):
        fmha.attention(q, k, v, attn_mask=torch.ones(4, 16, dtype=torch.bool, device=DEVICE), variant="singlewave")


def test_a_split_at_head_dim_256_beside_a_mask_fits_sm90(monkeypatch):
    """A key split of 71 query rows at head_dim 256 takes the decode table's 64 x 64 tiles in three stages, which
    beside a mask asked sm_90 for 240 KB (Triton's out-of-resources error on the H200, found by the fuzzer): the plan
    takes two stages there, and the call is exact."""
    from fmha import configs, plan as planning
    q, k, v = make_qkv(1, 2, 1, 71, 600, 256, torch.float16, layout="bshd")
    mask = _mask((1, 1, 71, 600), 5)
    prob = planning.problem(*planning.sizes(q, k, "bshd"), causal=True, scale=None, attn_mask=True)
    monkeypatch.setattr(planning, "arch_of", lambda device: "sm90")
    cfg = planning.plan(prob, q, k, v, q, "bshd", "auto", None, None, 4).config
    assert cfg.num_stages == 2 and configs.tiled_smem(cfg, 256, 256, True) <= 232448, cfg
    monkeypatch.undo()
    out = nan_like(q)
    fmha.attention(q, k, v, causal=True, layout="bshd", attn_mask=mask, num_splits=4, out=out)
    check_against_reference(out, q, k, v, True, layout="bshd", attn_mask=mask)


@pytest.mark.parametrize("d", [64, 128, 256])
def test_a_gpu_before_hopper_reads_a_mask_in_tiles_that_do_not_spill(monkeypatch, d):
    """NVIDIA before Hopper (the sm80 rows) plans a masked call in :data:`fmha.configs.TILED_SM80_MASKED`'s tiles (its
    sm_80 builds spill none: ``test_tiled_beside_a_mask_builds_for_sm80_without_spills``), an unmasked one in
    :data:`fmha.configs.TILED`'s; the masked tiles' answer, a boolean mask and a bias, causal, against float64."""
    from fmha import configs, plan as planning
    q, k, v = make_qkv(1, 2, 1, 45, 70, d, torch.bfloat16, seed=d)
    masked_row = next(cfg for max_d, cfg in configs.TILED_SM80_MASKED if d <= max_d)
    monkeypatch.setattr(planning, "arch_of", lambda device: "sm80")
    for masked in (True, False):
        prob = planning.problem(*planning.sizes(q, k, "bhsd"), causal=True, scale=None, attn_mask=masked)
        cfg = planning.plan(prob, q, k, v, q, "bhsd", "tiled", None, None, 1).config
        assert (cfg == masked_row) == masked, (masked, cfg)
    monkeypatch.undo()
    for mask in (_mask((1, 1, 45, 70), d), torch.randn(1, 2, 45, 70, generator=torch.Generator().manual_seed(d))
                 .to(DEVICE)):
        out = nan_like(q)
        fmha.attention(q, k, v, attn_mask=mask, causal=True, variant="tiled", config=masked_row, out=out)
        check_against_reference(out, q, k, v, True, attn_mask=mask.expand(1, 2, 45, 70))


def test_a_bias_counts_its_stages_where_a_boolean_mask_fits(monkeypatch):
    """A float bias's tiles take shared memory in the pipeline's stages: at head_dim 64, 128 x 128 tiles in three
    stages built for sm_90 took 176 KB beside a boolean mask and 240 KB beside a bias (past the 227 KB there: Triton's
    out-of-resources error on an H100, the fuzzer's draw, where the plan had counted the bias as a boolean mask).
    The count (``configs.tiled_smem``) holds each build, and the plan refuses that config beside a bias by name and
    takes it beside a boolean mask; the calls themselves, a bias and its boolean twin, are exact."""
    from fmha import configs, plan as planning
    q, k, v = make_qkv(1, 2, 2, 40, 70, 64, torch.float16)
    three = fmha.KernelConfig(128, 128, 8, 3)
    monkeypatch.setattr(planning, "arch_of", lambda device: "sm90")
    for kind in (True, "bias"):
        prob = planning.problem(*planning.sizes(q, k, "bhsd"), causal=False, scale=None, attn_mask=kind)
        if kind is True:
            assert planning.plan(prob, q, k, v, q, "bhsd", "tiled", three, None, 0).config == three
        else:
            with pytest.raises(ValueError, match="num_stages=3 asks for more shared memory .*num_stages=2 fits"):
                planning.plan(prob, q, k, v, q, "bhsd", "tiled", three, None, 0)
    assert configs.fit_shared(three, 64, 64, "bias") == fmha.KernelConfig(128, 128, 8, 2)
    monkeypatch.undo()
    mask = _mask((1, 1, 40, 70), 7)
    bias = torch.zeros(mask.shape, device=DEVICE).masked_fill(~mask, float("-inf"))
    for m in (mask, bias):
        out = nan_like(q)
        fmha.attention(q, k, v, attn_mask=m, variant="tiled", config=fmha.KernelConfig(128, 128, 8, 2), out=out)
        check_against_reference(out, q, k, v, False, attn_mask=mask.expand(1, 2, 40, 70))


def test_a_callers_config_too_big_beside_a_mask_is_refused(monkeypatch):
    """On sm_90, the caller's ``tiled`` config whose stages fit without a mask but not beside one (128 x 128 tiles
    in three stages: 256 KB with the mask's, past the 227 KB there) is refused by name before any launch, where
    Triton's compiler would stop with an out-of-resources error that does not say the mask is why; the table's
    config takes two stages there (``configs.fit_shared``), and a config that fits runs."""
    from fmha import plan as planning
    q, k, v = make_qkv(1, 2, 2, 4, 16, 128, torch.float16)
    mask = torch.ones(4, 16, dtype=torch.bool, device=DEVICE)
    prob = planning.problem(*planning.sizes(q, k, "bhsd"), causal=False, scale=None, attn_mask=True)
    monkeypatch.setattr(planning, "arch_of", lambda device: "sm90")
    three, two = fmha.KernelConfig(128, 128, 8, 3), fmha.KernelConfig(128, 128, 8, 2)
    with pytest.raises(ValueError, match="cannot take this call: config .*num_stages=3 asks for more shared memory "
                                         r"than this GPU has \(227 KB: .*the mask's scores\); num_stages=2 fits"):
        planning.plan(prob, q, k, v, q, "bhsd", "tiled", three, None, 0)
    assert planning.plan(prob, q, k, v, q, "bhsd", "tiled", None, None, 0).config == two
    assert planning.plan(prob, q, k, v, q, "bhsd", "tiled", two, None, 0).config == two
    monkeypatch.undo()
    if planning.arch_of(q.device) not in ("sm90", "sm80"):  # off NVIDIA GPUs the caller's config goes as given
        assert planning.plan(prob, q, k, v, q, "bhsd", "tiled", three, None, 0).config == three
    out = fmha.attention(q, k, v, attn_mask=mask, variant="tiled", config=fmha.KernelConfig(32, 32, 4, 1))
    check_against_reference(out, q, k, v, False)


def _leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


@pytest.mark.parametrize("layout,b,h,kvh,sq,sk,d,mask_shape,causal,deterministic", [
    ("bhsd", 2, 4, 2, 37, 90, 64, (2, 1, 37, 90), False, False),   # transformers' [batch, 1, q, k], GQA
    ("bshd", 1, 8, 2, 45, 45, 32, (8, 45, 45), True, True),        # per head, with the band, dQ in one order
    ("bshd", 2, 2, 1, 20, 70, 128, (2, 1, 1, 70), False, True),    # a key-padding mask, MQA
    ("bhsd", 1, 2, 2, 33, 33, 96, (33, 33), True, False),          # one [q, k] mask, a padded head dim
])
def test_a_mask_has_its_gradients(layout, b, h, kvh, sq, sk, d, mask_shape, causal, deterministic):
    """dq, dk, dv of a masked call against the float64 backward of the same masked attention, with rows the mask
    leaves empty (zero gradients and output, no NaN), and no gradient into keys a padding mask hides."""
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, layout=layout, seed=sq + d)
    mask = _mask(mask_shape, seed=sk)
    empty = len(mask_shape) > 1 and mask_shape[-2] == sq
    if empty:
        mask[..., 3, :] = False  # query row 3 sees no key, in every head the mask reaches
    full = mask.expand(b, h, sq, sk)
    q, k, v = _leaves(q, k, v)
    o = fmha.attention(q, k, v, attn_mask=mask, layout=layout, causal=causal, causal_align="bottom_right",
                       deterministic=deterministic)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(d), dtype=torch.float32).to(o)
    o.backward(do)
    check_grads((q.grad, k.grad, v.grad), q, k, v, do, causal, "bottom_right", layout, attn_mask=full)
    row = (slice(None), 3) if layout == "bshd" else (slice(None), slice(None), 3)
    assert not empty or not q.grad[row].any() and not o[row].any()
    if mask_shape == (2, 1, 1, 70):  # a key the padding hides from every query: no gradient reaches it
        hidden = (~mask[:, 0, 0]).nonzero()
        for bi, j in hidden.tolist():
            at = (bi, j) if layout == "bshd" else (bi, slice(None), j)
            assert not k.grad[at].any() and not v.grad[at].any()


def test_the_custom_op_trains_through_a_mask_under_compile():
    """fullgraph=True: the mask reaches the custom op's backward; gradients equal eager's."""
    q, k, v = make_qkv(2, 4, 2, 19, 40, 64, torch.bfloat16, layout="bshd", seed=5)
    mask = _mask((2, 1, 19, 40), seed=6)
    compiled_in, eager_in = _leaves(q, k, v), _leaves(q, k, v)

    def block(q, k, v, m):
        return (fmha.attention(q * 1.0, k, v, layout="bshd", attn_mask=m).float() ** 2).sum()
    try:
        torch.compile(block, backend="aot_eager", fullgraph=True)(*compiled_in, mask).backward()
    finally:
        torch._dynamo.reset()
    block(*eager_in, mask).backward()
    for a, b in zip(compiled_in, eager_in):
        torch.testing.assert_close(a.grad, b.grad)


def test_the_custom_op_takes_the_mask_under_compile():
    import torch._dynamo
    q, k, v = make_qkv(2, 4, 2, 1, 100, 64, torch.bfloat16, layout="bshd", seed=3)
    mask = _mask((2, 1, 1, 100), seed=4)
    graphs = []
    fn = torch.compile(lambda q, k, v, m: fmha.attention(q, k, v, layout="bshd", attn_mask=m),
                       backend=lambda gm, ex: graphs.append(gm) or gm.forward, fullgraph=True)
    try:
        got = fn(q, k, v, mask)
    finally:
        torch._dynamo.reset()
    assert any("fmha.attention" in str(g.graph) for g in graphs)
    np.testing.assert_array_equal(got.float().cpu().numpy(),
                                  fmha.attention(q, k, v, layout="bshd", attn_mask=mask).float().cpu().numpy())
    check_against_reference(got, q, k, v, False, layout="bshd", attn_mask=mask.expand(2, 4, 1, 100))


def test_a_mask_beside_attention_sinks():
    # gpt-oss under a padding mask: the sink joins each row's denominator over the keys the mask keeps
    q, k, v = make_qkv(2, 4, 2, 1, 80, 64, torch.bfloat16, layout="bshd", seed=8)
    mask = _mask((2, 1, 1, 80), seed=9)
    sinks = torch.randn(4, generator=torch.Generator().manual_seed(10)).to(DEVICE)
    o, lse = fmha.attention(q, k, v, layout="bshd", attn_mask=mask, sinks=sinks, num_splits=2, return_lse=True)
    check_against_reference(o, q, k, v, False, layout="bshd", lse=lse, sinks=sinks,
                            attn_mask=mask.expand(2, 4, 1, 80))


def _bias(shape, seed, dtype=torch.float32, hidden=0.3):
    """A bias of normal scores (scale 2), about ``hidden`` of them ``-inf``: keys hidden as a float mask hides them."""
    g = torch.Generator().manual_seed(seed)
    bias = torch.randn(shape, generator=g) * 2
    return bias.masked_fill(torch.rand(shape, generator=g) < hidden, float("-inf")).to(dtype).to(DEVICE)


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("b,h,kvh,sq,sk,d,shape,dtype,causal,splits,softcap", [
    (2, 4, 2, 37, 90, 64, (2, 1, 37, 90), torch.float32, False, 0, 0.0),   # transformers' [batch, 1, q, k]
    (2, 4, 2, 1, 300, 64, (2, 1, 1, 300), torch.bfloat16, False, 3, 0.0),  # a decoding step, keys split and merged
    (1, 8, 2, 5, 200, 32, (8, 5, 200), torch.float16, True, 2, 0.0),       # per head, GQA rows packed, the band
    (2, 4, 4, 20, 20, 128, (20, 20), torch.float32, False, 1, 30.0),       # one [q, k] bias (T5's), after a softcap
    (2, 2, 1, 70, 130, 96, (2, 2, 70, 130), torch.bfloat16, True, 1, 0.0),  # the full shape, bottom-right band
])
def test_a_float_mask_adds_to_the_scores(layout, b, h, kvh, sq, sk, d, shape, dtype, causal, splits, softcap):
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, layout=layout, seed=sk + sq + 1)
    bias = _bias(shape, seed=sq, dtype=dtype)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, attn_mask=bias, layout=layout, causal=causal, causal_align="bottom_right",
                            num_splits=splits, softcap=softcap, return_lse=True, out=out)
    assert o is out
    check_against_reference(out, q, k, v, causal, "bottom_right", layout=layout, lse=lse, softcap=softcap,
                            attn_mask=bias.expand(b, h, sq, sk))
    again = fmha.attention(q, k, v, attn_mask=bias, layout=layout, causal=causal, causal_align="bottom_right",
                           num_splits=splits, softcap=softcap)  # the fast path (no out=): the same bits
    assert torch.equal(again, out)


def test_a_bias_of_zeros_and_minus_infinity_is_the_boolean_mask():
    """0 where a boolean mask keeps a key and -inf where it hides it: the same scores, the same bits under the
    interpreter, rows that see no key included (0, LSE -inf).  Compiled, a unit or two in the last place apart: where
    the mask's select stands between the scale's product and the row max's shift, the GPU build fuses the two into
    one FMA, and beside the bias's add it does not (on an H100, one output element of 3360 and 16-18 LSEs of 192
    moved by one unit in one run, 5 LSEs by up to two in another)."""
    q, k, v = make_qkv(2, 4, 2, 24, 70, 64, torch.float16, seed=3)
    mask = _mask((2, 1, 24, 70), seed=4)
    mask[1, :, 7] = False
    bias = torch.zeros(mask.shape, device=DEVICE).masked_fill(~mask, float("-inf"))
    for splits in (1, 3):
        want = fmha.attention(q, k, v, attn_mask=mask, causal=True, num_splits=splits, return_lse=True)
        got = fmha.attention(q, k, v, attn_mask=bias, causal=True, num_splits=splits, return_lse=True)
        if DEVICE == "cpu":
            assert all(torch.equal(a, b) for a, b in zip(got, want))
        else:
            for a, b in zip(got, want):
                torch.testing.assert_close(a, b, rtol=4 * torch.finfo(a.dtype).eps, atol=0)
        assert (got[0][1, :, 7] == 0).all() and torch.isneginf(got[1][1, :, 7]).all()


def test_a_large_bias_does_not_overflow():
    # a bias that dwarfs the scores picks its keys; float32's exponent holds it (scores are never exponentiated raw)
    q, k, v = make_qkv(1, 2, 2, 8, 40, 64, torch.bfloat16, seed=5)
    bias = torch.full((8, 40), -1e4, device=DEVICE)
    bias[:, 11] = 1e4
    bias[3, 30] = 1e4
    o, lse = fmha.attention(q, k, v, attn_mask=bias, return_lse=True)
    check_against_reference(o, q, k, v, False, lse=lse, attn_mask=bias.expand(1, 2, 8, 40))
    torch.testing.assert_close(o[0, :, 0], v[0, :, 11], atol=0, rtol=0)


@pytest.mark.parametrize("layout,b,h,kvh,sq,sk,d,shape,dtype,causal,deterministic,softcap", [
    ("bhsd", 2, 4, 2, 37, 90, 64, (1, 4, 37, 90), torch.float32, False, False, 0.0),  # a learned bias a head, GQA
    ("bshd", 1, 8, 2, 45, 45, 32, (45, 45), torch.bfloat16, True, True, 0.0),      # one [q, k] bias, dQ in one order
    ("bshd", 2, 2, 1, 20, 70, 128, (2, 1, 1, 70), torch.float16, False, False, 2.0),  # per key, MQA, a softcap
    ("bhsd", 2, 2, 2, 33, 33, 96, (2, 2, 33, 33), torch.float32, True, False, 0.0),   # the full shape
])
def test_a_bias_has_its_gradients(layout, b, h, kvh, sq, sk, d, shape, dtype, causal, deterministic, softcap):
    """dq, dk, dv of a call with a float mask, and the bias's own gradient (summed over the dimensions it
    broadcast, in its dtype), against the float64 backward; a row the bias leaves no key gives zero gradients."""
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, layout=layout, seed=sq + d)
    bias = _bias(shape, seed=sk, dtype=dtype)
    if shape[-2] == sq:
        bias[..., 3, :] = float("-inf")  # query row 3 sees no key
    q, k, v, leaf = _leaves(q, k, v, bias)
    o = fmha.attention(q, k, v, attn_mask=leaf, layout=layout, causal=causal, causal_align="bottom_right",
                       deterministic=deterministic, softcap=softcap)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(d), dtype=torch.float32).to(o)
    o.backward(do)
    full = bias.expand(b, h, sq, sk)
    check_grads((q.grad, k.grad, v.grad), q, k, v, do, causal, "bottom_right", layout, softcap=softcap,
                attn_mask=full)
    assert leaf.grad.dtype == dtype and leaf.grad.shape == shape
    check_mask_grad(leaf.grad, q, k, v, do, causal, "bottom_right", layout, softcap=softcap, attn_mask=bias)
    if shape[-2] == sq:
        row = (slice(None), 3) if layout == "bshd" else (slice(None), slice(None), 3)
        assert not q.grad[row].any() and not leaf.grad[..., 3, :].any()


def test_a_bias_over_rows_that_see_one_key_each():
    """A window of width 0 beside the causal band: each row sees one key, so each score's gradient ``P (dP -
    delta)`` is 0 in exact arithmetic and torch's own is exactly 0, while fmha's ``dP`` and ``delta`` are
    float32 sums in different orders: the bias's gradient is held to their accumulation (it failed the bound
    without it at large values, as the fuzz drew it)."""
    q, k, v = make_qkv(2, 2, 2, 24, 31, 64, torch.bfloat16, seed=11)
    v = (v * 8).to(torch.bfloat16)
    bias = _bias((1, 2, 24, 31), seed=12, hidden=0.0)
    q, k, v, leaf = _leaves(q, k, v, bias)
    o = fmha.attention(q, k, v, attn_mask=leaf, causal=True, causal_align="bottom_right", window=(0, -1))
    do = (torch.randn(o.shape, generator=torch.Generator().manual_seed(13)) * 8).to(o)
    o.backward(do)
    check_mask_grad(leaf.grad, q, k, v, do, True, "bottom_right", window=(0, -1), attn_mask=bias)


def test_a_bias_alone_requiring_grad_is_recorded():
    """Only the bias asks for a gradient (a relative-position table learned over frozen q, k, v): autograd records
    the call, and the gradient is the float64 one."""
    q, k, v = make_qkv(1, 2, 2, 16, 24, 64, torch.bfloat16, seed=7)
    leaf = _bias((2, 16, 24), seed=8, hidden=0.0).requires_grad_(True)
    o = fmha.attention(q, k, v, attn_mask=leaf, causal=True)
    assert o.requires_grad
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(9)).to(o)
    o.backward(do)
    check_mask_grad(leaf.grad, q, k, v, do, True, attn_mask=leaf.detach())


def test_the_custom_op_trains_a_bias_under_compile():
    """fullgraph=True: the bias's gradient comes back through the custom op's backward, equal to eager's."""
    q, k, v = make_qkv(2, 4, 2, 19, 40, 64, torch.bfloat16, layout="bshd", seed=5)
    bias = _bias((1, 4, 19, 40), seed=6)
    compiled_in, eager_in = _leaves(q, k, v, bias), _leaves(q, k, v, bias)

    def block(q, k, v, m):
        return (fmha.attention(q * 1.0, k, v, layout="bshd", attn_mask=m * 1.0).float() ** 2).sum()
    try:
        torch.compile(block, backend="aot_eager", fullgraph=True)(*compiled_in).backward()
    finally:
        torch._dynamo.reset()
    block(*eager_in).backward()
    for a, b in zip(compiled_in, eager_in):
        torch.testing.assert_close(a.grad, b.grad)
