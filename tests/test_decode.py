"""Split-key decoding (flash-decoding): partials merged by their LSE equal the unsplit answer."""
import numpy as np
import pytest
import torch

import fmha
from conftest import DEVICE, check_against_reference, make_qkv, nan_like
from fmha import reference
from fmha.kernels import VARIANTS


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("sq,sk,splits,causal", [(1, 200, 3, False), (4, 257, 5, True), (16, 130, 2, True),
                                                 (7, 64, 8, False)])
def test_split_keys_match_reference(variant, sq, sk, splits, causal):
    q, k, v = make_qkv(2, 4, 1, sq, sk, 64, torch.bfloat16, seed=sk)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", variant=variant,
                            num_splits=splits, return_lse=True, out=out)
    check_against_reference(out, q, k, v, causal, "bottom_right")
    _, ref_lse = reference.dense_attention(q, k, v, causal=causal, causal_align="bottom_right", return_lse=True)
    np.testing.assert_allclose(lse.cpu().double().numpy(), ref_lse, atol=2e-3)


def test_split_with_rows_that_see_nothing():
    # bottom-right with sq > sk: the first rows see no key in any split
    q, k, v = make_qkv(1, 2, 2, 12, 40, 32, torch.float16)
    o, lse = fmha.attention(q[:, :, :12], k[:, :, :5], v[:, :, :5], causal=True, causal_align="bottom_right",
                            num_splits=2, return_lse=True)
    assert (o[:, :, :7] == 0).all() and torch.isneginf(lse[:, :, :7]).all()
    assert torch.isfinite(o).all()


def test_split_bshd_and_seqused():
    q, k, v = make_qkv(2, 4, 2, 3, 150, 32, torch.float16, layout="bshd")
    used = torch.tensor([150, 61], dtype=torch.int32, device=DEVICE)
    a = fmha.attention(q, k, v, layout="bshd", seqused_k=used, num_splits=4)
    b = fmha.attention(q, k, v, layout="bshd", seqused_k=used, num_splits=1)
    torch.testing.assert_close(a, b, atol=2e-3, rtol=2e-3)
    with pytest.raises(ValueError, match="num_splits must be an int >= 0"):
        fmha.attention(q, k, v, layout="bshd", num_splits=-1)
