"""Every alignment of a mask edge against the key tile, for every Triton variant.

The whole-tile skips (the window's first tile, the causal early exit, ``tiled``'s unmasked
range) are integer arithmetic on ``row + offset`` modulo the tile: an off-by-one there is wrong
at one residue only.  These cases move each edge through every residue modulo the largest key
tile of the interpreter's configs (32; the seed kernels' 16 divides it), output and LSE both
checked against the float64 reference.
"""
import pytest
import torch

import fmha
from conftest import check_against_reference, make_qkv, nan_like
from fmha import configs
from fmha.kernels import VARIANTS

TILE = max(configs.default_config(v, "interpreter", 32).block_n for v in VARIANTS)


def check(variant, sq, sk, causal, align="top_left", window=(-1, -1), seed=0):
    q, k, v = make_qkv(1, 2, 1, sq, sk, 32, torch.float16, seed=seed)
    out = nan_like(q)
    _, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, window=window, variant=variant, out=out,
                            return_lse=True)
    check_against_reference(out, q, k, v, causal, align, lse=lse, window=window)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("causal", [False, True])
def test_window_lower_edge_at_every_residue(variant, causal):
    for left in range(TILE + 1):
        check(variant, 40, 40, causal, window=(left, -1), seed=left)


@pytest.mark.parametrize("causal", [False, True])
def test_wide_window_lower_edge_at_every_residue(causal):
    """A band of several tiles: ``tiled`` masks only the tiles across its lower edge and runs those past it,
    up to the diagonal, unmasked; the edge moves through every residue there."""
    for left in range(2 * TILE, 3 * TILE + 1):
        check("tiled", 4 * TILE + 3, 4 * TILE + 3, causal, window=(left, -1), seed=left)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_window_upper_edge_at_every_residue(variant):
    for right in range(TILE + 1):
        check(variant, 40, 70, False, window=(-1, right), seed=right)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("align", ["bottom_right", "top_left"])
def test_causal_diagonal_at_every_residue(variant, align):
    """bottom-right: the diagonal sits ``seqlen_k - seqlen_q`` keys right of each query."""
    for extra in range(TILE + 1):
        check(variant, 20, 20 + extra, True, align, seed=extra)
