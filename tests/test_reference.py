"""The seed's recurrence (reference b) equals the definition (reference a) in float64."""
import numpy as np
import pytest

from fmha import reference as R

rng = np.random.default_rng(0)


def qkv(b, h, hk, sq, sk, d, scale=1.0):
    return (scale * rng.standard_normal((b, h, sq, d)), scale * rng.standard_normal((b, hk, sk, d)),
            rng.standard_normal((b, hk, sk, d)))


@pytest.mark.parametrize("block_n", [1, 7, 16, 64, 128])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("sq,sk", [(1, 1), (17, 17), (33, 70), (70, 33)])
def test_online_equals_dense(block_n, causal, align, sq, sk):
    q, k, v = qkv(2, 4, 2, sq, sk, 32)
    o_a, lse_a = R.dense_attention(q, k, v, causal=causal, causal_align=align, return_lse=True)
    o_b, lse_b = R.online_attention(q, k, v, causal=causal, causal_align=align, block_n=block_n,
                                    return_lse=True)
    np.testing.assert_allclose(o_b, o_a, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse_a), np.isinf(lse_b))
    fin = np.isfinite(lse_a)
    np.testing.assert_allclose(lse_b[fin], lse_a[fin], rtol=1e-12, atol=1e-12)


def test_fully_masked_rows_are_zero():
    # bottom-right causal with seqlen_q > seqlen_k: the first sq - sk rows see no key
    q, k, v = qkv(1, 2, 2, 40, 9, 32)
    for fn in (R.dense_attention, lambda *a, **kw: R.online_attention(*a, block_n=4, **kw)):
        o, lse = fn(q, k, v, causal=True, causal_align="bottom_right", return_lse=True)
        assert np.all(o[:, :, :31] == 0) and np.all(np.isneginf(lse[:, :, :31]))
        assert np.all(np.isfinite(o)) and np.all(np.isfinite(lse[:, :, 31:]))


def test_large_scores_stay_finite():
    # scores of order 1e4: a naive exp overflows; the running max keeps every exp2 <= 1
    q, k, v = qkv(1, 1, 1, 20, 50, 64, scale=30.0)
    o_a = R.dense_attention(q, k, v)
    o_b = R.online_attention(q, k, v, block_n=16)
    assert np.all(np.isfinite(o_b))
    np.testing.assert_allclose(o_b, o_a, rtol=1e-10, atol=1e-10)


def test_rows_are_convex_combinations():
    q, k, _ = qkv(1, 1, 1, 10, 30, 32)
    v = np.ones((1, 1, 30, 32))
    np.testing.assert_allclose(R.online_attention(q, k, v, block_n=8), 1.0, rtol=1e-12)


def test_trace_follows_one_row():
    q, k, v = qkv(1, 1, 1, 5, 48, 32)
    _, trace = R.online_attention(q, k, v, block_n=16, trace_row=(0, 0, 3))
    assert trace.tile == [0, 1, 2]
    assert all(a <= 1.0 for a in trace.alpha) and trace.alpha[0] == 0.0  # first tile: 2^(-inf)
    assert all(np.diff(trace.m) >= 0)  # the running max never decreases
    s = R.LOG2E / np.sqrt(32) * (q[0, 0, 3] @ k[0, 0].T)
    assert trace.m[-1] == pytest.approx(s.max(), rel=1e-12)
    assert trace.l[-1] == pytest.approx(np.exp2(s - s.max()).sum(), rel=1e-12)
