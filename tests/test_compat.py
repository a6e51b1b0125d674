"""FlashAttention's and torch SDPA's entry points (``fmha.compat``): their names and conventions (bshd,
bottom-right causal, ``window_size``, ``softmax_scale``, the kv-cache append; SDPA's bhsd, top-left ``is_causal``,
boolean ``attn_mask``, ``enable_gqa``) against the float64 reference."""
import pytest
import torch

from conftest import DEVICE, check_against_reference, check_varlen, packed
from fmha import compat
from fmha.bench import grids, providers

F16 = torch.float16


def bshd(batch, heads, seqlen, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, seqlen, heads, d, generator=g).to(F16).to(DEVICE)


@pytest.mark.parametrize("causal,window,softcap,alibi", [(True, (-1, -1), 0.0, None), (False, (7, 3), 0.0, None),
                                                         (True, (9, -1), 4.0, (4,)), (True, (-1, -1), 0.0, (2, 4))])
def test_flash_attn_func_is_bottom_right_bshd(causal, window, softcap, alibi):
    """FlashAttention's conventions: bshd, bottom-right causal, its window, softcap and ALiBi slopes (``[heads]`` or
    ``[batch, heads]``)."""
    q, k, v = bshd(2, 4, 17, 32, 0), bshd(2, 2, 40, 32, 1), bshd(2, 2, 40, 32, 2)
    slopes = torch.rand(alibi, generator=torch.Generator().manual_seed(3)).to(DEVICE) if alibi else None
    out, lse = compat.flash_attn_func(q, k, v, softmax_scale=0.2, causal=causal, window_size=window, softcap=softcap,
                                      alibi_slopes=slopes, return_softmax_lse=True)
    assert out.shape == q.shape and lse.shape == (2, 4, 17)
    check_against_reference(out, q, k, v, causal, "bottom_right", "bshd", scale=0.2, lse=lse, window=window,
                            softcap=softcap, alibi_slopes=slopes)
    o2, lse2, probs = compat.flash_attn_func(q, k, v, softmax_scale=0.2, causal=causal, window_size=window,
                                             softcap=softcap, alibi_slopes=slopes, return_attn_probs=True)
    assert probs is None and torch.equal(o2, out) and torch.equal(lse2, lse)


def test_flash_attn_varlen_func_is_bottom_right():
    lens_q, lens_k = [17, 3], [40, 9]
    q, cu_q = packed(lens_q, 2, 32, F16, 4)
    k, cu_k = packed(lens_k, 2, 32, F16, 5)
    v, _ = packed(lens_k, 2, 32, F16, 6)
    o, lse = compat.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 17, 40, causal=True, return_softmax_lse=True)
    check_varlen(o, lse, q, k, v, cu_q, cu_k, causal=True, causal_align="bottom_right")


@pytest.mark.parametrize("causal,window", [(True, (-1, -1)), (False, (-1, -1)), (True, (5, 0))])
def test_flash_attn_varlen_func_reads_paged_keys_through_a_block_table(causal, window):
    """``block_table``: packed queries against page pools, sequence b's keys the first ``cu_seqlens_k`` difference of
    its pages (shuffled); each sequence as fmha's own call over its keys laid out whole, bottom-right; the LSE
    ``[heads, total_q]``; cu_seqlens past max_seqlen_q refused."""
    import fmha
    heads, kv_heads, d, page = 4, 2, 32, 16
    cu_q = torch.tensor([0, 5, 6, 19], dtype=torch.int32, device=DEVICE)
    cu_k = torch.tensor([0, 30, 37, 60], dtype=torch.int32, device=DEVICE)
    pages = 3 * 2  # two pages a sequence
    g = torch.Generator().manual_seed(61)
    q = torch.randn(19, heads, d, generator=g).to(F16).to(DEVICE)
    k_pool, v_pool = (torch.randn(pages, page, kv_heads, d, generator=g).to(F16).to(DEVICE) for _ in range(2))
    table = torch.randperm(pages, generator=g).view(3, 2).to(torch.int32).to(DEVICE)
    o, lse = compat.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 13, 32, causal=causal, window_size=window,
                                           return_softmax_lse=True, block_table=table)
    for b in range(3):
        qs, qe, n = cu_q[b].item(), cu_q[b + 1].item(), (cu_k[b + 1] - cu_k[b]).item()
        keys = k_pool[table[b].long()].reshape(1, 2 * page, kv_heads, d)[:, :n]
        vals = v_pool[table[b].long()].reshape(1, 2 * page, kv_heads, d)[:, :n]
        want, want_lse = fmha.attention(q[None, qs:qe], keys, vals, causal=causal, causal_align="bottom_right",
                                        layout="bshd", window=window, return_lse=True)
        torch.testing.assert_close(o[qs:qe], want[0], atol=2e-3, rtol=0)
        torch.testing.assert_close(lse[:, qs:qe], want_lse[0], atol=2e-3, rtol=0)
    if DEVICE == "cpu":  # on a GPU a device-side assert (tests/test_varlen.py runs one apart)
        with pytest.raises(ValueError, match="max_seqlen"):
            compat.flash_attn_varlen_func(q, k_pool, v_pool, cu_q, cu_k, 12, 32, block_table=table)


def test_packed_forms_read_the_packed_tensor_in_place():
    """``flash_attn_qkvpacked_func`` and the other packed forms: the same results as the unpacked calls on the same
    values, and gradients that reach the packed tensor (each slice's own)."""
    g = torch.Generator().manual_seed(41)
    qkv = torch.randn(2, 19, 3, 4, 32, generator=g).to(F16).to(DEVICE).requires_grad_()
    kw = dict(causal=True, window_size=(6, 0), softmax_scale=0.3)
    o = compat.flash_attn_qkvpacked_func(qkv, **kw)
    q, k, v = (qkv.detach()[:, :, i].clone().requires_grad_() for i in range(3))
    want = compat.flash_attn_func(q, k, v, **kw)
    assert torch.equal(o, want)
    check_against_reference(o.detach(), q.detach(), k.detach(), v.detach(), True, "bottom_right", "bshd", window=(6, 0),
                            scale=0.3)
    do = torch.randn(o.shape, generator=g).to(F16).to(DEVICE)
    o.backward(do)
    want.backward(do)
    for i, t in enumerate((q, k, v)):
        torch.testing.assert_close(qkv.grad[:, :, i], t.grad, atol=0, rtol=0)
    kv = torch.randn(2, 23, 2, 2, 32, generator=g).to(F16).to(DEVICE)
    assert torch.equal(compat.flash_attn_kvpacked_func(q, kv, causal=True),
                       compat.flash_attn_func(q, kv[:, :, 0].contiguous(), kv[:, :, 1].contiguous(), causal=True))
    cu = torch.tensor([0, 7, 19, 30], dtype=torch.int32, device=DEVICE)
    packed_qkv = torch.randn(30, 3, 4, 32, generator=g).to(F16).to(DEVICE)
    o, lse = compat.flash_attn_varlen_qkvpacked_func(packed_qkv, cu, 12, causal=True, return_softmax_lse=True)
    want = compat.flash_attn_varlen_func(*(packed_qkv[:, i].contiguous() for i in range(3)), cu, cu, 12, 12,
                                         causal=True, return_softmax_lse=True)
    assert torch.equal(o, want[0]) and torch.equal(lse, want[1])
    packed_kv = torch.randn(30, 2, 2, 32, generator=g).to(F16).to(DEVICE)
    assert torch.equal(compat.flash_attn_varlen_kvpacked_func(packed_qkv[:, 0], packed_kv, cu, cu, 12, 12),
                       compat.flash_attn_varlen_func(packed_qkv[:, 0], packed_kv[:, 0].contiguous(),
                                                     packed_kv[:, 1].contiguous(), cu, cu, 12, 12))


def test_flash_attention_4s_names_open_windows_with_none_and_take_learnable_sinks():
    """``window_size`` with None for an open side (FlashAttention 4's) is -1's window; ``learnable_sink`` is fmha's
    ``sinks``: each entry point gives what fmha's own call gives with them."""
    import fmha
    g = torch.Generator().manual_seed(47)
    q, k, v = bshd(2, 4, 12, 32, 51), bshd(2, 2, 20, 32, 52), bshd(2, 2, 20, 32, 53)
    sink = torch.randn(4, generator=g).to(DEVICE)
    o = compat.flash_attn_func(q, k, v, causal=True, window_size=(None, 0), learnable_sink=sink)
    assert torch.equal(o, fmha.attention(q, k, v, causal=True, causal_align="bottom_right", layout="bshd",
                                         window=(-1, 0), sinks=sink))
    assert not torch.equal(o, compat.flash_attn_func(q, k, v, causal=True))
    cu = torch.tensor([0, 12, 24], dtype=torch.int32, device=DEVICE)
    ov = compat.flash_attn_varlen_func(q.reshape(24, 4, 32), q.reshape(24, 4, 32)[:, :2].contiguous(),
                                       q.reshape(24, 4, 32)[:, 2:].contiguous(), cu, cu, 12, 12, causal=True,
                                       window_size=(4, None), learnable_sink=sink)
    assert torch.equal(ov, fmha.attention_varlen(q.reshape(24, 4, 32), q.reshape(24, 4, 32)[:, :2].contiguous(),
                                                 q.reshape(24, 4, 32)[:, 2:].contiguous(), cu, cu, 12, 12, causal=True,
                                                 window=(4, -1), sinks=sink))
    lens = torch.tensor([7, 20], dtype=torch.int32, device=DEVICE)
    oc = compat.flash_attn_with_kvcache(q[:, :1], k, v, cache_seqlens=lens, learnable_sink=sink)
    assert torch.equal(oc, fmha.attention(q[:, :1], k, v, causal_align="bottom_right", layout="bshd", seqused_k=lens,
                                          sinks=sink))


def test_float8_takes_flash_attention_3s_descale_factors():
    """``q_descale``, ``k_descale``, ``v_descale`` (float32 ``[batch, kv_heads]``) reach fmha's float8 call: the same
    results as :func:`fmha.attention` given them, and against the float64 reference of the dequantized values;
    a float8 cache read through a block table is refused by name."""
    import fmha
    g = torch.Generator().manual_seed(43)
    f8 = torch.float8_e4m3fn
    q, k, v = (torch.randn(2, s, h, 64, generator=g).to(f8).to(DEVICE) for s, h in ((9, 4), (30, 2), (30, 2)))
    qs, ks, vs = (torch.rand(2, 2, generator=g).add(0.5).to(DEVICE) for _ in range(3))
    o = compat.flash_attn_func(q, k, v, causal=True, q_descale=qs, k_descale=ks, v_descale=vs)
    want = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", layout="bshd", q_descale=qs,
                          k_descale=ks, v_descale=vs)
    assert torch.equal(o, want)
    deq = [(t.float() * f[:, None, :, None].repeat_interleave(t.shape[2] // 2, 2)).to(torch.bfloat16)
           for t, f in ((q, qs), (k, ks), (v, vs))]
    torch.testing.assert_close(o.float(), compat.flash_attn_func(*deq, causal=True).float(), atol=0.1, rtol=0.05)
    q16 = torch.randn(2, 1, 4, 64, generator=g).to(torch.bfloat16).to(DEVICE)
    lens = torch.tensor([17, 30], dtype=torch.int32, device=DEVICE)
    o = compat.flash_attn_with_kvcache(q16, k, v, cache_seqlens=lens, k_descale=ks, v_descale=vs)
    assert torch.equal(o, fmha.attention(q16, k, v, causal_align="bottom_right", layout="bshd", seqused_k=lens,
                                         k_descale=ks, v_descale=vs))
    with pytest.raises(NotImplementedError, match="descale factors .* with a block_table"):
        compat.flash_attn_with_kvcache(q16, k, v, cache_seqlens=lens, k_descale=ks,
                                       block_table=torch.zeros(2, 1, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("paged", [False, True])
def test_flash_attn_with_kvcache_appends_then_attends(paged):
    batch, heads, kv_heads, d, cap, page = 2, 4, 2, 32, 64, 16
    lens = torch.tensor([20, 33], dtype=torch.int32, device=DEVICE)
    cache_k, cache_v = bshd(batch, kv_heads, cap, d, 7), bshd(batch, kv_heads, cap, d, 8)
    q, k_new, v_new = bshd(batch, heads, 3, d, 9), bshd(batch, kv_heads, 3, d, 10), bshd(batch, kv_heads, 3, d, 11)
    if paged:  # the cache cut into shuffled pages
        perm = torch.randperm(batch * cap // page, generator=torch.Generator().manual_seed(0))
        table = perm.view(batch, cap // page).to(torch.int32).to(DEVICE)
        pools = []
        for t in (cache_k, cache_v):
            pool = torch.empty(batch * cap // page, page, kv_heads, d, dtype=F16, device=DEVICE)
            pool[perm.to(DEVICE)] = t.reshape(batch * cap // page, page, kv_heads, d)
            pools.append(pool)
        kc, vc, extra = pools[0], pools[1], {"block_table": table}
    else:
        kc, vc, extra = cache_k.clone(), cache_v.clone(), {}
    out = compat.flash_attn_with_kvcache(q, kc, vc, k=k_new, v=v_new, cache_seqlens=lens, causal=True, **extra)
    for b, n in enumerate(lens.tolist()):  # the reference: the old keys in use, then the new ones
        keys = torch.cat([cache_k[b:b + 1, :n], k_new[b:b + 1]], 1)
        vals = torch.cat([cache_v[b:b + 1, :n], v_new[b:b + 1]], 1)
        check_against_reference(out[b:b + 1], q[b:b + 1], keys, vals, True, "bottom_right", "bshd")
        if not paged:  # appended in place, nothing else touched
            torch.testing.assert_close(kc[b, n:n + 3], k_new[b], atol=0, rtol=0)
            torch.testing.assert_close(kc[b, :n], cache_k[b, :n], atol=0, rtol=0)
    if paged:
        flat = kc[table.long().cpu()].reshape(batch, cap, kv_heads, d)
        for b, n in enumerate(lens.tolist()):
            torch.testing.assert_close(flat[b, n:n + 3], k_new[b], atol=0, rtol=0)


@pytest.mark.parametrize("window", [(-1, -1), (6, 0)])
def test_flash_attn_with_kvcache_takes_a_left_padded_cache(window):
    """``cache_leftpad``: sequence b's keys are slots ``cache_leftpad[b]`` to ``cache_seqlens[b]`` (then the
    appended ones); the same as attending over those slots alone, causal bottom-right, with a window."""
    batch, heads, kv_heads, d, cap = 3, 4, 2, 32, 48
    pad = torch.tensor([0, 5, 17], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([20, 33, 17], dtype=torch.int32, device=DEVICE)  # the last: every old slot is padding
    cache_k, cache_v = bshd(batch, kv_heads, cap, d, 12), bshd(batch, kv_heads, cap, d, 13)
    q, k_new, v_new = bshd(batch, heads, 2, d, 14), bshd(batch, kv_heads, 2, d, 15), bshd(batch, kv_heads, 2, d, 16)
    kc, vc = cache_k.clone(), cache_v.clone()
    out = compat.flash_attn_with_kvcache(q, kc, vc, k=k_new, v=v_new, cache_seqlens=lens, cache_leftpad=pad,
                                         causal=True, window_size=window)
    for b, (p, n) in enumerate(zip(pad.tolist(), lens.tolist())):
        keys = torch.cat([cache_k[b:b + 1, p:n], k_new[b:b + 1]], 1)
        vals = torch.cat([cache_v[b:b + 1, p:n], v_new[b:b + 1]], 1)
        check_against_reference(out[b:b + 1], q[b:b + 1], keys, vals, True, "bottom_right", "bshd", window=window)
    with pytest.raises(NotImplementedError, match="cache_leftpad with a block_table"):
        compat.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_leftpad=pad,
                                       block_table=torch.zeros(batch, 3, dtype=torch.int32, device=DEVICE))


def _rotary_reference(x, cos, sin, pos, interleaved):
    """Rotary embeddings as complex rotations (float64): the column pairs (2i, 2i+1) interleaved, else (i, i + r/2),
    token t of sequence b turned by the angle whose cosine and sine are row ``pos[b][t]`` of ``cos``/``sin``."""
    x = x.double().cpu()
    half = cos.shape[1]
    out = x.clone()
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            turn = torch.complex(cos[pos[b][t]].double().cpu(), sin[pos[b][t]].double().cpu())
            cols = (torch.arange(0, 2 * half, 2), torch.arange(1, 2 * half, 2)) if interleaved else (
                torch.arange(half), torch.arange(half, 2 * half))
            z = torch.complex(x[b, t, :, cols[0]], x[b, t, :, cols[1]]) * turn
            out[b, t, :, cols[0]], out[b, t, :, cols[1]] = z.real, z.imag
    return out


@pytest.mark.parametrize("causal,window,interleaved,rotary_dim", [
    (True, (-1, -1), True, 32), (False, (-1, -1), False, 16), (False, (5, 2), False, 32), (True, (-1, -1), False, 8)])
def test_flash_attn_with_kvcache_applies_rotary_embeddings_where_flash_attention_does(causal, window, interleaved,
                                                                                      rotary_dim):
    """``rotary_cos``/``rotary_sin``: the new keys turned at positions ``cache_seqlens + t`` (and written so into the
    cache), q at the same positions when causal or windowed, else every query at ``cache_seqlens``; the first
    rotary_dim columns only, pairs interleaved or in halves; against complex rotations and fmha's own call."""
    batch, heads, kv_heads, d, cap = 2, 4, 2, 32, 40
    lens = torch.tensor([11, 20], dtype=torch.int32, device=DEVICE)
    g = torch.Generator().manual_seed(rotary_dim + causal)
    angle = torch.rand(cap, rotary_dim // 2, generator=g) * 6.3
    cos, sin = (f(angle).to(F16).to(DEVICE) for f in (torch.cos, torch.sin))
    cache_k, cache_v = bshd(batch, kv_heads, cap, d, 21), bshd(batch, kv_heads, cap, d, 22)
    q, k_new, v_new = bshd(batch, heads, 3, d, 23), bshd(batch, kv_heads, 3, d, 24), bshd(batch, kv_heads, 3, d, 25)
    kc, vc = cache_k.clone(), cache_v.clone()
    out = compat.flash_attn_with_kvcache(q, kc, vc, k=k_new, v=v_new, rotary_cos=cos, rotary_sin=sin,
                                         cache_seqlens=lens, causal=causal, window_size=window,
                                         rotary_interleaved=interleaved)
    n = lens.tolist()
    k_pos = [[m + t for t in range(3)] for m in n]
    q_pos = k_pos if causal or window != (-1, -1) else [[m] * 3 for m in n]
    k_ro = _rotary_reference(k_new, cos, sin, k_pos, interleaved)
    q_ro = _rotary_reference(q, cos, sin, q_pos, interleaved)
    for b, m in enumerate(n):
        torch.testing.assert_close(kc[b, m:m + 3].double().cpu(), k_ro[b], atol=2e-3, rtol=2e-3)  # written turned
        torch.testing.assert_close(kc[b, :m], cache_k[b, :m], atol=0, rtol=0)
        keys = torch.cat([cache_k[b:b + 1, :m], k_ro[b:b + 1].to(F16).to(DEVICE)], 1)
        vals = torch.cat([cache_v[b:b + 1, :m], v_new[b:b + 1]], 1)
        check_against_reference(out[b:b + 1], q_ro[b:b + 1].to(F16).to(DEVICE), keys, vals, causal, "bottom_right",
                                "bshd", window=window)


@pytest.mark.parametrize("cap,leftpad", [(48, False), (45, False), (48, True)])
@pytest.mark.parametrize("append", [False, True])
def test_flash_attn_with_kvcache_reads_the_rows_cache_batch_idx_names(cap, leftpad, append):
    """``cache_batch_idx``: sequence b's keys are row ``cache_batch_idx[b]`` of a larger cache, appended to there;
    read in place (one page a row) where the row length is a multiple of 16 and no left padding is given, gathered
    otherwise; the other rows untouched."""
    batch, rows_in_cache, heads, kv_heads, d = 2, 5, 4, 2, 32
    idx = torch.tensor([3, 1], dtype=torch.int32, device=DEVICE)
    lens = torch.tensor([20, 9], dtype=torch.int32, device=DEVICE)
    pad = torch.tensor([4, 0], dtype=torch.int32, device=DEVICE) if leftpad else None
    cache_k, cache_v = bshd(rows_in_cache, kv_heads, cap, d, 31), bshd(rows_in_cache, kv_heads, cap, d, 32)
    q, k_new, v_new = bshd(batch, heads, 2, d, 33), bshd(batch, kv_heads, 2, d, 34), bshd(batch, kv_heads, 2, d, 35)
    kc, vc = cache_k.clone(), cache_v.clone()
    new = dict(k=k_new, v=v_new) if append else {}
    out = compat.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, cache_batch_idx=idx, cache_leftpad=pad,
                                         causal=True, **new)
    for b, (r, m) in enumerate(zip(idx.tolist(), lens.tolist())):
        start = pad[b].item() if leftpad else 0
        keys, vals = cache_k[r:r + 1, start:m], cache_v[r:r + 1, start:m]
        if append:
            keys, vals = torch.cat([keys, k_new[b:b + 1]], 1), torch.cat([vals, v_new[b:b + 1]], 1)
            torch.testing.assert_close(kc[r, m:m + 2], k_new[b], atol=0, rtol=0)
        check_against_reference(out[b:b + 1], q[b:b + 1], keys, vals, True, "bottom_right", "bshd")
    for r in (0, 2, 4):  # rows no sequence names
        torch.testing.assert_close(kc[r], cache_k[r], atol=0, rtol=0)


@pytest.mark.parametrize("sq,sk,causal,masked", [(9, 30, True, False), (30, 9, True, True), (1, 70, False, True),
                                                (17, 17, False, False)])
def test_sdpa_is_top_left_bhsd_with_its_mask(sq, sk, causal, masked):
    g = torch.Generator().manual_seed(sq + sk)
    q, k, v = (torch.randn(2, h, s, 64, generator=g).to(F16).to(DEVICE) for h, s in ((4, sq), (2, sk), (2, sk)))
    mask = (torch.rand(2, 1, sq, sk, generator=g) < 0.7).to(DEVICE) if masked else None
    o = compat.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True)
    mods = {} if mask is None else {"attn_mask": mask.expand(2, 4, sq, sk)}
    check_against_reference(o, q, k, v, causal, "top_left", **mods)
    if not masked and DEVICE == "cpu":  # torch's own, where it defines every row
        want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal,
                                                                enable_gqa=True)
        torch.testing.assert_close(o.float(), want, atol=2e-3, rtol=0)


@pytest.mark.parametrize("shape,dtype", [((8, 8), torch.float32), ((1, 4, 8, 8), F16), ((2, 1, 1, 8), torch.float32)])
def test_sdpa_takes_an_additive_float_mask(shape, dtype):
    """SDPA's float attn_mask, added to the scores, broadcast as torch broadcasts it: torch's own result, and the
    float64 reference; its gradient, the bias's included, as torch's."""
    g = torch.Generator().manual_seed(len(shape))
    q, k, v = (torch.randn(2, h, 8, 64, generator=g).to(F16).to(DEVICE) for h in (4, 2, 2))
    bias = (torch.randn(shape, generator=g) * 3).masked_fill(torch.rand(shape, generator=g) < 0.2, float("-inf"))
    bias[..., 0] = 0.0  # every row sees a key (torch's math gives NaN for a row that sees none)
    bias = bias.to(dtype).to(DEVICE)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, bias)]
    o = compat.scaled_dot_product_attention(*leaves[:3], attn_mask=leaves[3], enable_gqa=True)
    check_against_reference(o, q, k, v, False, attn_mask=bias.expand(2, 4, 8, 8))
    ref = [t.detach().float().clone().requires_grad_(True) for t in (q, k, v, bias)]
    want = torch.nn.functional.scaled_dot_product_attention(*ref[:3], attn_mask=ref[3], enable_gqa=True)
    torch.testing.assert_close(o.float(), want, atol=3e-3, rtol=0)
    do = torch.randn(o.shape, generator=g).to(DEVICE)
    o.backward(do.to(o.dtype))
    want.backward(do)
    for got, w in zip(leaves, ref):
        assert got.grad.shape == w.shape and got.grad.dtype == got.dtype
        torch.testing.assert_close(got.grad.float(), w.grad, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("lead,mask_shape", [((), (8, 10)), ((2, 3), (3, 1, 8, 10)), ((2, 3), None), ((1,), (8, 10))])
def test_sdpa_takes_any_leading_dimensions(lead, mask_shape):
    """SDPA's ``[..., heads, seq, head_dim]``: no batch, or several leading dimensions, read as one batch; the mask
    broadcast over them as torch broadcasts it; torch's own result, and the float64 reference per leading index."""
    g = torch.Generator().manual_seed(len(lead))
    q, k, v = (torch.randn(*lead, h, s, 64, generator=g).to(F16).to(DEVICE) for h, s in ((4, 8), (2, 10), (2, 10)))
    mask = None if mask_shape is None else (torch.rand(mask_shape, generator=g) < 0.7).to(DEVICE)
    if mask is not None:
        mask[..., 0] = True  # every row sees a key (torch's math gives NaN for a row that sees none)
    o = compat.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert o.shape == q.shape
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask,
                                                            enable_gqa=True)
    torch.testing.assert_close(o.float(), want, atol=3e-3, rtol=0)
    flat = [t.reshape(-1, *t.shape[-3:]) for t in (o, q, k, v)]
    full = None if mask is None else mask.expand(*lead, 4, 8, 10).reshape(-1, 4, 8, 10)
    check_against_reference(*flat, False, **({} if full is None else {"attn_mask": full}))
    with pytest.raises(ValueError, match="does not broadcast"):
        compat.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 10, dtype=torch.bool, device=DEVICE),
                                            enable_gqa=True)


def test_sdpa_refuses_what_it_would():
    q, k, v = (torch.randn(1, h, 8, 64).to(F16).to(DEVICE) for h in (4, 2, 2))
    with pytest.raises(ValueError, match="enable_gqa=True"):
        compat.scaled_dot_product_attention(q, k, v)


def test_what_fmha_does_not_take_is_refused_by_name():
    q = bshd(1, 2, 4, 32, 0)
    with pytest.raises(ValueError, match="pass k and v with rotary_cos"):
        compat.flash_attn_with_kvcache(q, q, q, rotary_cos=torch.ones(4, 8), rotary_sin=torch.ones(4, 8))
    with pytest.raises(ValueError, match="both rotary_cos and rotary_sin"):
        compat.flash_attn_with_kvcache(q, q.clone(), q.clone(), k=q, v=q, cache_seqlens=0, rotary_cos=torch.ones(4, 8))
    with pytest.raises(ValueError, match="rotary_dim at most head_dim 32"):
        compat.flash_attn_with_kvcache(q, q.clone(), q.clone(), k=q, v=q, cache_seqlens=0,
                                       rotary_cos=torch.ones(4, 17), rotary_sin=torch.ones(4, 17))
    with pytest.raises(NotImplementedError, match="cache_batch_idx with a block_table"):
        compat.flash_attn_with_kvcache(q, q, q, cache_batch_idx=torch.zeros(1, dtype=torch.int32, device=DEVICE),
                                       block_table=torch.zeros(1, 1, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="give both k and v"):
        compat.flash_attn_with_kvcache(q, q.clone(), q.clone(), k=q, cache_seqlens=1)


def test_flash_attn_provider_passes_window_size_only(monkeypatch):
    """The bench's FlashAttention provider renames ``window`` to FlashAttention's ``window_size``."""
    import sys
    import types
    seen = {}
    fake = types.ModuleType("fake_flash")
    fake.flash_attn_func = lambda q, k, v, **kw: seen.update(kw) or q
    monkeypatch.setitem(sys.modules, "fake_flash", fake)
    cell = grids.Cell(1, 2, 2, 16, 16, 32, True, window=6)
    q = torch.zeros(1, 2, 16, 32)
    providers._flash_attn("fake_flash").make(q, q, q, cell)()
    assert seen == {"causal": True, "window_size": (6, -1)}


def test_a_flash_attn_namespace_without_the_function_is_no_provider(monkeypatch):
    """FlashAttention-4 alone installs ``flash_attn`` as the bare namespace of ``flash_attn.cute``: the bench finds
    no ``flash_attn_func`` (or ``flash_attn_varlen_func``) there instead of failing on it."""
    import sys
    import types
    monkeypatch.setitem(sys.modules, "fake_namespace", types.ModuleType("fake_namespace"))
    assert providers.entry("fake_namespace", "flash_attn_varlen_func") is None
    assert providers.entry("no_such_module_here", "flash_attn_func") is None
    fake = types.ModuleType("fake_flash")
    fake.flash_attn_varlen_func = len
    monkeypatch.setitem(sys.modules, "fake_flash", fake)
    assert providers.entry("fake_flash", "flash_attn_varlen_func") is len
