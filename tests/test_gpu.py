"""The compiled kernels on a CUDA GPU, at sizes past the interpreter's reach."""
import pytest
import torch

import fmha
from conftest import check_against_reference, make_qkv, nan_like

pytestmark = pytest.mark.gpu

SHAPES = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim)
    (2, 8, 8, 1024, 1024, 128),
    (1, 8, 2, 1000, 1537, 64),    # GQA, ragged, sq != sk
    (1, 4, 1, 1537, 777, 96),     # MQA, masked head_dim
    (1, 4, 4, 513, 2049, 256),
    (3, 6, 3, 257, 255, 32),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("variant", ["auto", "singlewave", "pipelined", "tiled"])
def test_gpu_matches_reference(variant, dtype, causal, align, shape):
    b, h, kvh, sq, sk, d = shape
    for layout in ("bhsd", "bshd"):
        q, k, v = make_qkv(b, h, kvh, sq, sk, d, dtype, layout, contiguous=layout == "bhsd", seed=sq)
        out = nan_like(q)
        fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, variant=variant, out=out)
        torch.cuda.synchronize()
        check_against_reference(out, q, k, v, causal, align, layout)


HOPPER_SHAPES = [  # seqlen_k a multiple of the key tile: what the Gluon kernel takes
    (2, 8, 8, 1024, 1024, 128),
    (1, 8, 2, 512, 1536, 64),     # GQA, sq < sk
    (1, 4, 1, 1024, 384, 128),    # MQA, sq > sk: bottom-right leaves rows with no key
    (3, 4, 4, 256, 256, 64),
    (2, 4, 2, 1000, 512, 64),     # ragged seqlen_q: the last warpgroups straddle the end
    (1, 3, 3, 77, 256, 128),      # seqlen_q below one block
]
HOPPER_CONFIGS = [None, fmha.KernelConfig(128, 128, 4, 3), fmha.KernelConfig(192, 128, 4, 2)]


@pytest.mark.parametrize("shape", HOPPER_SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("config", HOPPER_CONFIGS, ids=str)
def test_hopper_matches_reference(config, layout, dtype, causal, align, shape):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    b, h, kvh, sq, sk, d = shape
    if config is not None and d == 128 and (config.block_m == 192 or config.num_stages == 3):
        pytest.skip("at head_dim 128: 192 rows spill, 3 stages overflow shared memory")
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, dtype, layout, seed=sk)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, variant="hopper",
                            out=out, return_lse=True, config=config)
    torch.cuda.synchronize()
    check_against_reference(out, q, k, v, causal, align, layout)
    _, ref_lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, variant="tiled",
                                return_lse=True)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)
