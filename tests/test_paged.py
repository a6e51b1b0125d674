"""A paged KV cache gives the same attention as the contiguous cache it was cut from."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import fmha
from conftest import DEVICE, check_against_reference, make_qkv
from fmha.kernels import guards


def paginate(k, page, pages_per_seq, seed, fill=0.0):
    """[B, KVH, S, D] -> a shuffled page pool [num_pages, page, KVH, D] and its block table (the
    rows past S hold ``fill``)."""
    b, kvh, s, d = k.shape
    pad = pages_per_seq * page - s
    k = torch.nn.functional.pad(k, (0, 0, 0, pad), value=fill)
    pages = k.view(b, kvh, pages_per_seq, page, d).permute(0, 2, 3, 1, 4).reshape(b * pages_per_seq, page, kvh, d)
    perm = torch.randperm(b * pages_per_seq, generator=torch.Generator().manual_seed(seed))
    pool = torch.empty_like(pages)
    pool[perm] = pages
    table = perm.view(b, pages_per_seq).to(torch.int32).to(DEVICE)
    return pool.contiguous(), table


@pytest.mark.parametrize("sq,page,causal,splits,layout", [(1, 16, True, 0, "bhsd"), (5, 32, True, 3, "bshd"),
                                                          (24, 16, False, 0, "bhsd"), (3, 48, True, 1, "bhsd")])
def test_paged_matches_contiguous(sq, page, causal, splits, layout):
    b, h, kvh, d, sk = 2, 4, 2, 64, 100
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, seed=page)
    lens = torch.tensor([100, 37], dtype=torch.int32, device=DEVICE)
    pages_per_seq = -(-sk // page) + 1  # one spare page: the table is longer than any sequence
    k_pool, table = paginate(k, page, pages_per_seq, seed=1)
    v_pool, _ = paginate(v, page, pages_per_seq, seed=1)
    qq = q if layout == "bhsd" else q.transpose(1, 2).contiguous()
    o, lse = fmha.attention_paged(qq, k_pool, v_pool, table, lens, causal=causal, layout=layout,
                                  num_splits=splits, return_lse=True)
    o = o if layout == "bhsd" else o.transpose(1, 2)
    for i, n in enumerate(lens.tolist()):
        check_against_reference(o[i:i + 1], q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], causal, "bottom_right",
                                lse=lse[i:i + 1])


@pytest.mark.parametrize("splits", [0, 3])
def test_paged_takes_alibi_slopes_per_batch(splits):
    """``[batch, heads]`` slopes against a paged cache (decoding, the keys split or not): each sequence its row."""
    b, h, kvh, d, sk, page = 2, 4, 2, 64, 100, 16
    q, k, v = make_qkv(b, h, kvh, 3, sk, d, torch.bfloat16, seed=9)
    lens = torch.tensor([100, 37], dtype=torch.int32, device=DEVICE)
    k_pool, table = paginate(k, page, -(-sk // page), seed=2)
    v_pool, _ = paginate(v, page, -(-sk // page), seed=2)
    slopes = torch.rand(b, h, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    o, lse = fmha.attention_paged(q, k_pool, v_pool, table, lens, causal=True, num_splits=splits,
                                  alibi_slopes=slopes, return_lse=True)
    for i, n in enumerate(lens.tolist()):
        check_against_reference(o[i:i + 1], q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], True, "bottom_right",
                                lse=lse[i:i + 1], alibi_slopes=slopes[i])


@pytest.mark.parametrize("d,dv,splits", [(64, 32, 0), (128, 64, 3), (192, 128, 0), (80, 40, 2)])
def test_paged_takes_a_narrower_v(d, dv, splits):
    """V's pool narrower than K's (DeepSeek's 192/128, as FlashAttention-3's kvcache call takes it): O as wide
    as V, against the reference of the contiguous cache (``hopper``'s: :func:`test_hopper_paged_prefill`)."""
    b, h, kvh, sq, sk, page = 2, 4, 2, 3, 100, 16
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, seed=dv)
    v = v[..., :dv].contiguous()
    lens = torch.tensor([100, 41], dtype=torch.int32, device=DEVICE)
    pages_per_seq = -(-sk // page) + 1
    k_pool, table = paginate(k, page, pages_per_seq, seed=2)
    v_pool, _ = paginate(v, page, pages_per_seq, seed=2)
    o, lse = fmha.attention_paged(q, k_pool, v_pool, table, lens, causal=True, num_splits=splits, return_lse=True)
    assert o.shape == (b, h, sq, dv)
    for i, n in enumerate(lens.tolist()):
        check_against_reference(o[i:i + 1], q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], True, "bottom_right",
                                lse=lse[i:i + 1])
    with pytest.raises(ValueError, match=r"v_cache must be .*, D \(a multiple of 8 up to"):
        fmha.attention_paged(q, k_pool, torch.zeros(*v_pool.shape[:3], 2 * d, dtype=v_pool.dtype, device=DEVICE),
                             table, lens)  # wider than K's


def test_paged_errors():
    q, k, v = make_qkv(1, 2, 2, 1, 32, 32, torch.float16)
    pool = torch.zeros(4, 24, 2, 32, dtype=torch.float16, device=DEVICE)
    table = torch.zeros(1, 2, dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([20], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match=r"page_size a multiple of 16, got shape \(4, 24, 2, 32\) \(page_size 24\)"):
        fmha.attention_paged(q, pool, pool, table, lens)
    bhsd_cache = torch.zeros(1, 2, 32, 32, dtype=torch.float16, device=DEVICE)  # a contiguous cache, not pages
    with pytest.raises(ValueError, match=r"must be a page pool .*a contiguous \[batch, kv_heads, seqlen, head_dim\] "
                                         r"cache goes to fmha.attention"):
        fmha.attention_paged(q, bhsd_cache, bhsd_cache, table, lens)
    pool = torch.zeros(4, 16, 2, 32, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="block_table must be an int32 tensor"):
        fmha.attention_paged(q, pool, pool, table.long(), lens)
    with pytest.raises(ValueError, match=r"k_cache must be \[num_pages, page_size, kv_heads, 32\]"):
        fmha.attention_paged(q, pool[..., :16], pool, table, lens)
    with pytest.raises(ValueError, match="attention_paged runs variant 'auto', 'tiled' or 'hopper', got 'singlewave'"):
        fmha.attention_paged(q, pool, pool, table, lens, variant="singlewave")
    if DEVICE == "cpu":
        with pytest.raises(ValueError, match="variant 'hopper' cannot take this call: needs an sm_90 GPU"):
            fmha.attention_paged(q, pool, pool, table, lens, variant="hopper")


@pytest.mark.parametrize("entry", [4, 9, -1, 1_000_000])
@pytest.mark.parametrize("splits", [0, 2])
def test_block_table_entries_in_use_are_checked(entry, splits):
    """A page number outside the pool, in an entry the keys reach, is an error naming the entry
    (never a read outside the pool; on a GPU a device-side assert, see the test below); the same
    number past the keys in use is never followed."""
    q, _, _ = make_qkv(2, 2, 2, 3, 32, 32, torch.float16)
    pool = torch.randn(4, 16, 2, 32, generator=torch.Generator().manual_seed(0)).half().to(DEVICE)
    table = torch.tensor([[0, 1, 2], [3, 2, 1]], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([40, 20], dtype=torch.int32, device=DEVICE)
    if DEVICE == "cpu":
        bad = table.clone()
        bad[1, 1] = entry  # keys 16..19 of sequence 1 live there
        with pytest.raises(ValueError, match=rf"outside \[0, num_pages\): block_table\[1, 1\] = {entry} with "
                                             rf"num_pages = 4"):
            fmha.attention_paged(q, pool, pool, bad, lens, num_splits=splits)
    spare = table.clone()
    spare[1, 2] = entry  # past sequence 1's 20 keys: the kernel never reads it
    torch.testing.assert_close(fmha.attention_paged(q, pool, pool, spare, lens, num_splits=splits),
                               fmha.attention_paged(q, pool, pool, table, lens, num_splits=splits), atol=0, rtol=0)


@pytest.mark.parametrize("splits", [0, 3])
@pytest.mark.parametrize("self_checked", [True, False])
def test_tiled_checks_its_own_pages_in_one_launch(self_checked, splits, monkeypatch):
    """Where ``tiled`` checks the block table and lengths itself (:func:`fmha.forward.self_checked`; on a GPU its
    asserts, run on the H200 by :func:`test_bad_block_table_stops_the_gpu_stream`) a paged decode is one launch with
    the answer of the two (the separate check's, then the kernel's); forced either way here, where the interpreter
    runs the checking kernel's code with its asserts skipped."""
    from fmha import replay
    from fmha.kernels import VARIANTS, guards
    launched = []
    real = replay.launch
    monkeypatch.setattr(replay, "launch", lambda kernel, *a, **kw: (launched.append(kernel), real(kernel, *a, **kw)))
    monkeypatch.setattr(fmha.forward, "self_checked", lambda p, q: self_checked and p.variant == "tiled")
    replay.clear(compiled=False)  # (on a GPU a call of a kind seen before would replay its launches)
    b, h, kvh, sk, page = 2, 8, 2, 200, 32
    q, k, v = make_qkv(b, h, kvh, 1, sk, 64, torch.bfloat16, seed=3)
    lens = torch.tensor([200, 75], dtype=torch.int32, device=DEVICE)
    k_pool, table = paginate(k, page, -(-sk // page) + 1, seed=4)
    v_pool, _ = paginate(v, page, -(-sk // page) + 1, seed=4)
    o, lse = fmha.attention_paged(q, k_pool, v_pool, table, lens, num_splits=splits, return_lse=True)
    assert launched == ([] if self_checked else [guards._check_pages]) + [VARIANTS["tiled"]], launched
    for i, n in enumerate(lens.tolist()):
        check_against_reference(o[i:i + 1], q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], False, "bottom_right",
                                lse=lse[i:i + 1])


@pytest.mark.parametrize("n", [49, -1])
def test_cache_seqlens_past_the_table_is_an_error(n):
    q, _, _ = make_qkv(1, 2, 2, 1, 32, 32, torch.float16)
    pool = torch.zeros(4, 16, 2, 32, dtype=torch.float16, device=DEVICE)
    table = torch.tensor([[0, 1, 2]], dtype=torch.int32, device=DEVICE)
    if DEVICE == "cpu":  # on a GPU: a device-side assert, as for the block table
        with pytest.raises(ValueError, match=rf"cache_seqlens\[0\] = {n}, the table holds 3 pages of 16 keys"):
            fmha.attention_paged(q, pool, pool, table, torch.tensor([n], dtype=torch.int32, device=DEVICE))
    empty = fmha.attention_paged(q, pool, pool, table[:, :0], torch.zeros(1, dtype=torch.int32, device=DEVICE))
    torch.testing.assert_close(empty, torch.zeros_like(q))


@pytest.mark.gpu
@pytest.mark.parametrize("variant,sq,lens,says", [("tiled", 1, 256, "block_table entry in use"),
                                                  ("hopper", 256, 256, "block_table entry in use"),
                                                  ("tiled", 1, 300, "cache_seqlens outside"),
                                                  ("tiled", 64, 256, "block_table entry in use"),
                                                  ("tiled", 64, 300, "cache_seqlens outside")])
def test_bad_block_table_stops_the_gpu_stream(variant, sq, lens, says):
    """On the GPU the check runs in stream order (no host sync): a device-side assert naming the
    argument ends the process's CUDA context before the attention kernel reads; never a segfault
    or an answer.  One query row: ``tiled`` in 16-row tiles checks them itself (:func:`fmha.forward.self_checked`);
    64 rows: the separate check before it."""
    import subprocess
    import sys
    if variant == "hopper" and torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    script = f"""
import torch, fmha
q = torch.randn(1, 4, {sq}, 128, device="cuda", dtype=torch.bfloat16)
pool = torch.randn(4, 128, 4, 128, device="cuda", dtype=torch.bfloat16)
table = torch.tensor([[0, 1_000_000]], dtype=torch.int32, device="cuda")
o = fmha.attention_paged(q, pool, pool, table, torch.tensor([{lens}], dtype=torch.int32, device="cuda"),
                         variant="{variant}")
torch.cuda.synchronize()
print("ANSWER", o.float().sum().item())
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode > 0 and "ANSWER" not in run.stdout, (run.returncode, run.stdout, run.stderr[-2000:])
    assert says in run.stderr and "device-side assert" in run.stderr, run.stderr[-2000:]


@pytest.mark.gpu
@pytest.mark.parametrize("page", [128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,dv,dtype,layout", [(128, 0, torch.bfloat16, "bhsd"), (64, 0, torch.float16, "bshd"),
                                                (192, 128, torch.bfloat16, "bshd"), (128, 64, torch.bfloat16, "bhsd")])
def test_hopper_paged_prefill(d, dv, dtype, layout, causal, page):
    """Prefill against a cached prefix on the Gluon kernel: shuffled pages, a spare page per
    sequence, lengths off the tile and one shorter than the queries (bottom-right: its first rows
    see no key); NaN in every unused row of the pool must not reach the output.  ``dv``: V's pool
    narrower than K's (DeepSeek's 192/128)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    b, h, kvh, sq, sk = 3, 8, 2, 300, 1000
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, dtype, seed=page + d)
    v = v[..., :dv].contiguous() if dv else v
    lens = torch.tensor([1000, 517, 200], dtype=torch.int32, device=DEVICE)
    pages_per_seq = -(-sk // page) + 1
    pools = []
    for t in (k, v):
        t = t.clone()
        for i, n in enumerate(lens.tolist()):
            t[i, :, n:] = float("nan")  # the cache's unused part
        pool, table = paginate(t, page, pages_per_seq, seed=3, fill=float("nan"))  # and the spare pages
        pools.append(pool)
    qq = q if layout == "bhsd" else q.transpose(1, 2).contiguous()
    out = {}
    for variant in ("hopper", "auto", "tiled"):
        o, lse = fmha.attention_paged(qq, *pools, table, lens, causal=causal, layout=layout, return_lse=True,
                                      variant=variant)
        out[variant] = (o if layout == "bhsd" else o.transpose(1, 2), lse)
    torch.testing.assert_close(out["auto"][0], out["hopper"][0], atol=0, rtol=0)  # auto takes the Gluon kernel
    o, lse = out["hopper"]
    assert torch.isfinite(o).all()
    for i, n in enumerate(lens.tolist()):
        check_against_reference(o[i:i + 1], q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n], causal, "bottom_right",
                                lse=lse[i:i + 1])
    torch.testing.assert_close(lse, out["tiled"][1], atol=1e-3, rtol=1e-4)


@pytest.mark.gpu
def test_hopper_paged_refuses_pages_off_its_tile():
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(1, 4, 4, 256, 256, 128, torch.bfloat16)
    pool, table = paginate(k, 64, 4, seed=0)
    lens = torch.tensor([256], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="page_size 64 .takes multiples of its 128-key tile"):
        fmha.attention_paged(q, pool, pool, table, lens, variant="hopper")
    o = fmha.attention_paged(q, pool, pool, table, lens)  # auto: tiled
    torch.testing.assert_close(o, fmha.attention_paged(q, pool, pool, table, lens, variant="tiled"), atol=0, rtol=0)


def test_paged_compiles_whole():
    """Under ``torch.compile(fullgraph=True)`` ``attention_paged`` traces as its custom op (no graph break):
    split decoding with a window and sinks, the output and LSE the eager call's, bit for bit."""
    import torch._dynamo
    q, k, v = make_qkv(2, 4, 2, 1, 70, 32, torch.bfloat16, seed=3)
    k_pool, table = paginate(k, 16, 6, seed=2)
    v_pool, _ = paginate(v, 16, 6, seed=2)
    lens = torch.tensor([70, 33], dtype=torch.int32, device=DEVICE)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], device=DEVICE)

    def call(q):
        return fmha.attention_paged(q, k_pool, v_pool, table, lens, window=(40, -1), sinks=sinks, num_splits=2,
                                    return_lse=True)
    with torch.no_grad():
        want = call(q)
        got = torch.compile(call, fullgraph=True, backend="eager")(q)
    torch._dynamo.reset()
    for a, b in zip(got, want):
        assert torch.equal(a, b)


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU a failed check asserts (the stream-stopping test)")
@pytest.mark.parametrize("page", [16, 256])
def test_a_program_checks_the_pages_of_its_keys(page):
    """``tiled``'s own page check (:func:`fmha.kernels.guards.pages_checked`) counts exactly the table entries
    outside the pool among the pages of keys ``[lo, hi)``, over rows longer than its 64-entry chunks; none past
    them.  The interpreter skips the asserts, so each program's count is stored."""
    rng = np.random.default_rng(page)
    num_pages, width, rows = 50, 150, 3
    for _ in range(20):
        table = rng.integers(0, num_pages, (rows, width)).astype(np.int32)
        bad = rng.random((rows, width)) < 0.05
        table[bad] = rng.choice([-1, num_pages, 1_000_000], int(bad.sum()))
        lo, hi = sorted(int(x) for x in rng.integers(0, width * page, 2))
        out = torch.full((rows,), -1, dtype=torch.int32)
        _counts[(rows,)](torch.tensor(table), out, lo, hi, width, num_pages, PAGE=page)
        first, end = lo // page, -(-hi // page)
        want = ((table[:, first:end] < 0) | (table[:, first:end] >= num_pages)).sum(axis=1)
        assert out.tolist() == want.tolist(), (lo, hi, out, want)


@triton.jit
def _counts(BlockTable, Out, lo, hi, stride_bt, num_pages, PAGE: tl.constexpr):
    """Each program's count of :func:`fmha.kernels.guards.pages_checked` over its table row."""
    b = tl.program_id(0)
    tl.store(Out + b, guards.pages_checked(BlockTable, b, lo, hi, stride_bt, num_pages, PAGE))
