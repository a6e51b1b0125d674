"""The Gluon backward on sm_90 (:mod:`fmha.kernels.hopper.backward`): the calls it takes run on it, their
gradients pass the float64 yardstick (:func:`fmha.verify.check_grads`) in every layout real programs
pass, what lies past a head's rows never reaches them, and it agrees with the Triton backward.  Its sm_90
build (the TMA reduce-add written into the PTX) is checked on the CPU in test_targets."""
import pytest
import torch

import fmha
from conftest import DEVICE, make_qkv, packed, replays_as_it_ran
from fmha import backward, plan
from fmha.verify import check_grads

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("every_length")]
RULE = dict(backward.GLUON_ROWS)
RULE_DETERMINISTIC = dict(backward.GLUON_ROWS_DETERMINISTIC)


@pytest.fixture
def every_length(monkeypatch):
    """The Gluon backward on every length, deterministic too (the tables send short walks, and deterministic
    ones at head_dim 64, to the Triton kernels)."""
    monkeypatch.setattr(backward, "GLUON_ROWS", {d: 0 for d in RULE})
    monkeypatch.setattr(backward, "GLUON_ROWS_DETERMINISTIC", {d: 0 for d in RULE})

SHAPES = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim)
    (2, 4, 2, 300, 200, 128),   # GQA, sq > sk, neither a multiple of a tile
    (1, 8, 2, 1000, 1000, 64),
    (1, 2, 2, 129, 257, 96),    # padded head_dim
    (2, 4, 4, 64, 64, 32),
    (1, 4, 1, 77, 1030, 128),   # MQA, sk > sq
    (1, 4, 2, 100, 700, 64),    # sk > sq: causal key blocks past the last query's diagonal have no tile to visit
    (1, 4, 2, 700, 300, 64),    # sq > sk: bottom-right, 400 rows see no key (LSE -inf) in the 128-row tiles
    (1, 4, 2, 300, 500, 80),    # Phi-2's head dim, padded to 128
    (2, 2, 1, 129, 200, 40),    # padded to 64, not a multiple of 16
    (1, 2, 2, 260, 260, 120),
    (1, 4, 2, 300, 500, 256),   # Gemma's head dim: each warpgroup dK's and dV's column half over 64 keys
    (2, 2, 1, 129, 200, 192),   # padded to 256, its products over 192 columns
    (1, 2, 2, 200, 333, 136),   # 192 columns multiplied, 56 of them TMA's zeros
]
ALIGNS = [(False, "top_left"), (True, "top_left"), (True, "bottom_right")]


def leaves(*tensors):
    return [t.detach().clone().requires_grad_(True) for t in tensors]


def gradients(q, k, v, seed, **kw):
    q, k, v = leaves(q, k, v)
    o = fmha.attention(q, k, v, **kw)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(seed)).to(o)
    o.backward(do)
    return (q.grad, k.grad, v.grad), (q, k, v, do)


def runs_on(q, k, v, layout="bhsd", causal=False, deterministic=False, alibi_slopes=None, **kw):
    prob = plan.problem(*plan.sizes(q, k, layout), causal=causal, scale=None, **kw)
    return backward.kernel(prob, q, k, v, q, layout, alibi_slopes, deterministic)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("causal,align", ALIGNS)
@pytest.mark.parametrize("layout", ["bhsd", "bshd", "hf-view"])
def test_hopper_backward_matches_the_reference(shape, causal, align, layout):
    i = SHAPES.index(shape) + ALIGNS.index((causal, align))
    dtype = (torch.float16, torch.bfloat16)[i % 2]
    if layout == "hf-view":  # transformers: bshd storage handed over as bhsd views
        q, k, v = (t.transpose(1, 2) for t in make_qkv(*shape, dtype, "bshd", seed=i))
        layout = "bhsd"
    else:
        q, k, v = make_qkv(*shape, dtype, layout, seed=i)
    assert runs_on(q, k, v, layout, causal=causal, causal_align=align) == "hopper"
    grads, (q, k, v, do) = gradients(q, k, v, i, causal=causal, causal_align=align, layout=layout)
    check_grads(grads, q, k, v, do, causal, align, layout)


def test_hopper_backward_reads_fused_qkv_slices():
    """q, k and v as slices of one fused projection [b, s, 3 * h * d], as a model's qkv layer gives them."""
    b, s, h, d = 2, 333, 4, 64
    qkv = torch.randn(b, s, 3, h, d, dtype=torch.bfloat16, device=DEVICE)
    q, k, v = qkv.unbind(2)
    assert runs_on(q, k, v, "bshd", causal=True) == "hopper"
    grads, (q, k, v, do) = gradients(q, k, v, 3, causal=True, layout="bshd")
    check_grads(grads, q, k, v, do, True, "top_left", "bshd")


def test_nan_past_a_heads_rows_stays_out():
    """Each head's sequence ends inside a larger buffer (a KV cache with spare capacity) whose rows past
    it hold NaN: the last tile's rows past the end read TMA's zeros, so no gradient turns NaN."""
    b, h, s, d, spare = 1, 4, 200, 128, 56

    def cached(seed):
        buf = torch.full((b, h, s + spare, d), float("nan"), dtype=torch.bfloat16, device=DEVICE)
        buf[:, :, :s] = torch.randn(b, h, s, d, generator=torch.Generator().manual_seed(seed)).to(buf)
        return buf[:, :, :s]
    q, k, v = cached(0), cached(1), cached(2)
    assert runs_on(q, k, v, causal=True) == "hopper"
    grads, (q, k, v, do) = gradients(q, k, v, 4, causal=True)
    check_grads(grads, q, k, v, do, True)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_the_next_heads_statistics_stay_out(head_dim):
    """A tile's LSEs and deltas are read from the rows of every head one after another; the rows of a last tile
    past seqlen_q must not be the next head's.  Here the next head's LSE is below -250 (P read with it would
    overflow) and its dO NaN (so is its delta): the head before it gets the gradients it gets alone."""
    q, k, v = (t.clone() for t in make_qkv(1, 2, 2, 200, 200, head_dim, torch.bfloat16, seed=41))
    q[:, 1], k[:, 1] = 6.0, -6.0  # every score of head 1 is -36 * head_dim * scale
    assert runs_on(q, k, v, causal=True) == "hopper"
    a, b, c = leaves(q, k, v)
    o, lse = fmha.attention(a, b, c, causal=True, return_lse=True)
    assert lse[0, 1].max().item() < -250
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(8)).to(o)
    do[:, 1] = float("nan")
    o.backward(do)
    a0, b0, c0 = leaves(q[:, :1], k[:, :1], v[:, :1])
    fmha.attention(a0, b0, c0, causal=True).backward(do[:, :1])
    for name, got, alone in zip("qkv", (a.grad, b.grad, c.grad), (a0.grad, b0.grad, c0.grad)):
        assert torch.isfinite(got[:, :1]).all(), name
        torch.testing.assert_close(got[:, :1], alone, atol=1e-2, rtol=1.6e-2, msg=name)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_hopper_backward_under_scores_far_from_zero(head_dim, causal):
    """One key 8x the others (every row's LSE near its score), and a scale of 4 with rising scores (LSEs
    in the hundreds): S^T's accumulator starts at -LSE / scale (the 64-wide tiles), so P's exponent is the
    difference of two large numbers there; it stays within the yardstick."""
    q, k, v = make_qkv(1, 4, 2, 384, 384, head_dim, torch.bfloat16, seed=31)
    k[:, :, 5] *= 8
    rising = torch.linspace(0, 3, 384, device=DEVICE).to(q.dtype)[:, None]
    for kw, (qq, kk) in ((dict(), (q, k)), (dict(scale=4.0), (q.abs() + 1, k.abs() * rising))):
        assert runs_on(qq, kk, v, causal=causal) == "hopper"
        grads, (a, b, c, do) = gradients(qq, kk, v, 6, causal=causal, **kw)
        check_grads(grads, a, b, c, do, causal, scale=kw.get("scale"))


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal,sq,sk", [(False, 200, 200), (True, 300, 200)])
def test_keys_past_seqlen_k_stay_out_under_scores_far_below_zero(head_dim, causal, sq, sk):
    """Every score near -36 * sqrt(head_dim) (LSEs below -250): the last key block's keys past seqlen_k are TMA's
    zeros, whose score 0 lies far above every LSE, so P = exp(0 - LSE) would overflow there and dQ turn NaN (inf
    times dS's zero); those keys are masked.  (Causal top-left with seqlen_q > seqlen_k: the last rows see the
    keys past the end as far as the diagonal goes.)"""
    q, k, v = make_qkv(1, 2, 2, sq, sk, head_dim, torch.bfloat16, seed=43)
    q, k = q * 0.1 + 6.0, k * 0.1 - 6.0
    assert runs_on(q, k, v, causal=causal) == "hopper"
    a, b, c = leaves(q, k, v)
    o, lse = fmha.attention(a, b, c, causal=causal, return_lse=True)
    assert lse.max().item() < -250
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(9)).to(o)
    o.backward(do)
    check_grads((a.grad, b.grad, c.grad), q, k, v, do, causal, o=o.detach(), lse=lse.detach())


WINDOWS = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim), window, causal, align
    ((1, 4, 2, 1000, 1000, 64), (100, 0), True, "top_left"),       # a band narrower than a key block
    ((2, 4, 2, 700, 900, 128), (300, -1), True, "bottom_right"),   # sk > sq: the band from the bottom-right diagonal
    ((1, 2, 2, 900, 500, 128), (256, 64), False, "top_left"),      # both sides, rows past 500 + 256 see no key
    ((1, 8, 2, 1200, 1200, 96), (513, 0), True, "top_left"),
    ((1, 4, 2, 800, 800, 256), (200, 0), True, "top_left"),
]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shape,window,causal,align", WINDOWS, ids=lambda x: str(x))
def test_hopper_backward_with_a_sliding_window(shape, window, causal, align, deterministic):
    """A sliding window with an upper edge runs on the Gluon backward: each key block walks the query tiles its
    band reaches, masked where an edge crosses a tile; the gradients pass the float64 yardstick, and
    deterministic, three runs give the same bits."""
    i = WINDOWS.index((shape, window, causal, align))
    q, k, v = make_qkv(*shape, (torch.float16, torch.bfloat16)[i % 2], seed=60 + i)
    kw = dict(causal=causal, causal_align=align, window=window)
    assert runs_on(q, k, v, deterministic=deterministic, **kw) == "hopper"
    runs = [gradients(q, k, v, i, deterministic=deterministic, **kw) for _ in range(3 if deterministic else 1)]
    for grads, _ in runs[1:]:
        for name, a, e in zip("qkv", grads, runs[0][0]):
            assert torch.equal(a, e), name
    grads, (q, k, v, do) = runs[0]
    check_grads(grads, q, k, v, do, causal, align, window=window)


MODIFIED = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim), causal, align, window, softcap, ALiBi
    ((2, 4, 2, 300, 500, 256), True, "top_left", (-1, -1), 50.0, False),        # Gemma 2's full layers
    ((1, 4, 2, 700, 700, 256), True, "top_left", (256, 0), 50.0, False),        # ... and its sliding ones
    ((1, 4, 2, 333, 200, 128), True, "bottom_right", (-1, -1), 5.0, False),     # a cap the scores reach, GQA
    ((1, 2, 2, 260, 390, 128), False, "top_left", (-1, -1), 0.0, True),         # BLOOM's and MPT's ALiBi
    ((2, 4, 1, 300, 300, 64), True, "top_left", (-1, -1), 0.0, True),           # S^T's registers form: the bias
    ((1, 4, 2, 200, 500, 64), True, "bottom_right", (-1, -1), 3.0, True),       # capped: 64-row tiles instead
    ((2, 2, 2, 300, 300, 32), False, "top_left", (-1, -1), 30.0, False),
    ((1, 2, 1, 129, 257, 96), True, "top_left", (100, 0), 10.0, True),          # every modifier together
    ((1, 2, 2, 300, 300, 192), True, "top_left", (-1, -1), 20.0, False),        # DeepSeek's q/k with V's 128 below
]


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", MODIFIED,
                         ids=lambda c: "d{5}".format(*c[0]) + f"-cap{c[4]:g}" + ("-alibi" if c[5] else ""))
def test_hopper_backward_with_softcap_and_alibi(case, deterministic):
    """Softcap and ALiBi (one slope a head) run on the Gluon backward: the scores capped and biased as the forward
    took them, dS through the cap's derivative, in every form of the kernel (S^T's registers form at 64 with ALiBi,
    P and dS in shared memory at 96-128 and capped at 32-64, column shares past 128, V narrower); the gradients
    pass the float64 yardstick, and deterministic, two runs give the same bits.  Scores that reach the cap (q scaled
    up) make its derivative matter."""
    shape, causal, align, window, cap, alibi = case
    i = MODIFIED.index(case)
    q, k, v = make_qkv(*shape, (torch.float16, torch.bfloat16)[i % 2], seed=90 + i)
    if shape[-1] == 192:
        v = v[..., :128].contiguous()
    if cap:
        q = q * 3
    slopes = torch.linspace(0.02, 0.5, shape[1], device=DEVICE) if alibi else None
    kw = dict(causal=causal, causal_align=align, window=window, softcap=cap, alibi_slopes=slopes)
    mods = dict(head_dim_v=128) if shape[-1] == 192 else {}
    assert runs_on(q, k, v, deterministic=deterministic, **kw, **mods) == "hopper"
    runs = [gradients(q, k, v, i, deterministic=deterministic, **kw) for _ in range(2 if deterministic else 1)]
    for grads, _ in runs[1:]:
        for name, a, e in zip("qkv", grads, runs[0][0]):
            assert torch.equal(a, e), name
    grads, (q, k, v, do) = runs[0]
    check_grads(grads, q, k, v, do, causal, align, window=window, softcap=cap, alibi_slopes=slopes)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_packed_sequences_with_softcap_and_alibi(head_dim):
    """Packed sequences with softcap and ALiBi on the Gluon backward: each sequence's bias about its own
    bottom-right diagonal, its gradients its own (at 64 in the capped calls' 64-row tiles, whose dQ rows leave
    their own room after each sequence)."""
    lens_q, lens_k = [200, 77, 333, 1], [260, 77, 300, 50]
    slopes = torch.linspace(0.05, 0.4, 4, device=DEVICE)
    kw = dict(causal=True, causal_align="bottom_right", softcap=8.0, alibi_slopes=slopes)
    grads, tensors, cu = packed_gradients(lens_q, lens_k, 4, 2, head_dim, 21, **kw)
    for b, found, (q, k, v, do) in each_sequence(grads, tensors, cu):
        check_grads(found, q, k, v, do, True, "bottom_right", "bshd", softcap=8.0, alibi_slopes=slopes)


PACKED = [  # (query rows and keys of each sequence, heads, kv_heads, head_dim, causal, align, window)
    ([300, 129, 1, 700, 64], [300, 129, 1, 700, 64], 4, 2, 64, True, "bottom_right", (-1, -1)),
    ([300, 129, 1, 700, 64], [300, 129, 1, 700, 64], 4, 2, 64, False, "top_left", (-1, -1)),
    ([200, 77, 513], [300, 20, 513], 4, 1, 128, True, "bottom_right", (-1, -1)),  # keys != rows in a sequence
    ([200, 77, 513], [300, 20, 513], 4, 4, 128, False, "top_left", (-1, -1)),
    ([260, 0, 190], [260, 5, 190], 2, 2, 96, True, "top_left", (50, 0)),  # an empty one (its keys unseen), a window
    ([200, 77, 513], [300, 20, 513], 4, 2, 80, True, "bottom_right", (-1, -1)),
    ([200, 77, 513], [300, 20, 513], 4, 2, 256, True, "bottom_right", (-1, -1)),
]


def packed_gradients(lens_q, lens_k, heads, kv_heads, d, seed, poison=None, far=False, **kw):
    """Gradients of attention_varlen over packed sequences (``poison``: a sequence whose first query, key, value
    and dO rows are NaN; ``far``: q near +6 and k near -6, every score far below zero), with its inputs and
    cu_seqlens."""
    dtype = (torch.float16, torch.bfloat16)[seed % 2]
    (q, cu_q), (k, cu_k), (v, _) = (packed(lens, h, d, dtype, seed + i) for i, (lens, h) in
                                    enumerate(((lens_q, heads), (lens_k, kv_heads), (lens_k, kv_heads))))
    do = packed(lens_q, heads, d, dtype, seed + 3)[0]
    if far:
        q, k = q * 0.1 + 6, k * 0.1 - 6
    if poison is not None:
        for t, cu in ((q, cu_q), (k, cu_k), (v, cu_k), (do, cu_q)):
            t[int(cu[poison])] = float("nan")
    deterministic = kw.get("deterministic", False)
    prob = plan.problem(len(lens_q), heads, kv_heads, q.shape[0], k.shape[0], d, scale=None, varlen=True,
                        **{n: kw[n] for n in ("causal", "causal_align", "window") if n in kw})
    assert backward.kernel(prob, q[None], k[None], v[None], q[None], "bshd", None, deterministic,
                           max(lens_q)) == "hopper"
    q, k, v = leaves(q, k, v)
    o = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **kw)
    o.backward(do)
    return (q.grad, k.grad, v.grad), (q, k, v, do), (cu_q, cu_k)


def each_sequence(grads, tensors, cu_seqlens):
    """Per packed sequence: its index, its dQ, dK, dV and its q, k, v, dO as one-sequence bshd tensors."""
    cu_q, cu_k = cu_seqlens
    for b in range(len(cu_q) - 1):
        rq, rk = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        yield (b, [g[r][None] for g, r in zip(grads, (rq, rk, rk))],
               [t[r][None] for t, r in zip(tensors, (rq, rk, rk, rq))])


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("case", PACKED, ids=lambda c: f"d{c[4]}-{'causal' if c[5] else 'full'}-{c[6]}-w{c[7][0]}")
def test_hopper_backward_of_packed_sequences(case, deterministic):
    """Packed sequences on the Gluon backward: each sequence's gradients are its own alone, by the float64
    yardstick (the rows and keys of a last tile past a sequence's end belong to the next one); deterministic, three
    runs give the same bits."""
    lens_q, lens_k, heads, kv_heads, d, causal, align, window = case
    kw = dict(causal=causal, causal_align=align, window=window, deterministic=deterministic)
    runs = [packed_gradients(lens_q, lens_k, heads, kv_heads, d, PACKED.index(case), **kw)
            for _ in range(3 if deterministic else 1)]
    for grads, _, _ in runs[1:]:
        for name, a, e in zip("qkv", grads, runs[0][0]):
            assert torch.equal(a, e), name
    grads, tensors, cu = runs[0]
    for b, found, (q, k, v, do) in each_sequence(grads, tensors, cu):
        if q.shape[1] == 0:
            assert not found[1].any() and not found[2].any(), "keys no query sees have gradients"
            continue
        check_grads(found, q, k, v, do, causal, align, "bshd", window=window)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_packed_sequences_stay_apart_in_the_hopper_backward(head_dim):
    """NaN in the first query, key, value and dO rows of one packed sequence reaches no other sequence's
    gradients (the rows and keys past a sequence's end are zeroed before any product), under scores far below
    zero (where a zero key past an end would overflow P if it were not masked): theirs pass the float64 yardstick.
    (Not bit for bit those of the same call without the NaN: the forward's rescaling, decided a warp of rows at a
    time, moves a neighbour's output by a rounding.)"""
    lens = [200, 77, 333]
    kw = dict(causal=True, causal_align="bottom_right", deterministic=True, far=True)
    grads, tensors, cu = packed_gradients(lens, lens, 4, 2, head_dim, 11, poison=1, **kw)
    for b, found, (q, k, v, do) in each_sequence(grads, tensors, cu):
        if b != 1:
            check_grads(found, q, k, v, do, True, "bottom_right", "bshd")


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shape,causal,align", [((1, 4, 2, 300, 500, 256), True, "bottom_right"),
                                                ((2, 2, 1, 129, 200, 128), False, "top_left"),
                                                ((1, 4, 2, 900, 1000, 96), True, "top_left")],
                         ids=["d256-causal", "d128", "d96-long"])
def test_hopper_backward_with_q_and_do_freed_the_other_way(shape, causal, align, deterministic, monkeypatch):
    """``Tiles.early_free`` set the other way from :func:`~fmha.kernels.hopper.backward.tiles`'s choice (on past
    head_dim 128: Q's and dO's stage freed once dV's and dK's products are done, the next tile's loads overlapping dQ's
    products and adds, the P/dS buffer freed by its own barrier; off at 128 and below): the gradients pass the float64
    yardstick; deterministic, two runs give the same bits."""
    from fmha.kernels.hopper import backward as hopper
    table = hopper.tiles
    monkeypatch.setattr(hopper, "tiles",
                        lambda head, det=False, dv=0: table(head, det, dv)._replace(
                            early_free=not table(head, det, dv).early_free))
    i = 3 if deterministic else 5
    q, k, v = make_qkv(*shape, torch.bfloat16, seed=70 + shape[5] + i)
    kw = dict(causal=causal, causal_align=align, deterministic=deterministic)
    assert runs_on(q, k, v, **kw) == "hopper"
    runs = [gradients(q, k, v, i, **kw) for _ in range(2 if deterministic else 1)]
    if deterministic:
        for name, a, e in zip("qkv", runs[1][0], runs[0][0]):
            assert torch.equal(a, e), name
    grads, (q, k, v, do) = runs[0]
    check_grads(grads, q, k, v, do, causal, align)


NARROWER = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, V's), causal, align, layout, deterministic
    ((1, 4, 2, 300, 500, 192, 128), True, "bottom_right", "bhsd", False),   # DeepSeek-V3's heads, 256-wide tiles
    ((2, 4, 4, 257, 200, 192, 128), False, "top_left", "bshd", True),
    ((1, 4, 1, 700, 700, 192, 128), True, "top_left", "bshd", False),
    ((1, 2, 2, 129, 300, 128, 64), True, "top_left", "bhsd", True),        # V padded within a 128-wide tile
    ((1, 2, 1, 333, 333, 96, 40), False, "top_left", "bhsd", False),
    ((1, 2, 1, 200, 300, 256, 192), True, "bottom_right", "bshd", True),  # dV's columns shared 128 + 64
    ((1, 2, 2, 150, 150, 160, 40), False, "top_left", "bhsd", False),     # dV's 64 + 64 over 40
    ((1, 4, 2, 333, 400, 256, 128), True, "top_left", "bshd", False),     # two stages beside four dQ pieces: 231 KB
    ((2, 4, 2, 300, 200, 64, 32), True, "bottom_right", "bshd", True),   # S^T's form: dP^T over V's 32, dV m64n32
    ((1, 2, 1, 257, 300, 112, 72), False, "top_left", "bhsd", False),   # dP over 80 columns (64 + 16), dV m64n72
]


@pytest.mark.parametrize("case", NARROWER, ids=lambda c: "d{5}-v{6}".format(*c[0]) + ("-causal" if c[1] else ""))
def test_hopper_backward_with_v_narrower_than_q_and_k(case):
    """V's head dim below q/k's: V and dO read in q/k's tiles, TMA's zeros past V's columns, dV stored over V's own;
    the gradients pass the float64 yardstick (GQA, lengths off the tiles, both layouts and alignments);
    deterministic, two runs give the same bits."""
    (b, h, kvh, sq, sk, d, dv), causal, align, layout, deterministic = case
    i = NARROWER.index(case)
    q, k, _ = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, layout, seed=80 + i)
    v = make_qkv(b, h, kvh, sq, sk, dv, torch.bfloat16, layout, seed=90 + i)[2]
    kw = dict(causal=causal, causal_align=align, layout=layout, deterministic=deterministic)
    assert runs_on(q, k, v, layout, causal=causal, causal_align=align, deterministic=deterministic,
                   head_dim_v=dv) == "hopper"
    runs = [gradients(q, k, v, i, **kw) for _ in range(2 if deterministic else 1)]
    if deterministic:
        for name, a, e in zip("qkv", runs[1][0], runs[0][0]):
            assert torch.equal(a, e), name
    grads, (q, k, v, do) = runs[0]
    assert grads[2].shape == v.shape
    check_grads(grads, q, k, v, do, causal, align, layout)


def test_packed_sequences_with_v_narrower_than_q_and_k():
    """Packed sequences of DeepSeek-V3's heads (192/128) on the Gluon backward, V narrower: each sequence's gradients
    pass the float64 yardstick alone."""
    lens = [200, 77, 513]
    (q, cu), (k, _), (v, _), (do, _) = (packed(lens, h, d, torch.bfloat16, 100 + j) for j, (h, d) in
                                        enumerate(((4, 192), (2, 192), (2, 128), (4, 128))))
    q, k, v = leaves(q, k, v)
    o = fmha.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    o.backward(do)
    for b, found, (qs, ks, vs, dos) in each_sequence((q.grad, k.grad, v.grad), (q, k, v, do), (cu, cu)):
        check_grads(found, qs.detach(), ks.detach(), vs.detach(), dos, True, "bottom_right", "bshd")


def test_a_scale_below_the_hopper_backwards_least_runs_on_triton():
    """The Gluon backward divides the LSE by the scale; a scale below ``MIN_SCALE`` (or not positive) goes
    to the Triton kernels, whose gradients still pass."""
    from fmha.kernels.hopper import backward as hopper
    q, k, v = make_qkv(1, 2, 2, 256, 256, 64, torch.bfloat16, seed=32)
    for scale in (2.0 ** -70, 0.0, -0.125):
        prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=False, scale=scale)
        assert hopper.supports(prob, q, k, v, q, "bhsd", False) is not None
        assert backward.kernel(prob, q, k, v, q, "bhsd", None) == "triton"
    grads, (a, b, c, do) = gradients(q, k, v, 7, scale=2.0 ** -70)
    check_grads(grads, a, b, c, do, False, scale=2.0 ** -70)


@pytest.mark.parametrize("causal", [False, True])
def test_hopper_backward_agrees_with_the_triton_backward(causal, monkeypatch):
    """The same gradients as the deterministic Triton kernels, to bfloat16's rounding, on a longer sequence
    (many query tiles per key block, several key blocks)."""
    q, k, v = make_qkv(2, 8, 2, 2048, 2048, 128, torch.bfloat16, seed=9)
    assert runs_on(q, k, v, causal=causal) == "hopper"
    fast, _ = gradients(q, k, v, 5, causal=causal)
    monkeypatch.setattr(backward, "GLUON_ROWS_DETERMINISTIC", {d: None for d in RULE})
    assert runs_on(q, k, v, causal=causal, deterministic=True) == "triton"
    exact, _ = gradients(q, k, v, 5, causal=causal, deterministic=True)
    for name, a, e in zip("qkv", fast, exact):
        scale = e.float().abs().max().item()
        assert (a.float() - e.float()).abs().max().item() <= 2e-2 * scale, name


DETERMINISTIC_SHAPES = [  # many key blocks adding into each dQ tile, in every order the walks take
    (1, 8, 2, 2048, 2048, 128),  # GQA: a program walks two heads' tiles
    (2, 4, 4, 1500, 1100, 64),   # sq > sk: the causal diagonal below the first query tile
    (1, 4, 2, 700, 1900, 128),   # sk > sq: causal key blocks with no tile to visit; 15 key blocks, 11 query
    #                              tiles: chunks of 11 blocks, the last one short
    (1, 2, 1, 1000, 1000, 96),
    (1, 2, 1, 1000, 1000, 48),
    (1, 4, 2, 900, 1000, 256),   # 64-key blocks, dQ's column halves each added in two pieces
]


@pytest.mark.parametrize("shape", DETERMINISTIC_SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("causal,align", ALIGNS)
def test_deterministic_hopper_backward_repeats_its_bits(shape, causal, align):
    """``deterministic=True`` on the Gluon kernel: dQ's tiles are added in one order (each key block waits its
    turn), so three runs give the same bits, and they pass the float64 yardstick.  A wrong turn would never
    come (the kernel would hang), so every causal alignment and both length orders are walked here."""
    i = DETERMINISTIC_SHAPES.index(shape)
    q, k, v = make_qkv(*shape, torch.bfloat16, seed=20 + i)
    assert runs_on(q, k, v, causal=causal, causal_align=align, deterministic=True) == "hopper"
    kw = dict(causal=causal, causal_align=align, deterministic=True)
    runs = [gradients(q, k, v, i, **kw) for _ in range(3)]
    for grads, _ in runs[1:]:
        for name, a, e in zip("qkv", grads, runs[0][0]):
            assert torch.equal(a, e), name
    grads, (q, k, v, do) = runs[0]
    check_grads(grads, q, k, v, do, causal, align)


def test_deterministic_hopper_backward_with_more_key_blocks_than_sms():
    """More key blocks than SMs: the blocks go in chunks that fit the SMs (a chunk waits only for itself and
    the chunks before it), so the kernel finishes, repeats its bits and agrees with the fast mode."""
    sms = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    sk = (sms + 5) * 128
    q, k, v = make_qkv(1, 2, 1, 64 * (sms + 9), sk, 64, torch.bfloat16, seed=31)
    assert runs_on(q, k, v, deterministic=True) == "hopper"
    (a, _), (b, _) = (gradients(q, k, v, 7, deterministic=True) for _ in range(2))
    fast, _ = gradients(q, k, v, 7)
    for name, x, y, f in zip("qkv", a, b, fast):
        assert torch.equal(x, y), name
        assert (x.float() - f.float()).abs().max().item() <= 2e-2 * f.float().abs().max().item(), name


def test_causal_programs_in_sections_of_heads(monkeypatch):
    """Causal, the (batch, KV head)s go in L2-sized sections, key block-major inside one
    (:func:`fmha.kernels.hopper.backward.section`).  An L2 that holds two pairs makes sections of two and a last
    one of one (5 pairs): every key block of every pair runs once and the gradients pass the float64 yardstick.
    (Which calls take sections: test_configs.)"""
    from fmha.kernels.hopper import backward as gluon_backward
    shape = (5, 2, 1, 600, 700, 64)
    one = 600 * 2 * 64 * (2 * 2 + 4)
    monkeypatch.setattr(gluon_backward, "l2_bytes", lambda index: 2 * one + 1)
    q, k, v = make_qkv(*shape, torch.bfloat16, seed=41)
    prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=True, scale=None)
    assert gluon_backward.section(prob, 64, 2, 0, deterministic=False) == 2
    assert runs_on(q, k, v, causal=True) == "hopper"
    grads, (q, k, v, do) = gradients(q, k, v, 5, causal=True)
    check_grads(grads, q, k, v, do, True, "top_left")


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("shape,causal", [((2, 4, 2, 1024, 1024, 128), True), ((2, 4, 2, 300, 700, 64), False),
                                          ((1, 2, 2, 301, 200, 64), True)],
                         ids=["d128-causal", "d64", "lse-copied"])
def test_later_backwards_replay_the_first(shape, causal, deterministic, monkeypatch):
    """A backward's later calls of a kind replay the first one's launches (:mod:`fmha.replay`: nothing asks
    which kernel runs) without a host-device synchronization, into new gradients, dQ's float32 sum zeroed
    again by its launch: dK and dV bit for bit the ordinary path's, dQ too when deterministic, and every
    gradient past the float64 yardstick.  301 query rows: the LSE is copied into rows of 304 (a torch op), so
    that kind is not recorded and takes the ordinary path each time."""
    inputs = [make_qkv(*shape, torch.bfloat16, seed=50 + s) for s in range(3)]

    def grads(qkv, seed):
        q, k, v = leaves(*qkv)
        o = fmha.attention(q, k, v, causal=causal, deterministic=deterministic)
        do = torch.randn(o.shape, generator=torch.Generator(device=DEVICE).manual_seed(seed), device=DEVICE,
                         dtype=o.dtype)
        return torch.autograd.grad(o, (q, k, v), do), (q, k, v, do)
    for found, tensors in replays_as_it_ran(inputs, grads, deterministic, monkeypatch, recorded=shape[3] % 4 == 0):
        check_grads(found, *tensors, causal, "top_left")


def test_what_the_hopper_backward_leaves_to_triton(monkeypatch):
    monkeypatch.setattr(backward, "GLUON_ROWS", RULE)
    monkeypatch.setattr(backward, "GLUON_ROWS_DETERMINISTIC", RULE_DETERMINISTIC)
    for (head_dim, causal), rows in RULE.items():  # the walks too short to pay for a program's K/V and dK/dV
        q, k, v = make_qkv(1, 2, 2, rows, rows, head_dim, torch.bfloat16)
        assert runs_on(q, k, v, causal=causal) == "hopper"
        assert runs_on(q[:, :, :rows // 2], k, v, causal=causal) == "triton"
    for (head_dim, causal), rows in RULE_DETERMINISTIC.items():  # deterministic: where the fixed order beat dQ's pass
        q, k, v = make_qkv(1, 2, 2, rows or 4096, rows or 4096, head_dim, torch.bfloat16)
        assert runs_on(q, k, v, causal=causal, deterministic=True) == ("hopper" if rows else "triton")
        assert runs_on(q[:, :, :(rows or 4096) // 2], k, v, causal=causal, deterministic=True) == "triton"
    q, k, _ = make_qkv(1, 2, 2, 1024, 1024, 192, torch.bfloat16)
    v = make_qkv(1, 2, 2, 1024, 1024, 128, torch.bfloat16)[2]
    assert runs_on(q, k, v, head_dim_v=128) == "hopper"  # DeepSeek's 192/128: V narrower, read in q/k's tiles
    assert runs_on(q[..., :64], k[..., :64], v, head_dim_v=128) == "triton"  # V wider than q/k
    q, k, v = make_qkv(1, 2, 2, 1024, 1024, 64, torch.bfloat16)
    assert runs_on(q, k, v, window=(8, 0)) == "hopper"
    assert runs_on(q, k, v, window=(8, -1)) == "triton"  # open to the right: no upper edge
    assert runs_on(q, k, v, softcap=5.0, alibi_slopes=torch.ones(2, device=DEVICE)) == "hopper"
    assert runs_on(q, k, v, alibi_slopes=torch.ones(1, 2, device=DEVICE)) == "triton"  # a slope per (batch, head)


@pytest.mark.parametrize("deterministic", [False, True])
def test_hopper_backward_allocates_the_gradients_and_its_two_buffers_only(deterministic):
    """What the backward allocates beyond what the forward left (q, k, v, O, LSE): the three gradients, ``delta``
    (float32, as the LSE) and the float32 dQ its tiles add into (``[batch * heads, seqlen_q, head_dim]``, not the
    tile's 128 columns at head_dim 96), and, deterministic, its turn counters (two int32 a query tile and head).  The
    peak stays within their sum and 1 MB (the allocator's rounding, the LSE's zero gradient autograd may make); a copy
    of an input, a float32 dK or dV, or a dQ buffer as wide as the tile (4 MB more here), would go past it."""
    b, h, kvh, s, d = 2, 8, 2, 2048, 96
    q, k, v = leaves(*make_qkv(b, h, kvh, s, s, d, torch.bfloat16))
    assert runs_on(q, k, v, causal=True, deterministic=deterministic) == "hopper"
    o = fmha.attention(q, k, v, causal=True, deterministic=deterministic)
    do = torch.randn_like(o)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    o.backward(do)
    torch.cuda.synchronize()
    grads = sum(t.numel() * t.element_size() for t in (q, k, v))
    buffers = b * h * s * 4 + b * h * s * d * 4 + (b * h * -(-s // 64) * 2 * 4 if deterministic else 0)
    assert torch.cuda.max_memory_allocated() - base <= grads + buffers + (1 << 20)


@pytest.mark.parametrize("causal,varlen", [(False, False), (True, False), (True, True)],
                         ids=["dense", "causal", "packed-causal"])
def test_hopper_backward_replays_in_a_cuda_graph(causal, varlen):
    """Forward and backward captured in one CUDA graph, replayed on new inputs.  Under capture a call holds nothing
    past its end, so causal and packed walks take their key blocks from a counter of the call's own, zeroed by a
    launch inside the graph (``backward.schedule``), and every replay deals every block again: the gradients,
    poisoned before each replay, pass the float64 yardstick; dense walks (a fixed deal, no counter) alike."""
    from fmha.kernels.hopper import backward as hopper
    lens = [700, 300, 1000]
    heads, kv_heads, d = 4, 2, 128
    if varlen:
        cu = packed(lens, heads, d, torch.bfloat16, 0)[1]
        shapes = [(sum(lens), heads, d), (sum(lens), kv_heads, d), (sum(lens), kv_heads, d), (sum(lens), heads, d)]
    else:
        shapes = [(2, heads, 1000, d), (2, kv_heads, 1000, d), (2, kv_heads, 1000, d), (2, heads, 1000, d)]
    assert hopper.schedule(8, 132, causal, varlen, False)[1] == (causal or varlen)
    q, k, v = leaves(*(torch.zeros(s, dtype=torch.bfloat16, device=DEVICE) for s in shapes[:3]))
    do = torch.zeros(shapes[3], dtype=torch.bfloat16, device=DEVICE)

    def fill(seed):
        g = torch.Generator().manual_seed(seed)
        for t, s in zip((q, k, v, do), shapes):
            t.data.copy_(torch.randn(s, generator=g).to(t))

    def step():
        if varlen:
            o = fmha.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
        else:
            o = fmha.attention(q, k, v, causal=causal)
        return torch.autograd.grad(o, (q, k, v), do)

    fill(1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: compiled and replay-recorded outside the capture
        step(), step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        grads = step()
    for seed in (2, 3, 4):
        fill(seed)
        for g in grads:
            g.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if varlen:
            for b, found, tensors in each_sequence(grads, (q, k, v, do), (cu, cu)):
                check_grads(found, *tensors, causal, "top_left", "bshd")
        else:
            check_grads(grads, q, k, v, do, causal)
