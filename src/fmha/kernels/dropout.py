"""Attention dropout, as SDPA's ``dropout_p`` and FlashAttention's: each probability ``P_ij`` is kept with
probability ``1 - p`` and scaled by ``1 / (1 - p)``, or dropped, after the softmax (whose denominator counts every
key), so ``O = (P * Z) V`` with ``Z`` the kept pairs' factors.  The pairs are drawn from Philox
(:func:`triton.language.rand`) keyed by a seed the call draws from torch's generator on the device, at each pair's
place among every (batch, head)'s scores, so the forward and the backward (:mod:`.backward`: ``dV = (P * Z)^T dO``,
``dP = Z * (dO V^T)``) draw the same pairs without storing them, and :func:`factors` can show them."""
import torch
import triton
import triton.language as tl


@triton.jit
def weights(seed, rows, cols, seqlen_k, dropout_p):
    """Each (query row, key) pair's factor in a tile: ``1 / (1 - dropout_p)`` kept, 0 dropped.  ``rows``: the rows'
    places among every (batch, head)'s rows (the LSE's: ``(b * heads + h) * seqlen_q + i``; packed sequences',
    ``h * total_q + row``), ``cols`` the keys (their numbers in the sequence), ``seqlen_k`` the tensor's keys: the
    pair's place ``rows * seqlen_k + cols`` is its Philox counter (64 bits; a counter of two 32-bit words, key and
    row, spilled more registers in most sm_90 and gfx1151 builds)."""
    place = rows.to(tl.int64)[:, None] * seqlen_k + cols[None, :]
    keep = tl.rand(seed, place) >= dropout_p
    return tl.where(keep, 1.0 / (1.0 - dropout_p), 0.0)


@triton.jit
def _factors_kernel(Seed, Out, seqlen_k, dropout_p, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    z = weights(tl.load(Seed), rows, cols, seqlen_k, dropout_p)
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
