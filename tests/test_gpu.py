"""The compiled kernels on a CUDA GPU, at sizes past the interpreter's reach."""
import numpy as np
import pytest
import torch

import fmha
from fmha import reference
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


HOPPER_SHAPES = [
    (2, 8, 8, 1024, 1024, 128),
    (1, 8, 2, 512, 1536, 64),     # GQA, sq < sk
    (1, 4, 1, 1024, 384, 128),    # MQA, sq > sk: bottom-right leaves rows with no key
    (3, 4, 4, 256, 256, 64),
    (2, 4, 2, 1000, 512, 64),     # ragged seqlen_q: the last warpgroups straddle the end
    (1, 3, 3, 77, 256, 128),      # seqlen_q below one block
    (4, 16, 4, 1000, 1024, 64),   # more work items than SMs: each persistent program runs several
    (3, 23, 23, 640, 640, 64),    # an odd number of items (345) over the SMs: persistent causal pairs, one alone
    (2, 4, 2, 1000, 1537, 64),    # ragged seqlen_k: the last key tile part past the end
    (1, 4, 4, 300, 77, 128),      # seqlen_k below one key tile; bottom-right leaves rows with no key
]
HOPPER_CONFIGS = [fmha.KernelConfig(128, 128, 4, 3), fmha.KernelConfig(192, 128, 4, 2),
                  fmha.KernelConfig(128, 128, 4, 2, persistent=1), fmha.KernelConfig(128, 128, 4, 2, persistent=0),
                  fmha.KernelConfig(128, 128, 4, 2, pingpong=1), fmha.KernelConfig(192, 128, 4, 2, pingpong=1),
                  fmha.KernelConfig(128, 128, 4, 2, head_group=3), fmha.KernelConfig(192, 128, 4, 2, head_group=8)]
DTYPE_LAYOUTS = [(dt, lay) for dt in (torch.float16, torch.bfloat16) for lay in ("bhsd", "bshd")]
# the table's configs in every dtype and layout; each other config in one of them (the descriptors
# and the output's dtype do not depend on the schedule)
HOPPER_RUNS = ([(None, dt, lay) for dt, lay in DTYPE_LAYOUTS]
               + [(cfg, *DTYPE_LAYOUTS[i % len(DTYPE_LAYOUTS)]) for i, cfg in enumerate(HOPPER_CONFIGS)])


@pytest.mark.parametrize("shape", HOPPER_SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("config,dtype,layout", HOPPER_RUNS, ids=str)
def test_hopper_matches_reference(config, layout, dtype, causal, align, shape):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    b, h, kvh, sq, sk, d = shape
    if config is not None and d == 128 and config.block_m == 192:
        pytest.skip("at head_dim 128, 192 rows spill")
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, dtype, layout, seed=sk)
    out = nan_like(q)
    from fmha.kernels import hopper
    if config is not None and hopper.smem_bytes(d, config) > hopper.SMEM_LIMIT:
        with pytest.raises(ValueError, match="shared memory"):  # Q, O and 3 K/V stages at D=128: a clear refusal
            fmha.attention(q, k, v, causal=causal, layout=layout, variant="hopper", config=config)
        return
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, variant="hopper",
                            out=out, return_lse=True, config=config)
    torch.cuda.synchronize()
    check_against_reference(out, q, k, v, causal, align, layout)
    _, ref_lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, variant="tiled",
                                return_lse=True)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


HOPPER_FEATURES = [  # (causal, align, window, softcap, ALiBi)
    (False, "top_left", (256, -1), 0.0, False),           # a left window only: no upper edge
    (True, "top_left", (300, -1), 0.0, False),            # causal + window: a band, tiles skipped on both sides
    (False, "top_left", (200, 100), 0.0, False),          # a band with a right edge (the upper edge, uncausal)
    (True, "bottom_right", (-1, -1), 15.0, False),        # softcap
    (False, "top_left", (-1, -1), 0.0, True),             # ALiBi
    (True, "bottom_right", (333, -1), 20.0, True),        # all three, bottom-right
]


@pytest.mark.parametrize("shape", [(2, 4, 2, 1000, 1024, 64), (1, 4, 4, 384, 1536, 128), (1, 2, 1, 2048, 640, 128),
                                   (1, 4, 2, 700, 1111, 64)],
                         ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("causal,align,window,softcap,alibi", HOPPER_FEATURES, ids=str)
def test_hopper_features_match_reference(causal, align, window, softcap, alibi, shape):
    """Window, softcap and ALiBi on the Gluon kernel, against the float64 reference (output and LSE)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    b, h, kvh, sq, sk, d = shape
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, seed=sq + sk)
    slopes = torch.tensor([2 ** -(i + 1) for i in range(h)], device="cuda") if alibi else None
    kw = dict(causal=causal, causal_align=align, window=window, softcap=softcap, alibi_slopes=slopes)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, variant="hopper", out=out, return_lse=True, **kw)
    torch.cuda.synchronize()
    ref, ref_lse = reference.dense_attention(q, k, v, return_lse=True, **kw)
    assert np.isfinite(out.double().cpu().numpy()).all()
    assert np.abs(out.double().cpu().numpy() - ref).max() < 2e-2
    got_lse = lse.double().cpu().numpy()
    assert np.array_equal(np.isneginf(got_lse), np.isneginf(ref_lse))  # the rows that see no key
    live = np.isfinite(ref_lse)
    assert np.abs(got_lse[live] - ref_lse[live]).max() < 2e-2


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_hopper_ragged_keys_stop_at_the_end(layout):
    """A ragged last key tile reads zeros past seqlen_k, never the neighbour's keys: the head (bhsd)
    or batch (bshd) stored after this one holds NaN, and this one's output stays exact."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(2, 2, 2, 256, 1000, 128, torch.bfloat16, layout, seed=5)
    nxt = (slice(None), 1) if layout == "bhsd" else (1,)  # what follows (batch 0, head 0)'s keys in memory
    k[nxt], v[nxt] = float("nan"), float("nan")
    out = nan_like(q)
    fmha.attention(q, k, v, layout=layout, variant="hopper", out=out)
    torch.cuda.synchronize()
    own = (slice(None), slice(0, 1)) if layout == "bhsd" else (slice(0, 1),)
    check_against_reference(out[own], q[own], k[own], v[own], False, layout=layout)


@pytest.mark.parametrize("variant", ["auto", "tiled", "hopper"])
def test_cuda_graph_capture_and_replay(variant):
    q, k, v = make_qkv(2, 8, 2, 512, 512, 128, torch.bfloat16, seed=1)
    fmha.attention(q, k, v, causal=True, variant=variant)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fmha.attention(q, k, v, causal=True, variant=variant)
    for seed in (2, 3):  # new inputs copied into the captured buffers
        q2, k2, v2 = make_qkv(2, 8, 2, 512, 512, 128, torch.bfloat16, seed=seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(out, q2, k2, v2, True)


def test_non_default_stream():
    q, k, v = make_qkv(1, 4, 4, 1024, 1024, 64, torch.float16, seed=4)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out = fmha.attention(q, k, v)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    check_against_reference(out, q, k, v, False)


def test_several_python_threads():
    from concurrent.futures import ThreadPoolExecutor
    problems = [make_qkv(1, 4, 2, 256 + 64 * i, 384, 64 if i % 2 else 128, torch.bfloat16, seed=i)
                for i in range(8)]

    def run(i):
        q, k, v = problems[i]
        with torch.cuda.stream(torch.cuda.Stream()):
            o = fmha.attention(q, k, v, causal=bool(i % 2))
            torch.cuda.current_stream().synchronize()
        return o

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(run, range(8)))
    for i, o in enumerate(outs):
        check_against_reference(o, *problems[i], bool(i % 2))


def test_torch_compile_inductor():
    q, k, v = make_qkv(2, 8, 8, 512, 512, 64, torch.bfloat16, seed=5)
    w = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)

    def block(q, k, v):
        return fmha.attention(q @ w, k, v, causal=True) @ w

    compiled = torch.compile(block, fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v), block(q, k, v), atol=2e-2, rtol=2e-2)


def test_offsets_past_2_to_the_31():
    # batch 1 of q, k and v starts 2**31 + 2**20 elements into one buffer: 32-bit offsets would wrap
    n = 2 ** 31 + 2 ** 20
    buf = torch.randn(n + 4096 * 64, device="cuda", dtype=torch.float16)
    shape, stride = (2, 2, 1024, 64), (n, 1024 * 64, 64, 1)
    q = buf.as_strided(shape, stride)
    k = buf.as_strided(shape, stride, storage_offset=8)
    v = buf.as_strided(shape, stride, storage_offset=16)
    for variant in ("tiled", "singlewave"):
        out = nan_like(q.contiguous())
        fmha.attention(q, k, v, variant=variant, out=out)
        torch.cuda.synchronize()
        check_against_reference(out, q, k, v, False)
    del buf


def test_features_at_gpu_sizes():
    """Window, softcap, ALiBi, key padding, split decoding: not yet run on a GPU when written."""
    q, k, v = make_qkv(2, 8, 2, 700, 1100, 128, torch.bfloat16, seed=11)
    slopes = torch.tensor([2 ** -(i + 1) for i in range(8)], device="cuda")
    used = torch.tensor([1100, 513], dtype=torch.int32, device="cuda")
    o = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", window=(300, -1), softcap=20.0,
                       alibi_slopes=slopes, seqused_k=used)
    for b, n in enumerate(used.tolist()):
        ref = reference.dense_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=True,
                                        causal_align="bottom_right", window=(300, -1), softcap=20.0,
                                        alibi_slopes=slopes)
        assert np.abs(o[b:b + 1].double().cpu().numpy() - ref).max() < 2e-2
    qd, kd, vd = make_qkv(4, 32, 8, 1, 16384, 128, torch.bfloat16, seed=12)
    split = fmha.attention(qd, kd, vd)  # auto splits the keys for a single query row
    check_against_reference(split, qd, kd, vd, False)
