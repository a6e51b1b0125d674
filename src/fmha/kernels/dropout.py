"""Attention dropout, as SDPA's ``dropout_p`` and FlashAttention's: each probability ``P_ij`` is kept with
probability ``1 - p`` and scaled by about ``1 / (1 - p)``, or dropped, after the softmax (whose denominator counts every
key), so ``O = (P * Z) V`` with ``Z`` the kept pairs' factors.  The pairs are drawn from Philox4x32 in
:data:`ROUNDS` rounds (:func:`triton.language.randint4x`) keyed by a seed the call draws from torch's generator on the
device, at each pair's place among every (batch, head)'s scores (sixteen bits a pair, eight pairs a Philox call: ``p``
in steps of ``2^-16``, the kept pairs scaled by one over the share kept), so the forward and the backward
(:mod:`.backward`: ``dV = (P * Z)^T dO``, ``dP = Z * (dO V^T)``) draw the same pairs without storing them, and
:func:`factors` can show them."""
import torch
import triton
import triton.language as tl


# the values a pair's 16-bit draw takes: a Philox call's four 32-bit words draw for eight pairs (8-bit draws, sixteen
# pairs a call, ran 4-13% faster, but a p under 1/512 would drop nothing: docs/PERF.md)
DRAWS = tl.constexpr(1 << 16)
# Philox4x32's rounds: 7, the fewest its authors found to pass TestU01's BigCrush (Salmon et al., SC'11), as
# FlashAttention-2 (SDPA's flash backend) and Composable Kernel draw their dropout; Triton's default of 10 adds a
# margin that cost the forward 11-15% and the backward 3-6% (docs/PERF.md)
ROUNDS = tl.constexpr(7)


@triton.jit
def threshold(dropout_p):
    """(the draws below which a pair is dropped, the kept pairs' factor): ``dropout_p`` in steps of ``2^-16``, the
    factor one over the share kept, so that ``E[Z] = 1`` exactly."""
    cut = tl.minimum((tl.zeros([], tl.float32) + dropout_p * DRAWS + 0.5).to(tl.int32), DRAWS - 1)
    return cut.to(tl.uint32), 1.0 / (1.0 - cut.to(tl.float32) / DRAWS)


@triton.jit
def kept(seed, rows, start_n, seqlen_k, dropout_p, BLOCK_N: tl.constexpr):
    """(which pairs of a tile are kept, their factor: :func:`threshold`).  ``rows``: the rows' places among every
    (batch, head)'s rows (the LSE's: ``(b * heads + h) * seqlen_q + i``; packed sequences', ``h * total_q + row``);
    the tile's keys ``start_n + [0, BLOCK_N)`` (their numbers in the sequence; ``start_n`` a multiple of
    ``BLOCK_N``, which is 8 or more), ``seqlen_k`` the tensor's keys.

    A row's keys go in blocks of 32, each block in four runs of eight: run ``c`` holds keys ``8 j + 2 c + e``
    (``j``, ``c`` < 4, ``e`` < 2), the keys one thread holds of a row in NVIDIA's mma and wgmma accumulators, so
    a thread draws its own pairs from its own Philox calls and no draw crosses threads (a layout conversion).
    Each run is one call (64-bit counter ``(row * blocks_a_row + block) * 4 + c``); its word ``j`` gives keys
    ``8 j + 2 c`` and ``8 j + 2 c + 1`` their draws, its low and high 16 bits."""
    BLOCKS: tl.constexpr = BLOCK_N // 32 if BLOCK_N >= 32 else 1  # the blocks of 32 keys the tile meets
    GROUPS: tl.constexpr = 4 if BLOCK_N >= 32 else BLOCK_N // 8  # and their groups of 8 keys in it
    BM: tl.constexpr = rows.shape[0]
    block = (start_n // 32 + tl.arange(0, BLOCKS))[None, :, None, None, None]
    c = tl.arange(0, 4)[None, None, None, :, None]
    place = (rows.to(tl.int64)[:, None, None, None, None] * tl.cdiv(seqlen_k, 32) + block) * 4 + c
    r0, r1, r2, r3 = tl.randint4x(seed, place, ROUNDS)  # [BM, BLOCKS, 1, 4, 1]
    j = (start_n % 32 // 8 + tl.arange(0, GROUPS))[None, None, :, None, None]
    word = tl.where(j == 0, r0, tl.where(j == 1, r1, tl.where(j == 2, r2, r3))).to(tl.uint32, bitcast=True)
    e = tl.arange(0, 2)[None, None, None, None, :]
    draws = (word >> (e * 16).to(tl.uint32)) & 0xFFFF  # [BM, BLOCKS, GROUPS, 4, 2]: keys 32 block + 8 j + 2 c + e
    cut, scale = threshold(dropout_p)
    return tl.reshape(draws, [BM, BLOCK_N]) >= cut, scale


@triton.jit
def dropped(x, keep, scale):
    """``x * Z``: the kept pairs' ``x`` times their factor, the others 0 (``keep, scale``: :func:`kept`'s)."""
    return tl.where(keep, x * scale, 0.0)


@triton.jit
def _factors_kernel(Seed, Out, seqlen_k, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    start_n = tl.program_id(1) * BLOCK_N
    cols = start_n + tl.arange(0, BLOCK_N)
    keep, scale = kept(tl.load(Seed), rows, start_n, seqlen_k, dropout_p, BLOCK_N)
    z = dropped(tl.full([BLOCK_M, BLOCK_N], 1.0, tl.float32), keep, scale)
    tl.store(Out + rows.to(tl.int64)[:, None] * seqlen_k + cols[None, :], z, mask=(cols < seqlen_k)[None, :])


def factors(seed: torch.Tensor, dropout_p: float, batch: int, heads: int, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """The factors ``Z`` a call with ``seed`` drew, float32 ``[batch, heads, seqlen_q, seqlen_k]`` (what the
    float64 reference multiplies the probabilities by); of packed sequences, ``[1, heads, total_q, total_k]`` with
    sequence b's at its rows and its keys' numbers (``Z[0, :, cu_q[b]:cu_q[b + 1], :n_k]``)."""
    out = torch.empty(batch * heads * seqlen_q + 16, seqlen_k, dtype=torch.float32, device=seed.device)
    _factors_kernel[(triton.cdiv(batch * heads * seqlen_q, 16), triton.cdiv(seqlen_k, 16))](
        seed, out, seqlen_k, float(dropout_p), BLOCK_M=16, BLOCK_N=16)
    return out[:batch * heads * seqlen_q].view(batch, heads, seqlen_q, seqlen_k)


def launch_args(dropout) -> dict:
    """The arguments of a kernel launch that drops pairs (``dropout = (seed, dropout_p)``), or of one that does not
    (None: the kernels' defaults)."""
    return {} if dropout is None else dict(Seed=dropout[0], dropout_p=float(dropout[1]), DROPOUT=True)


def draw_seed(device: torch.device) -> torch.Tensor:
    """A call's seed, int64 ``[1]`` on ``device``, drawn from torch's generator there (``torch.manual_seed`` repeats
    it; on a GPU without a host-device synchronization)."""
    return torch.randint(0, 1 << 62, (1,), dtype=torch.int64, device=device)
