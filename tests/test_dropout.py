"""Attention dropout (``dropout_p``, :mod:`fmha.kernels.dropout`): the output and the gradients against the float64
reference of the pairs the call drew (:func:`fmha.kernels.dropout.factors` shows them), outputs poisoned first; the
pairs' rate, their independence between calls and their repetition under ``torch.manual_seed``; what it is not taken
with, refused by name."""
import pytest
import torch

import fmha
from fmha import compat
from fmha.kernels import dropout
from conftest import DEVICE, check_against_reference, make_qkv, nan_like, packed
from fmha.verify import check_grads

F16, BF16 = torch.float16, torch.bfloat16


def _drawn(seed: int, p: float, q, k, layout="bhsd"):
    """The factors a call made after ``torch.manual_seed(seed)`` drew: its seed is the generator's first draw."""
    b, h, sq = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhsd" else (q.shape[0], q.shape[2], q.shape[1])
    sk = k.shape[2] if layout == "bhsd" else k.shape[1]
    torch.manual_seed(seed)
    return dropout.factors(dropout.draw_seed(q.device), p, b, h, sq, sk)


CASES = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, causal, align, layout, dtype, mods)
    (2, 4, 2, 40, 56, 64, True, "bottom_right", "bhsd", F16, {}),
    (1, 2, 2, 33, 33, 32, False, "top_left", "bshd", BF16, {}),
    (1, 3, 1, 17, 70, 48, True, "top_left", "bhsd", F16, {"window": (20, -1), "softcap": 20.0}),
    (2, 2, 1, 24, 24, 80, False, "top_left", "bhsd", BF16, {}),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}h{}kv{}-q{}k{}-d{}-causal{}-{}-{}-{}".format(*c[:8], c[8],
                                                                                                     c[9]).replace(
    "torch.", ""))
@pytest.mark.parametrize("deterministic", [False, True])
def test_dropout_matches_the_reference_of_the_pairs_it_drew(case, deterministic):
    b, h, kvh, sq, sk, d, causal, align, layout, dt, mods = case
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, dt, layout, seed=sq)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(3)).to(dt).to(DEVICE)
    torch.manual_seed(11)
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, dropout_p=0.3,
                            return_lse=True, deterministic=deterministic, **mods)
    grads = torch.autograd.grad(o, (q, k, v), do)
    z = _drawn(11, 0.3, q, k, layout)
    assert 0.6 < float((z > 0).float().mean()) < 0.8  # (0.7 kept)
    check_against_reference(o, q.detach(), k.detach(), v.detach(), causal, align, layout, dropout=z, **mods)
    check_grads(grads, q, k, v, do, causal, align, layout, o=o, lse=lse, dropout=z, **mods)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_sequences_drop_each_sequences_own_pairs(causal):
    """Packed sequences: each sequence's output and gradients against the float64 reference of it alone with the
    pairs at its rows' places and its keys' numbers (``factors`` over every packed row, ``[1, heads, total_q,
    total_k]``); FlashAttention's varlen entry point draws the same."""
    lens_q, lens_k = [5, 17, 1, 12], [9, 17, 6, 12]
    q, cu_q = packed(lens_q, 4, 32, F16, 1)
    k, cu_k = packed(lens_k, 2, 32, F16, 2)
    v, _ = packed(lens_k, 2, 32, F16, 3)
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    do = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(F16).to(DEVICE)
    torch.manual_seed(21)
    o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal, dropout_p=0.3,
                                   return_lse=True)
    grads = torch.autograd.grad(o, (q, k, v), do)
    z = _drawn(21, 0.3, q[None].transpose(1, 2), k[None].transpose(1, 2))  # [1, heads, total_q, total_k]
    for b in range(len(lens_q)):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        mine = z[:, :, qs, :ks.stop - ks.start]
        seq = [t[s].transpose(0, 1)[None] for t, s in ((o, qs), (q, qs), (k, ks), (v, ks))]
        check_against_reference(*(t.detach() for t in seq), causal, "bottom_right", lse=lse[None, :, qs],
                                dropout=mine)
        check_grads([g[s][None] for g, s in zip(grads, (qs, ks, ks))], q[qs][None], k[ks][None], v[ks][None],
                    do[qs][None], causal, "bottom_right", "bshd", o=o[qs][None], lse=lse[None, :, qs], dropout=mine)
    torch.manual_seed(21)
    again = compat.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), dropout_p=0.3, causal=causal)
    assert torch.equal(again, o)


def test_dropout_writes_every_row_and_returns_the_softmax_lse():
    """An ``out`` poisoned with NaN is written whole; the LSE is the softmax's, which dropout leaves alone."""
    q, k, v = make_qkv(1, 2, 2, 37, 45, 64, F16, seed=2)
    out = nan_like(q)
    torch.manual_seed(4)
    _, lse = fmha.attention(q, k, v, causal=True, dropout_p=0.5, out=out, return_lse=True)
    _, want = fmha.attention(q, k, v, causal=True, return_lse=True)
    check_against_reference(out, q, k, v, True, dropout=_drawn(4, 0.5, q, k))
    torch.testing.assert_close(lse, want, atol=1e-5, rtol=0)


def test_each_call_draws_its_own_pairs_and_a_seed_repeats_them():
    q, k, v = make_qkv(1, 2, 2, 64, 64, 32, F16, seed=5)
    torch.manual_seed(8)
    first, second = (fmha.attention(q, k, v, dropout_p=0.2) for _ in range(2))
    assert not torch.equal(first, second)
    torch.manual_seed(8)
    assert torch.equal(fmha.attention(q, k, v, dropout_p=0.2), first)
    torch.manual_seed(8)
    seeds = [dropout.draw_seed(q.device) for _ in range(2)]  # the two calls' seeds, in turn
    pairs = [dropout.factors(s, 0.2, 1, 2, 64, 64) for s in seeds]
    assert not torch.equal(*pairs)
    for o, z in zip((first, second), pairs):
        check_against_reference(o, q, k, v, False, dropout=z)


def test_the_pairs_are_kept_at_one_minus_p_and_scaled_by_its_inverse():
    """p in steps of 2^-16 (the draws' width), each kept pair scaled by one over the share kept: E[Z] = 1."""
    seed = torch.tensor([12345], dtype=torch.int64, device=DEVICE)
    for p in (0.1, 0.5, 0.9, 3e-5):
        z = dropout.factors(seed, p, 1, 4, 64, 256)
        kept = z > 0
        n = z.numel()
        stepped = round(p * 65536) / 65536
        assert abs(float(kept.float().mean()) - (1 - p)) < 4 * ((p * (1 - p) / n) ** 0.5) + 1 / n
        assert torch.equal(z[kept], torch.full_like(z[kept], 1 / (1 - stepped)))
        if p in (0.1, 0.5):  # no row (256 pairs) or column (64) stuck on one side, where chance would not do it
            rows = kept.float().mean(-1).flatten()
            cols = kept.float().mean(-2).flatten()
            assert 0 < rows.min() and rows.max() < 1 and 0 < cols.min() and (p == 0.1 or cols.max() < 1)


@pytest.mark.parametrize("seqlen_k", [64, 72, 200])
def test_every_tile_width_draws_the_same_pairs(seqlen_k):
    """A pair's draw depends on its place alone, not on the tile that draws it: the forward's and the backward's
    kernels cut the keys in tiles of 16 to 128 (each thread's keys of a 32-key block drawn by its own Philox calls,
    :func:`fmha.kernels.dropout.kept`), and a sequence's last tile may run past its keys."""
    seed = torch.tensor([777], dtype=torch.int64, device=DEVICE)
    rows = 2 * 3 * 24
    drawn = []
    for block_n in (8, 16, 32, 64, 128):
        out = torch.full((rows + 16, seqlen_k), float("nan"), device=DEVICE)
        dropout._factors_kernel[(-(-rows // 16), -(-seqlen_k // block_n))](seed, out, seqlen_k, 0.3, BLOCK_M=16,
                                                                          BLOCK_N=block_n)
        drawn.append(out[:rows])
    assert not drawn[0].isnan().any() and 0 < float((drawn[0] == 0).float().mean()) < 0.5
    for z in drawn[1:]:
        assert torch.equal(z, drawn[0])


def _philox4x32(counter: int, seed: int, rounds: int) -> list[int]:
    """Philox4x32 (Salmon et al., SC'11) of a 64-bit counter (its two low words) under a 64-bit key, as
    :func:`triton.language.randint4x` takes them."""
    m = 0xFFFFFFFF
    c = [counter & m, counter >> 32, 0, 0]
    k = [seed & m, seed >> 32]
    for _ in range(rounds):
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k[0], p1 & m, (p0 >> 32) ^ c[3] ^ k[1], p0 & m]
        k = [(k[0] + 0x9E3779B9) & m, (k[1] + 0xBB67AE85) & m]
    return c


def test_the_pairs_are_philox_draws_at_their_places():
    """Each pair's 16-bit draw is Philox4x32 in :data:`fmha.kernels.dropout.ROUNDS` rounds at its place, computed here
    on the host: the keys of a 32-key block in four runs ``8 j + 2 c + e``, run c one call, word j keys ``8 j + 2 c``
    (low half) and ``+ 1`` (high half); kept where the draw is at least ``p`` in 2^-16 steps."""
    seed, p, rows, seqlen_k = 0x1234_5678_9ABC, 0.3, 24, 72
    z = dropout.factors(torch.tensor([seed], dtype=torch.int64, device=DEVICE), p, 1, 2, rows // 2, seqlen_k)
    blocks = -(-seqlen_k // 32)
    want = torch.zeros(rows, blocks * 32, dtype=torch.bool)
    for r in range(rows):
        for blk in range(blocks):
            for c in range(4):
                words = _philox4x32((r * blocks + blk) * 4 + c, seed, dropout.ROUNDS.value)
                for j in range(4):
                    for e in range(2):
                        want[r, 32 * blk + 8 * j + 2 * c + e] = (words[j] >> (16 * e)) & 0xFFFF >= round(p * 65536)
    assert torch.equal(z.reshape(rows, seqlen_k).cpu() > 0, want[:, :seqlen_k])


def test_no_dropout_is_the_call_without_it():
    q, k, v = make_qkv(1, 2, 2, 30, 30, 64, F16, seed=6)
    assert torch.equal(fmha.attention(q, k, v, causal=True, dropout_p=0.0), fmha.attention(q, k, v, causal=True))


def test_what_dropout_is_not_taken_with_is_refused_by_name():
    q, k, v = make_qkv(1, 2, 2, 8, 8, 32, F16)
    for p in (-0.1, 1.0, 1.5, "0.1", True):
        with pytest.raises(ValueError, match="dropout_p must be a float in"):
            fmha.attention(q, k, v, dropout_p=p)
    with pytest.raises(NotImplementedError, match="sinks"):
        fmha.attention(q, k, v, dropout_p=0.1, sinks=torch.zeros(2, device=DEVICE))
    with pytest.raises(NotImplementedError, match="float8"):
        fmha.attention(q, k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="with a block_table"):
        compat.flash_attn_varlen_func(q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1),
                                      torch.tensor([0, 8], dtype=torch.int32, device=DEVICE),
                                      torch.tensor([0, 8], dtype=torch.int32, device=DEVICE), 8, 8, dropout_p=0.1,
                                      block_table=torch.zeros(1, 1, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="cannot take this call: attention dropout runs on the tiled variant"):
        fmha.attention(q, k, v, dropout_p=0.1, variant="singlewave")


def test_flash_attention_and_sdpa_entry_points_take_dropout():
    q, k, v = make_qkv(1, 2, 2, 24, 24, 32, F16, layout="bshd", seed=9)
    torch.manual_seed(3)
    got = compat.flash_attn_func(q, k, v, dropout_p=0.25, causal=True)
    torch.manual_seed(3)
    assert torch.equal(got, fmha.attention(q, k, v, causal=True, causal_align="bottom_right", layout="bshd",
                                           dropout_p=0.25))
    qh, kh, vh = (t.transpose(1, 2) for t in (q, k, v))
    torch.manual_seed(3)
    got = compat.scaled_dot_product_attention(qh, kh, vh, dropout_p=0.25, is_causal=True)
    check_against_reference(got, qh, kh, vh, True, dropout=_drawn(3, 0.25, qh, kh))


@pytest.mark.gpu
def test_a_replayed_call_draws_anew():
    """The seed is an input of the call: a replay of its recipe passes the new one."""
    q, k, v = make_qkv(2, 8, 2, 256, 256, 128, BF16, seed=1)
    for s in (1, 2, 3):  # the first call records; the others replay
        torch.manual_seed(s)
        o = fmha.attention(q, k, v, causal=True, dropout_p=0.1)
        check_against_reference(o, q, k, v, True, dropout=_drawn(s, 0.1, q, k))
