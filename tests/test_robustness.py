"""Property tests against the float64 reference, NaN locality, and fmha inside torch.compile."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fmha
from conftest import DEVICE, check_against_reference, make_qkv, nan_like, drawn_inputs
from fmha import reference
from fmha.kernels import VARIANTS


@st.composite
def problems(draw):
    kv_heads = draw(st.integers(1, 2))
    return dict(
        variant=draw(st.sampled_from(list(VARIANTS))),
        batch=draw(st.integers(1, 2)),
        kv_heads=kv_heads,
        heads=kv_heads * draw(st.sampled_from([1, 2, 3])),
        seqlen_q=draw(st.integers(1, 40)),
        seqlen_k=draw(st.integers(1, 40)),
        head_dim=draw(st.sampled_from([32, 64, 96])),
        dtype=draw(st.sampled_from([torch.float16, torch.bfloat16])),
        layout=draw(st.sampled_from(["bhsd", "bshd"])),
        contiguous=draw(st.booleans()),
        causal=draw(st.booleans()),
        align=draw(st.sampled_from(["top_left", "bottom_right"])),
        num_splits=draw(st.sampled_from([0, 0, 1, 3])),  # 3: split keys merged by LSE
        window=(draw(st.integers(-1, 45)), draw(st.integers(-1, 45))),  # -1: that side open
        softcap=draw(st.sampled_from([0.0, 0.0, 4.0])),
        alibi=draw(st.booleans()),
        seqused=draw(st.booleans()),
        sinks=draw(st.booleans()),
        seed=draw(st.integers(0, 2 ** 16)),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(p=problems())
def test_random_problems_match_reference(p):
    """Shapes, layouts, alignments, the key split, every modifier and attention sinks drawn together; with
    ``seqused``, each batch uses a drawn number of its keys (the rest hold NaN, never read)."""
    q, k, v, mods, used = drawn_inputs(p)
    out = nan_like(q)
    _, lse = fmha.attention(q, k, v, causal=p["causal"], causal_align=p["align"], layout=p["layout"],
                            variant=p["variant"], out=out, num_splits=p["num_splits"], return_lse=True,
                            seqused_k=used.to(DEVICE) if p["seqused"] else None, **mods)
    for b, n in enumerate(used.tolist()):
        keys = (slice(b, b + 1), slice(None), slice(0, n)) if p["layout"] == "bhsd" else (slice(b, b + 1), slice(0, n))
        own = slice(b, b + 1)
        check_against_reference(out[own], q[own], k[keys], v[keys], p["causal"], p["align"], p["layout"],
                                lse=lse[own], **mods)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_nan_in_a_query_row_stays_in_that_row(variant):
    q, k, v = make_qkv(1, 2, 1, 37, 45, 64, torch.float16)
    q[0, 1, 20, 3] = float("nan")
    o = fmha.attention(q, k, v, variant=variant).cpu().double().numpy()
    bad = ~np.isfinite(o).all(axis=-1)
    expected = np.zeros_like(bad)
    expected[0, 1, 20] = True
    np.testing.assert_array_equal(bad, expected)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_nan_in_a_key_reaches_only_the_rows_that_see_it(variant):
    q, k, v = make_qkv(1, 2, 1, 40, 40, 64, torch.float16)
    k[0, 0, 25, 0] = float("inf")   # inf * q gives +-inf or NaN scores: only in rows that see key 25
    o = fmha.attention(q, k, v, causal=True, variant=variant).cpu().double().numpy()
    ref = reference.dense_attention(q, k, v, causal=True)
    sees = np.arange(40) >= 25
    assert np.isfinite(o[:, :, ~sees]).all()
    np.testing.assert_allclose(o[:, :, ~sees], ref[:, :, ~sees], atol=2e-3)
    # a row that sees the key gets what the float64 reference gets (NaN, or the inf key's value row)
    np.testing.assert_array_equal(np.isnan(o[:, :, sees]), np.isnan(ref[:, :, sees]))


def test_custom_op_registration():
    q, k, v = make_qkv(1, 2, 1, 17, 20, 32, torch.float16)
    torch.library.opcheck(torch.ops.fmha.attention.default,
                          (q, k, v, True, None, "tiled", "bottom_right", "bhsd", True))


def test_under_torch_compile():
    q, k, v = make_qkv(1, 2, 2, 17, 23, 64, torch.bfloat16)

    def block(q, k, v):
        o, lse = fmha.attention(q * 1.0, k, v, causal=True, return_lse=True)
        return o.float().sum(-1) + lse

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    got = compiled(q, k, v)
    torch.testing.assert_close(got, block(q, k, v), atol=1e-2, rtol=1e-3)
    assert DEVICE in str(got.device)
    ref, ref_lse = reference.dense_attention(q, k, v, causal=True, return_lse=True)
    np.testing.assert_allclose(got.cpu().double().numpy(), ref.sum(-1) + ref_lse, atol=5e-2, rtol=1e-3)
