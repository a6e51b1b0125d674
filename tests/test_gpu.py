"""The compiled kernels on a CUDA GPU, at sizes past the interpreter's reach."""
import numpy as np
import pytest
import torch

import fmha
from fmha import reference
from conftest import check_against_reference, check_varlen, make_qkv, nan_like, packed

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
                  fmha.KernelConfig(128, 128, 4, 2, head_group=3), fmha.KernelConfig(192, 128, 4, 2, head_group=8),
                  fmha.KernelConfig(128, 128, 4, 2, q_regs=1), fmha.KernelConfig(192, 128, 4, 2, fence=1),
                  fmha.KernelConfig(128, 128, 4, 3, q_regs=1, fence=1),
                  # one consumer warpgroup, several programs on an SM
                  fmha.KernelConfig(64, 128, 4, 2, occupancy=2), fmha.KernelConfig(64, 64, 4, 2, occupancy=2, q_regs=1),
                  fmha.KernelConfig(64, 64, 4, 2, occupancy=3),
                  # the pivot moved only past 2**8 growth, O rescaled only then
                  fmha.KernelConfig(128, 128, 4, 2, lazy=1), fmha.KernelConfig(192, 128, 4, 2, pingpong=1, lazy=1),
                  fmha.KernelConfig(128, 128, 4, 3, q_regs=1, fence=1, lazy=1),
                  # no row max past the first tile, the pivot standing until a tile's row sum passes 2**15
                  fmha.KernelConfig(128, 128, 4, 2, q_regs=1, fence=1, stale=1),
                  fmha.KernelConfig(128, 128, 4, 3, q_regs=1, fence=1, stale=1),
                  fmha.KernelConfig(192, 128, 4, 2, pingpong=1, stale=1),
                  fmha.KernelConfig(64, 64, 4, 2, occupancy=3, q_regs=1, stale=1),
                  # O out through Q's tile where it has no stage of its own (3 stages at head_dim 128)
                  fmha.KernelConfig(128, 128, 4, 3, o_via_q=1),
                  fmha.KernelConfig(128, 128, 4, 3, pingpong=1, o_via_q=1),
                  # P to P V through each warpgroup's shared tile, not its registers
                  fmha.KernelConfig(128, 128, 4, 2, p_smem=1), fmha.KernelConfig(192, 128, 4, 2, stale=1, p_smem=1),
                  fmha.KernelConfig(128, 128, 4, 2, q_regs=1, fence=1, stale=1, p_smem=1),
                  fmha.KernelConfig(192, 128, 4, 2, pingpong=1, lazy=1, p_smem=1),
                  # off the tables: key tiles of 16 and 32, one stage and four
                  fmha.KernelConfig(128, 32, 4, 2), fmha.KernelConfig(64, 16, 4, 2), fmha.KernelConfig(128, 64, 4, 1),
                  fmha.KernelConfig(128, 64, 4, 4)]
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
    from fmha.kernels import hopper
    b, h, kvh, sq, sk, d = shape
    if config is not None and d == 128 and config.block_m == 192:
        pytest.skip("at head_dim 128, 192 rows spill")
    if config is not None and hopper.sm_bytes(d, config) > hopper.SMEM_SM:
        pytest.skip(f"{config.occupancy} programs of this config do not fit on an SM at head_dim {d}")
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, dtype, layout, seed=sk)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, variant="hopper",
                            out=out, return_lse=True, config=config)
    torch.cuda.synchronize()
    check_against_reference(out, q, k, v, causal, align, layout)
    _, ref_lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, variant="tiled",
                                return_lse=True)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


def test_hopper_refuses_a_config_ptxas_cannot_build():
    """A caller's config whose build runs out of registers (64 rows of 256-key tiles: ptxas stops with "Insufficient
    registers") is refused in one line naming the config and ptxas's verdict, not with Triton's message carrying the
    whole PTX; the table's config runs the same call."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(1, 2, 2, 300, 300, 64, torch.bfloat16)
    with pytest.raises(ValueError, match=r"config block_m=64 block_n=256 .* does not build for sm_90 \(ptxas fatal"):
        fmha.attention(q, k, v, variant="hopper", config=fmha.KernelConfig(64, 256, 4, 2))
    out = nan_like(q)
    fmha.attention(q, k, v, variant="hopper", out=out)
    check_against_reference(out, q, k, v, False)


@pytest.mark.parametrize("d,sq", [(64, 40), (64, 100), (128, 40), (128, 100)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("config", [None, fmha.KernelConfig(64, 64, 4, 2, q_regs=1, occupancy=3),
                                    fmha.KernelConfig(128, 128, 4, 2, q_regs=1)], ids=str)
def test_hopper_runs_many_short_items(d, sq, causal, config):
    """Thousands of sequences of 32 heads, one or two key tiles each: a persistent program runs dozens of items in
    turn.  On an H100, 2047-2100 sequences of 40 tokens at head_dim 64, causal, in the table's row for them (64-row
    programs three to an SM, Q in registers, causal pairs with the last rounds dealt by LPT), came out wrong in
    1833-2221 of 65504-67200 heads, spread over every sequence and both items of a pair (`tiled` right on the same
    calls): with Q in registers the consumer freed Q's slot for the next item's TMA load
    with its reads still in flight, and the wrong rows were those of the next item's Q (a proxy fence sits there
    since: ``test_targets.py::test_hopper_q_in_registers_frees_its_slot_behind_a_proxy_fence``).  Every row against
    float64."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    from fmha.kernels.hopper import resources
    if config is not None and resources.sm_bytes(d, config) > resources.SMEM_SM:
        pytest.skip(f"{config.occupancy} programs of {config} do not fit on an SM at head_dim {d}")
    # dozens of items a program at D=64; half the sequences at D=128 (the float64 reference's memory, beside
    # other workers)
    batch = (2048 if sq == 40 else 256) // (d // 64)
    q, k, v = make_qkv(batch, 32, 32, sq, sq, d, torch.bfloat16, "bshd", seed=sq + d)
    out = nan_like(q)
    fmha.attention(q, k, v, causal=causal, layout="bshd", variant="hopper", out=out, config=config)
    torch.cuda.synchronize()
    if config is None:  # and what auto runs
        right = nan_like(q)
        fmha.attention(q, k, v, causal=causal, layout="bshd", out=right)
        check_against_reference(right, q, k, v, causal, "top_left", "bshd")
    check_against_reference(out, q, k, v, causal, "top_left", "bshd")


@pytest.mark.parametrize("growth", [0.002, 0.05, "jump"])
@pytest.mark.parametrize("d,config", [(128, fmha.KernelConfig(128, 128, 4, 2, lazy=1)),
                                      (64, fmha.KernelConfig(192, 128, 4, 2, lazy=1)),
                                      (64, fmha.KernelConfig(64, 64, 4, 2, occupancy=3, lazy=1)),
                                      (96, fmha.KernelConfig(192, 128, 4, 2, fence=1, stale=1, p_smem=1)),
                                      (64, fmha.KernelConfig(192, 128, 4, 2, balance=1, stale=1, p_smem=1)),
                                      (128, fmha.KernelConfig(128, 128, 4, 2, q_regs=1, fence=1, stale=1)),
                                      (64, fmha.KernelConfig(192, 128, 4, 2, pingpong=1, stale=1)),
                                      (64, fmha.KernelConfig(64, 64, 4, 2, occupancy=3, stale=1)),
                                      (96, fmha.KernelConfig(128, 128, 4, 2, q_regs=1, stale=1)),
                                      (96, fmha.KernelConfig(128, 128, 4, 2, lazy=1)),
                                      (32, fmha.KernelConfig(192, 128, 4, 2, pingpong=1, stale=1)),
                                      (256, fmha.KernelConfig(128, 64, 4, 2, lazy=1)),
                                      (256, fmha.KernelConfig(128, 64, 4, 2, pingpong=1, stale=1, o_via_q=1))],
                         ids=str)
def test_hopper_rescales_as_scores_grow(d, config, growth):
    """Keys growing along the sequence (key j scaled by 1 + growth * j): at 0.05 every row's max grows
    by far more than 2**8 from one key tile to the next, so a lazy pivot moves (and O is rescaled) at
    every tile, and a standing (``stale``) one is over 2**15 and takes its tile again; at 0.002 it grows
    by about 1 in log2 units a tile and the pivot stays behind, leaving probabilities above 1.  "jump":
    keys from 300 on (inside a key tile) times 300, scores some 400 log2 units past the pivot of the
    tiles before: a standing pivot's exponentials overflow to inf there, and the tile is taken again.
    Random keys alone would never move a lazy pivot after the first tile."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(2, 4, 4, 640, 1536, d, torch.bfloat16, seed=d)
    j = torch.arange(1536, device=k.device, dtype=torch.float32)
    scale = torch.where(j < 300, 1.0, 300.0) if growth == "jump" else 1 + growth * j
    k = (k.float() * scale[:, None]).to(k.dtype)
    for causal in (False, True):
        out = nan_like(q)
        fmha.attention(q, k, v, causal=causal, variant="hopper", out=out, config=config)
        torch.cuda.synchronize()
        check_against_reference(out, q, k, v, causal)


@pytest.mark.parametrize("window", [(-1, -1), (700, -1), (555, 300)], ids=str)
@pytest.mark.parametrize("d,config", [(128, fmha.KernelConfig(128, 128, 4, 2, q_regs=1, stale=1)),
                                      (96, fmha.KernelConfig(128, 128, 4, 2, balance=1, stale=1)),
                                      (64, fmha.KernelConfig(192, 128, 4, 2, stale=1)),
                                      (64, fmha.KernelConfig(128, 128, 4, 2, q_regs=1, balance=1, stale=1))],
                         ids=str)
def test_hopper_standing_pivot_beside_the_masks(d, config, window):
    """The key loop runs its tiles in three runs (those a window's lower edge crosses, those every row sees
    whole, those the diagonal or the last key crosses), the standing pivot in the middle one only: causal,
    bottom-right, ragged keys and a band, with keys that jump 300-fold inside a tile (the standing pivot
    overflows and takes the tile again), against the float64 reference, output and LSE."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(1, 4, 2, 1000, 1500, d, torch.bfloat16, seed=d)
    for jump in (False, True):
        if jump:
            j = torch.arange(1500, device=k.device)
            k = (k.float() * torch.where(j < 620, 1.0, 300.0)[:, None]).to(k.dtype)
        for causal, align in ((True, "top_left"), (True, "bottom_right"), (False, "top_left")):
            kw = dict(causal=causal, causal_align=align, window=window)
            out = nan_like(q)
            _, lse = fmha.attention(q, k, v, variant="hopper", out=out, return_lse=True, config=config, **kw)
            torch.cuda.synchronize()
            ref, ref_lse = reference.dense_attention(q, k, v, return_lse=True, **kw)
            assert np.isfinite(out.double().cpu().numpy()).all()
            assert np.abs(out.double().cpu().numpy() - ref).max() < 2e-2
            got = lse.double().cpu().numpy()
            assert np.array_equal(np.isneginf(got), np.isneginf(ref_lse))
            live = np.isfinite(ref_lse)
            assert np.abs(got[live] - ref_lse[live]).max() < 2e-2


def test_hopper_refuses_what_does_not_fit():
    """4 K/V stages at D=128 need 288 KB of shared memory: a clear refusal, not a launch failure
    (3 fit when O goes out from registers: ``test_hopper_matches_reference`` runs them)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(1, 2, 2, 256, 256, 128, torch.bfloat16)
    with pytest.raises(ValueError, match="needs 288 KB of shared memory, sm_90 has 227 KB"):
        fmha.attention(q, k, v, variant="hopper", config=fmha.KernelConfig(128, 128, 4, 4))


def test_decode_reads_kv_by_tma_where_it_can():
    """Decoding on sm_90 takes the decode table's K/V by TMA where the strides allow it (contiguous, every
    other row of a wider buffer) and drops it where they do not (264-byte rows: not a multiple of 16
    bytes); all agree with the reference."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(2, 8, 2, 1, 4096, 128, torch.bfloat16, contiguous=False, seed=7)
    narrow = [torch.zeros(*t.shape[:3], 132, dtype=t.dtype, device=t.device) for t in (k, v)]
    for t, w in zip(narrow, (k, v)):
        t[..., :128] = w
    for kk, vv, tma in ((k.contiguous(), v.contiguous(), True), (k, v, True),
                        (narrow[0][..., :128], narrow[1][..., :128], False)):
        assert ("tma=1" in fmha.api.describe(q, kk, vv)) == tma, fmha.api.describe(q, kk, vv)
        out = nan_like(q)
        fmha.attention(q, kk, vv, out=out)
        check_against_reference(out, q, kk, vv, False)


@pytest.mark.parametrize("arrangement", ["hf-view", "fused-qkv", "kv-cache", "strided-out"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,dtype", [(64, torch.float16), (128, torch.bfloat16)], ids=str)
def test_hopper_reads_views_in_place(d, dtype, causal, arrangement):
    """``auto`` runs transformers' transposed views, slices of a fused qkv projection and a cache with
    spare capacity on the Gluon kernel, with no copy, in both layout arguments, and writes an ``out`` that
    is itself a strided view; rows outside what is attended stay untouched."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    from fmha.bench.layouts import arrange
    q, k, v = make_qkv(2, 8, 2, 1000, 1000, d, dtype, seed=d)
    if arrangement != "strided-out":
        q, k, v = arrange(q, k, v, arrangement)
    for layout in ("bhsd", "bshd"):
        qq, kk, vv = (t if layout == "bhsd" else t.transpose(1, 2) for t in (q, k, v))
        assert fmha.api.describe(qq, kk, vv, causal=causal, layout=layout).startswith("hopper")
        buf = torch.full((2, 1000, 3, 8, d), float("nan"), dtype=dtype, device="cuda")  # out in its middle third
        out = buf[:, :, 1].transpose(1, 2) if layout == "bhsd" else buf[:, :, 1]
        fmha.attention(qq, kk, vv, causal=causal, layout=layout, out=out)
        torch.cuda.synchronize()
        check_against_reference(out, qq, kk, vv, causal, "top_left", layout)
        assert buf[:, :, 0].isnan().all() and buf[:, :, 2].isnan().all()


@pytest.mark.parametrize("broadcast", ["batch-kv", "seq-q", "heads-kv"])
@pytest.mark.parametrize("seqlen_q", [1000, 1], ids=["prefill", "decode"])
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_broadcast_inputs_read_as_they_are(layout, seqlen_q, broadcast):
    """Inputs made by ``expand`` (a stride of 0: one prefix's K/V for every sequence of a batch, one query row
    repeated, one KV head for all): whatever runs them (TMA views where the strides allow, else pointers) reads each
    element where it is, forward and backward."""
    q, k, v = make_qkv(3, 8, 2, seqlen_q, 1000, 128, torch.bfloat16, seed=seqlen_q)
    if broadcast == "batch-kv":
        k, v = (t[:1].transpose(1, 2).contiguous().transpose(1, 2).expand_as(t) for t in (k, v))  # bshd storage
    elif broadcast == "seq-q":
        q = q[:, :, :1].expand_as(q)
    else:
        k, v = (t[:, :1].expand(3, 8, *t.shape[2:]) for t in (k, v))
    qq, kk, vv = (t if layout == "bhsd" else t.transpose(1, 2) for t in (q, k, v))
    out = nan_like(qq)
    fmha.attention(qq, kk, vv, causal=seqlen_q > 1, layout=layout, out=out)
    check_against_reference(out, qq, kk, vv, seqlen_q > 1, "top_left", layout)
    if seqlen_q == 1:
        return
    leaves = [t.detach().requires_grad_() for t in (qq, kk, vv)]
    fmha.attention(*leaves, causal=True, layout=layout).float().square().sum().backward()
    ref = [t.detach().float().requires_grad_() for t in (qq, kk, vv)]
    rq, rk, rv = (t if layout == "bhsd" else t.transpose(1, 2) for t in ref)
    torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, is_causal=True, enable_gqa=True) \
        .square().sum().backward()
    for got, want in zip(leaves, ref):
        assert (got.grad.float() - want.grad).abs().max() <= 0.05 * want.grad.abs().max(), broadcast


def _arranged(b, h, kvh, s, d, dv, arrangement, seed):
    """bf16 q, k, v (bhsd views; v of head dim ``dv``) as a program holds them: ``contiguous`` bhsd,
    transformers' ``hf-view`` (bshd storage) or slices of one ``fused-qkv`` projection."""
    g = torch.Generator().manual_seed(seed)
    widths = (h * d, kvh * d, kvh * dv)
    fused = torch.randn(b, s, sum(widths), generator=g).to(torch.bfloat16).cuda()
    parts = [p.view(b, s, n, x).transpose(1, 2) for p, n, x in zip(fused.split(widths, -1), (h, kvh, kvh), (d, d, dv))]
    if arrangement == "fused-qkv":
        return parts
    if arrangement == "hf-view":
        return [p.transpose(1, 2).contiguous().transpose(1, 2) for p in parts]
    return [p.contiguous() for p in parts]


@pytest.mark.parametrize("arrangement", ["contiguous", "hf-view", "fused-qkv"])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("d,dv,config", [(32, 32, None), (96, 96, None), (192, 192, None), (256, 256, None),
                                         (40, 40, None), (80, 80, None), (112, 112, None), (160, 160, None),
                                         (248, 248, None), (144, 80, None), (80, 40, None),
                                         (80, 80, fmha.KernelConfig(128, 128, 4, 2, q_regs=1)),
                                         (192, 128, None), (64, 32, None), (128, 96, None),
                                         (192, 128, fmha.KernelConfig(128, 128, 4, 2, split_qk=1)),
                                         (192, 128, fmha.KernelConfig(128, 128, 4, 2, split_qk=1, q_regs=1)),
                                         (192, 192, fmha.KernelConfig(128, 64, 4, 2, split_qk=1)),
                                         (32, 32, fmha.KernelConfig(128, 128, 4, 2)),
                                         (96, 96, fmha.KernelConfig(128, 128, 4, 2)),
                                         (96, 96, fmha.KernelConfig(192, 128, 4, 2, pingpong=1, q_regs=1)),
                                         (32, 32, fmha.KernelConfig(64, 128, 4, 2, occupancy=2)),
                                         (256, 256, fmha.KernelConfig(128, 64, 4, 2, pingpong=1, stale=1, o_via_q=1)),
                                         (256, 256, fmha.KernelConfig(128, 64, 4, 2, lazy=1, o_via_q=1)),
                                         (160, 160, fmha.KernelConfig(128, 64, 4, 2, o_via_q=1)),
                                         (192, 128, fmha.KernelConfig(128, 128, 4, 2, split_qk=1, o_via_q=1)),
                                         (96, 96, fmha.KernelConfig(192, 128, 4, 2, fence=1, stale=1, p_smem=1)),
                                         (80, 80, fmha.KernelConfig(192, 128, 4, 2, fence=1, stale=1, p_smem=1)),
                                         (192, 128, fmha.KernelConfig(128, 64, 4, 2, split_qk=1, p_smem=1))],
                         ids=str)
def test_hopper_takes_every_head_dim(d, dv, config, causal, align, arrangement):
    """head_dim 32, 96, 192, 256, every other multiple of 8 from 40 (a sample: 40 and 80 with two Q K^T slices, 112
    and 248 over the whole tile), DeepSeek's 192/128 and V narrower than q/k in tiles of another swizzle (64/32)
    or padded (128/96) on the Gluon kernel, in tiles padded to a power of two (Q in shared memory: Q K^T over
    the head dim's own columns, in slices), and 192 held unpadded (``split_qk``, 128-key tiles at 192/128).  kv
    head 1's first key is NaN: heads 2 and 3 (which read it) come out NaN, heads 0 and 1 match the reference, so
    a box padded past head_dim never reads the next head's columns (side by side in a row in the hf-view and
    fused-qkv arrangements) nor writes them."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = _arranged(2, 4, 2, 1000, d, dv, arrangement, seed=d + dv)
    k[:, 1, 0] = float("nan")
    assert fmha.api.describe(q, k, v, causal=causal).startswith("hopper")
    for layout in ("bhsd", "bshd"):
        qq, kk, vv = (t if layout == "bhsd" else t.transpose(1, 2) for t in (q, k, v))
        buf = torch.full((2, 1000, 3, 4, dv), float("nan"), dtype=q.dtype, device="cuda")  # out in its middle third
        out = buf[:, :, 1].transpose(1, 2) if layout == "bhsd" else buf[:, :, 1]
        _, lse = fmha.attention(qq, kk, vv, causal=causal, causal_align=align, layout=layout, out=out,
                                return_lse=True, variant="hopper", config=config)
        torch.cuda.synchronize()
        check_against_reference(out, qq, kk, vv, causal, align, layout, lse=lse)  # NaN rows where the reference's
        assert buf[:, :, 0].isnan().all() and buf[:, :, 2].isnan().all()


@pytest.mark.parametrize("head_dim", [80, 96])
@pytest.mark.parametrize("arrangement", ["contiguous", "hf-view", "fused-qkv"])
def test_hopper_runs_80_and_96_long_on_their_own_row(arrangement, head_dim):
    """Head_dim 80 and 96 without causal past 2k keys take ``HOPPER_NARROW_LONG`` (192 x 64 tiles, 3 stages): GQA,
    each arrangement a program passes, both layouts, a NaN key in kv head 1 (heads 2 and 3 NaN, 0 and 1 the
    reference's), out in the middle third of a NaN buffer that no store may leave."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    from fmha import configs
    q, k, v = _arranged(1, 4, 2, 4096, head_dim, head_dim, arrangement, seed=head_dim)
    k[:, 1, 0] = float("nan")
    assert fmha.api.describe(q, k, v) == f"hopper {configs.HOPPER_NARROW_LONG}"
    for layout in ("bhsd", "bshd"):
        qq, kk, vv = (t if layout == "bhsd" else t.transpose(1, 2) for t in (q, k, v))
        buf = torch.full((1, 4096, 3, 4, head_dim), float("nan"), dtype=q.dtype, device="cuda")
        out = buf[:, :, 1].transpose(1, 2) if layout == "bhsd" else buf[:, :, 1]
        _, lse = fmha.attention(qq, kk, vv, layout=layout, out=out, return_lse=True)
        torch.cuda.synchronize()
        check_against_reference(out, qq, kk, vv, False, "top_left", layout, lse=lse)
        assert buf[:, :, 0].isnan().all() and buf[:, :, 2].isnan().all()


@pytest.mark.parametrize("head_dim,seqlen_k", [(128, 8192), (128, 8193), (64, 16384), (256, 8192), (96, 8192)])
@pytest.mark.parametrize("seqlen_q,kv_heads", [(1, 2), (3, 8), (16, 2)])
def test_decode_long_keys_match_reference(head_dim, seqlen_k, seqlen_q, kv_heads):
    """Decoding from 8k keys (the decode table's long-key row: 128-key tiles up to head_dim 128; its
    ring must fit the SM at 256), GQA packed or not, a ragged last key tile."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(2, 8, kv_heads, seqlen_q, seqlen_k, head_dim, torch.bfloat16, seed=seqlen_k)
    out = nan_like(q)
    fmha.attention(q, k, v, out=out)
    torch.cuda.synchronize()
    check_against_reference(out, q, k, v, False)


HOPPER_FEATURES = [  # (causal, align, window, softcap, ALiBi)
    (False, "top_left", (256, -1), 0.0, False),           # a left window only: no upper edge
    (True, "top_left", (300, -1), 0.0, False),            # causal + window: a band, tiles skipped on both sides
    (True, "top_left", (700, -1), 0.0, False),            # a band of several tiles: those past its edge unmasked
    (False, "bottom_right", (555, 300), 0.0, False),      # the same with a right edge off the diagonal
    (False, "top_left", (200, 100), 0.0, False),          # a band with a right edge (the upper edge, uncausal)
    (True, "bottom_right", (-1, -1), 15.0, False),        # softcap
    (False, "top_left", (-1, -1), 0.0, True),             # ALiBi
    (True, "bottom_right", (333, -1), 20.0, True),        # all three, bottom-right
]


@pytest.mark.parametrize("shape", [(2, 4, 2, 1000, 1024, 64), (1, 4, 4, 384, 1536, 128), (1, 2, 1, 2048, 640, 128),
                                   (1, 4, 2, 700, 1111, 64),
                                   # up to 512 keys: the table's 64-row programs, three (D=64) or two to an SM
                                   (2, 4, 2, 300, 500, 64), (1, 4, 4, 384, 512, 128)],
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


SPLIT_SHAPES = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim): a last round cut into pieces
    (1, 20, 10, 2048, 4096, 128),  # 320 items: two whole rounds and 56 items; GQA
    (2, 9, 3, 1000, 4000, 64),     # a few items past a whole round; ragged rows and keys, GQA
    (1, 36, 36, 700, 8192, 64),    # 192 rows (144 items), the last block's last warpgroups past the end
]


@pytest.mark.parametrize("shape", SPLIT_SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_hopper_split_tail_matches_reference(layout, shape):
    """``split_tail``: the items of a partly filled last round run in pieces of key tiles, merged by
    their LSE after the kernel; output and LSE as without the split."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    from fmha.device import device_facts
    from fmha.kernels import hopper
    from fmha.plan import Problem
    b, h, kvh, sq, sk, d = shape
    cfg = fmha.KernelConfig(192 if sq == 700 else 128, 128, 4, 2, split_tail=1, q_regs=int(d == 64 and sq != 700))
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, layout, seed=sk)
    out = nan_like(q)
    prob = Problem(b, h, kvh, sq, sk, d, False, 0, 1.0)
    n_tiles = -(-sq // cfg.block_m) * b * h
    assert hopper.split_pieces(prob, cfg, n_tiles, device_facts(0)[1], out.numel() * out.element_size()) > 1
    o, lse = fmha.attention(q, k, v, layout=layout, variant="hopper", out=out, return_lse=True, config=cfg)
    torch.cuda.synchronize()
    check_against_reference(out, q, k, v, False, layout=layout)
    _, ref_lse = fmha.attention(q, k, v, layout=layout, variant="tiled", return_lse=True)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


CLUSTER_SHAPES = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim): 2-CTA clusters, K/V multicast
    (2, 8, 8, 1024, 1024, 128),    # 64 pairs of blocks: fewer than the clusters
    (1, 16, 4, 2048, 4096, 128),   # GQA, sq < sk; 128 pairs, more than a round
    (2, 5, 5, 1000, 1537, 128),    # ragged rows (the last pair's second block empty) and ragged keys
    (1, 3, 3, 77, 100, 128),       # one block a head (its pair's partner past the end), one part-key tile
    (1, 20, 10, 2048, 4096, 128),  # 160 pairs: two rounds of 66 clusters, the rest in pieces (split_tail); GQA
]


CLUSTER_CONFIGS = [fmha.KernelConfig(128, 128, 4, 2, cluster=1, fence=1, lazy=1),
                   fmha.KernelConfig(128, 128, 4, 2, cluster=1, split_tail=1, fence=1, lazy=1),
                   fmha.KernelConfig(128, 128, 4, 3, cluster=1, split_tail=1, fence=1, lazy=1),
                   # the table's row (head groups, Q in registers) with the last round in pieces
                   fmha.KernelConfig(128, 128, 4, 2, head_group=2, q_regs=1, fence=1, lazy=1, cluster=1,
                                     split_tail=1),
                   # ... with a standing pivot (no row max past the first tile)
                   fmha.KernelConfig(128, 128, 4, 2, head_group=2, q_regs=1, fence=1, cluster=1, stale=1)]


@pytest.mark.parametrize("shape", CLUSTER_SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("dtype,layout", DTYPE_LAYOUTS, ids=str)
@pytest.mark.parametrize("cfg", CLUSTER_CONFIGS, ids=str)
def test_hopper_cluster_matches_reference(cfg, dtype, layout, shape):
    """``cluster``: programs of two CTAs on neighbouring query blocks, each K/V tile read from L2
    once for both (half by each CTA, multicast; kernels/multicast.py rewrites the PTX for it);
    output and LSE as the tiled kernel's, with and without the last round in pieces, O staged (2
    stages) or stored from registers (3), Q from shared memory or registers."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    b, h, kvh, sq, sk, d = shape
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, dtype, layout, seed=sk)
    out = nan_like(q)
    if cfg.split_tail and h == 20:  # the shape meant to cut its last round: it does
        from fmha.device import device_facts
        from fmha.kernels import hopper
        from fmha.plan import Problem
        pairs = -(-sq // hopper.item_rows(cfg)) * b * h
        assert hopper.split_pieces(Problem(b, h, kvh, sq, sk, d, False, 0, 1.0), cfg, pairs, device_facts(0)[1] // 2,
                                   out.numel() * out.element_size()) > 1
    o, lse = fmha.attention(q, k, v, layout=layout, variant="hopper", out=out, return_lse=True, config=cfg)
    torch.cuda.synchronize()
    check_against_reference(out, q, k, v, False, layout=layout)
    _, ref_lse = fmha.attention(q, k, v, layout=layout, variant="tiled", return_lse=True)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


BALANCE_SHAPES = [  # (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, block_m, align, head_group): causal pairs
    (8, 32, 8, 1024, 1024, 64, 128, "top_left", 1),       # 2048 items: 6 rounds of pairs, the rest by LPT; GQA
    (3, 50, 50, 1000, 1152, 64, 192, "bottom_right", 1),  # 900 items (odd heads x blocks), ragged rows, sq < sk
    (2, 16, 16, 700, 2048, 128, 128, "bottom_right", 1),  # sq < sk: every block sees 1348 keys more
    (1, 16, 4, 2048, 700, 128, 128, "top_left", 1),       # sq > sk: the lower blocks see every key
    (2, 40, 40, 384, 384, 128, 128, "top_left", 1),       # 240 items: one each, no pairs before the tail
    (8, 32, 8, 1024, 1024, 64, 128, "top_left", 4),       # pairs across 4 heads at a time; GQA
    (3, 50, 50, 1000, 1152, 64, 192, "bottom_right", 8),  # 6 blocks a head, groups of 8 heads, the last of 6
    (2, 40, 40, 384, 384, 128, 128, "top_left", 4),       # 3 blocks a head (odd): head-major pairs instead
]


@pytest.mark.parametrize("balance", [0, 1])
@pytest.mark.parametrize("shape", BALANCE_SHAPES, ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}-m{}-{}-g{}".format(*s))
def test_hopper_balanced_causal_matches_reference(shape, balance):
    """Causal pairs of items, numbered head by head or across ``head_group`` heads, alone or (``balance``) with the
    last round or two dealt longest item first from a host-built list
    (:func:`fmha.kernels.hopper.balanced_tail`); every item once, output and LSE exact."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    b, h, kvh, sq, sk, d, block_m, align, head_group = shape
    cfg = fmha.KernelConfig(block_m, 128, 4, 2, q_regs=int(block_m == 128), balance=balance, head_group=head_group)
    q, k, v = make_qkv(b, h, kvh, sq, sk, d, torch.bfloat16, seed=sq + sk)
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, causal=True, causal_align=align, variant="hopper", out=out, return_lse=True,
                            config=cfg)
    torch.cuda.synchronize()
    check_against_reference(out, q, k, v, True, causal_align=align)
    _, ref_lse = fmha.attention(q, k, v, causal=True, causal_align=align, variant="tiled", return_lse=True)
    torch.testing.assert_close(lse, ref_lse, atol=1e-3, rtol=1e-4)


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


HOPPER_VARLEN = [  # (query lengths, key lengths) of the packed sequences
    # empty, one-row and sub-tile sequences beside multi-tile ones; a query run with no keys
    ([1000, 1, 0, 128, 300, 77, 2049], [1000, 300, 5, 128, 1, 0, 1537]),
    ([256, 513, 64, 190], [256, 513, 2048, 190]),  # ends on the tile, sq < sk, one at 190 rows (3 warpgroups' worth)
    ([300, 1, 0, 64, 512, 77], [300, 17, 5, 64, 512, 1]),  # no sequence past 512 keys: the 64-row programs
]


@pytest.mark.parametrize("lens", HOPPER_VARLEN, ids=lambda x: f"{len(x[0])}seqs")
@pytest.mark.parametrize("causal,align,window", [(False, "top_left", (-1, -1)), (True, "top_left", (-1, -1)),
                                                 (True, "bottom_right", (-1, -1)), (True, "bottom_right", (300, -1)),
                                                 (False, "top_left", (200, 100))])
@pytest.mark.parametrize("d,dv,dtype", [(64, 64, torch.bfloat16), (128, 128, torch.float16), (96, 96, torch.bfloat16),
                                        (32, 32, torch.float16), (192, 128, torch.bfloat16),
                                        (256, 256, torch.bfloat16), (80, 80, torch.bfloat16),
                                        (40, 40, torch.float16)], ids=str)
def test_hopper_varlen_matches_reference(d, dv, dtype, causal, align, window, lens):
    """Packed sequences on the Gluon kernel: every sequence (output and LSE) against its own
    float64 reference, the output's memory poisoned with NaN beforehand (192/128: Q and K unpadded,
    ``split_qk``, the table's row; 256: 64-key tiles, non-causal with the standing pivot and ping-pong)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    lens_q, lens_k = lens
    q, cu_q = packed(lens_q, 4, d, dtype, 1)
    k, cu_k = packed(lens_k, 2, d, dtype, 2)
    v, _ = packed(lens_k, 2, dv, dtype, 3)
    del_me = nan_like(q)  # the caching allocator hands this NaN block to the output
    del del_me
    kw = dict(causal=causal, causal_align=align, window=window)
    o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), variant="hopper",
                                   return_lse=True, **kw)
    torch.cuda.synchronize()
    check_varlen(o, lse, q, k, v, cu_q, cu_k, **kw)


@pytest.mark.parametrize("d", [32, 64, 80, 96, 128, 256])
def test_hopper_varlen_long_causal_runs_the_tables_standing_pivot(d):
    """Packed causal sequences past 4k keys take the table's causal rows there, the standing pivot on the tiles
    every row sees whole (``stale``): each sequence (output and LSE) against its own float64 reference, top-left
    and bottom-right, the output poisoned with NaN, with keys that jump 300-fold inside one sequence (its
    standing pivot overflows and takes the tile again) beside sequences of random keys."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    lens_q, lens_k = [4100, 1, 2999, 64, 4500], [4100, 5000, 3000, 64, 4500]
    assert fmha.configs.hopper_config(d, True, max(lens_k), per_sequence=True).stale == 1
    q, cu_q = packed(lens_q, 4, d, torch.bfloat16, 7)
    k, cu_k = packed(lens_k, 2, d, torch.bfloat16, 8)
    v, _ = packed(lens_k, 2, d, torch.bfloat16, 9)
    jump = int(cu_k[4]) + 2100  # inside a key tile of the last sequence
    k[jump:] = (k[jump:].float() * 300).to(k.dtype)
    for align in ("top_left", "bottom_right"):
        out = nan_like(q)
        del out  # the caching allocator hands this NaN block to the output
        o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                       causal_align=align, variant="hopper", return_lse=True)
        torch.cuda.synchronize()
        check_varlen(o, lse, q, k, v, cu_q, cu_k, causal=True, causal_align=align)


def test_hopper_varlen_keys_stop_at_the_sequence_end():
    """A sequence's last key tile runs into the next sequence's keys: those are masked and their
    values zeroed, so a next sequence of NaN leaves this one exact (only the NaN one is NaN)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    lens_q, lens_k = [300, 200, 130], [1000, 700, 250]
    q, cu_q = packed(lens_q, 4, 128, torch.bfloat16, 4)
    k, cu_k = packed(lens_k, 4, 128, torch.bfloat16, 5)
    v, _ = packed(lens_k, 4, 128, torch.bfloat16, 6)
    k[1000:1700], v[1000:1700] = float("nan"), float("nan")  # sequence 1
    for causal, stages in ((False, 2), (True, 2), (True, 3)):  # 3 stages: O leaves from registers
        cfg = fmha.KernelConfig(128, 128, 4, stages)
        o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, 300, 1000, causal=causal, causal_align="bottom_right",
                                       variant="hopper", return_lse=True, config=cfg)
        torch.cuda.synchronize()
        check_varlen(o, lse, q, k, v, cu_q, cu_k, skip=(1,), causal=causal, causal_align="bottom_right")


@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "top_left"), (True, "bottom_right")])
@pytest.mark.parametrize("d,stages", [(64, 2), (128, 2), (128, 3), (96, 2), (32, 2), (80, 2)])
def test_hopper_seqused_k_is_key_padding(d, stages, causal, align, layout):
    """Per-batch key lengths on the Gluon kernel; the padding past them holds NaN (keys and
    values) and never reaches the result; a batch with no keys gives 0 and LSE -inf.  (3 stages
    at D=128: the table's choice past 16k keys, O stored from registers.)"""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    q, k, v = make_qkv(4, 4, 2, 300, 1100, d, torch.bfloat16, layout, seed=d)
    used = [1100, 0, 129, 640]
    for b, n in enumerate(used):
        pad = (b, slice(None), slice(n, None)) if layout == "bhsd" else (b, slice(n, None))
        k[pad], v[pad] = float("nan"), float("nan")
    out = nan_like(q)
    cfg = fmha.KernelConfig(128, 128, 4, stages)
    o, lse = fmha.attention(q, k, v, causal=causal, causal_align=align, layout=layout, variant="hopper", out=out,
                            return_lse=True, seqused_k=torch.tensor(used, dtype=torch.int32, device="cuda"),
                            config=cfg)
    torch.cuda.synchronize()
    for b, n in enumerate(used):
        own = (slice(b, b + 1),)
        keys = (slice(b, b + 1), slice(None), slice(0, n)) if layout == "bhsd" else (slice(b, b + 1), slice(0, n))
        if n == 0:
            assert (out[own] == 0).all() and torch.isneginf(lse[own]).all()
            continue
        check_against_reference(out[own], q[own], k[keys], v[keys], causal, align, layout)
        _, ref_lse = fmha.attention(q[own], k[keys], v[keys], causal=causal, causal_align=align, layout=layout,
                                    variant="tiled", return_lse=True)
        torch.testing.assert_close(lse[own], ref_lse, atol=1e-3, rtol=1e-4)


def test_auto_takes_hopper_for_lengths_per_sequence():
    """On sm_90, ``auto`` runs varlen and seqused_k prefill on the Gluon kernel (and agrees with tiled)."""
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm_90 only")
    from fmha import replay
    from fmha.kernels import hopper
    replay.clear()  # the first call of each kind plans and launches through hopper.launch
    calls = []
    launch = hopper.launch
    hopper.launch = lambda *a, **kw: calls.append(1) or launch(*a, **kw)
    try:
        q, cu_q = packed([700, 300], 4, 128, torch.bfloat16, 7)
        k, cu_k = packed([900, 300], 4, 128, torch.bfloat16, 8)
        v, _ = packed([900, 300], 4, 128, torch.bfloat16, 9)
        o = fmha.attention_varlen(q, k, v, cu_q, cu_k, 700, 900, causal=True, causal_align="bottom_right")
        qd, kd, vd = make_qkv(2, 4, 4, 256, 512, 128, torch.bfloat16, seed=3)
        used = torch.tensor([512, 100], dtype=torch.int32, device="cuda")
        od = fmha.attention(qd, kd, vd, seqused_k=used)
    finally:
        hopper.launch = launch
    assert len(calls) == 2
    torch.testing.assert_close(o, fmha.attention_varlen(q, k, v, cu_q, cu_k, 700, 900, causal=True,
                                                        causal_align="bottom_right", variant="tiled"),
                               atol=2e-2, rtol=0)
    torch.testing.assert_close(od, fmha.attention(qd, kd, vd, seqused_k=used, variant="tiled"), atol=2e-2, rtol=0)


@pytest.mark.parametrize("variant", ["auto", "tiled", "hopper"])
@pytest.mark.parametrize("seqlen_q,seqlen_k", [(512, 512), (1, 8192)], ids=["prefill", "decode"])
def test_cuda_graph_capture_and_replay(variant, seqlen_q, seqlen_k):
    """Captured once, replayed on new inputs; decoding captures the split launch and the merge
    that follows it."""
    shape = (2, 8, 2, seqlen_q, seqlen_k, 128, torch.bfloat16)
    q, k, v = make_qkv(*shape, seed=1)
    fmha.attention(q, k, v, causal=True, causal_align="bottom_right", variant=variant)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", variant=variant)
    for seed in (2, 3):  # new inputs copied into the captured buffers
        q2, k2, v2 = make_qkv(*shape, seed=seed)
        q.copy_(q2), k.copy_(k2), v.copy_(v2)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_against_reference(out, q2, k2, v2, True, "bottom_right")


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
    got = compiled(q, k, v)
    torch.testing.assert_close(got, block(q, k, v), atol=2e-2, rtol=2e-2)
    ref = torch.from_numpy(reference.dense_attention(q @ w, k, v, causal=True)).cuda() @ w.double()
    torch.testing.assert_close(got.double(), ref, atol=1e-1, rtol=5e-2)


@pytest.mark.parametrize("seqlen_q,seqlen_k", [(2048, 2048), (1, 8192)], ids=["balanced-prefill", "split-decode"])
def test_reduce_overhead_compile_keeps_nothing_in_the_graphs_pool(seqlen_q, seqlen_k):
    """``torch.compile(mode="reduce-overhead")``: cudagraph trees warm up and record in the graphs' own memory pool
    and refuse a live block there that no graph owns.  A call met first there keeps nothing: a balanced causal
    schedule (D=64 causal, more items than SMs) is not built and kept, a split decode's workspace and counters not
    held; the three calls (warm-up, recording, replay) match float64, the shape never run eagerly before."""
    torch._dynamo.reset()
    q, k, v = make_qkv(1, 16, 4, seqlen_q, seqlen_k, 64, torch.bfloat16, layout="bshd", seed=seqlen_q)
    causal = seqlen_q > 1
    step = torch.compile(lambda q, k, v: fmha.attention(q, k, v, causal=causal, layout="bshd") * 1.0,
                         mode="reduce-overhead")
    outs = [step(q, k, v).clone() for _ in range(3)]
    torch.cuda.synchronize()
    check_against_reference(outs[0], q, k, v, causal, layout="bshd")
    assert all(torch.equal(o, outs[0]) for o in outs[1:])
    torch._dynamo.reset()


def test_reduce_overhead_compile_trains_with_nothing_kept_in_the_graphs_pool():
    """The backward under ``torch.compile(mode="reduce-overhead")``: two attention calls of one kind in a step, so
    a warm-up's second backward replays the first's launches; the backward op holds nothing past its call
    (:func:`fmha.replay.transient`, as the forward op), and three steps' gradients match eager autograd's."""
    torch._dynamo.reset()
    q, k, v = make_qkv(1, 8, 2, 1024, 1024, 128, torch.bfloat16, layout="bshd", seed=5)

    def step(q, k, v):
        o = fmha.attention(q, k, v, causal=True, layout="bshd")
        return fmha.attention(o, k, v, causal=True, layout="bshd").float().square().sum()

    def grads(fn):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        fn(*leaves).backward()
        return [t.grad.clone() for t in leaves]
    compiled = torch.compile(step, mode="reduce-overhead")
    got = [grads(compiled) for _ in range(3)]
    want = grads(step)
    torch.cuda.synchronize()
    for g in got:
        for a, b in zip(g, want):
            assert b.abs().max() > 0 and (a.float() - b.float()).abs().max() <= 2e-2 * b.float().abs().max()
    torch._dynamo.reset()


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


def _replay_cases():
    """Calls of each path ``auto`` takes on a GPU: (inputs from a seed, the call on them)."""
    def dense(sizes=(300, 700, 128), **kw):
        return (lambda seed: make_qkv(2, 8, 2, *sizes, torch.bfloat16, seed=seed),
                lambda qkv: fmha.attention(*qkv, **kw))

    def varlen_inputs(seed):
        q, cu_q = packed([300, 129], 8, 128, torch.bfloat16, seed)
        k, cu_k = packed([500, 129], 2, 128, torch.bfloat16, seed + 1)
        v, _ = packed([500, 129], 2, 128, torch.bfloat16, seed + 2)
        return q, k, v, cu_q, cu_k, 300, 500

    def self_inputs(seed):  # self-attention: one cu_seqlens for q and k
        q, cu = packed([300, 129], 8, 128, torch.bfloat16, seed)
        k, _ = packed([300, 129], 2, 128, torch.bfloat16, seed + 1)
        v, _ = packed([300, 129], 2, 128, torch.bfloat16, seed + 2)
        return q, k, v, cu, 300

    def paged(seqlen_q):
        def inputs(seed):
            g = torch.Generator(device="cuda").manual_seed(seed)
            kc, vc = (torch.randn(12, 256, 2, 128, generator=g, device="cuda", dtype=torch.bfloat16) for _ in "kv")
            table = torch.randperm(12, generator=g, device="cuda").to(torch.int32).view(3, 4)
            lens = torch.tensor([1000, 300, 1024], dtype=torch.int32, device="cuda")
            q = torch.randn(3, 8, seqlen_q, 128, generator=g, device="cuda", dtype=torch.bfloat16)
            return q, kc, vc, table, lens
        return inputs, lambda a: fmha.attention_paged(*a, causal=True)
    return {"prefill": dense(causal=True), "prefill-lse": dense(return_lse=True),
            "decode-split": dense(sizes=(1, 8192, 128)), "tiled-d96": dense(sizes=(200, 300, 96), causal=True),
            "window": dense(causal=True, window=(64, 0), softcap=20.0),
            "varlen": (varlen_inputs, lambda a: fmha.attention_varlen(*a, causal=True, return_lse=True)),
            "varlen-tiled": (varlen_inputs, lambda a: fmha.attention_varlen(*a, causal=True, variant="tiled")),
            "varlen-self": (self_inputs, lambda a: fmha.attention_varlen(*a[:4], a[3], a[4], a[4], causal=True)),
            "paged-decode": paged(1), "paged-prefill": paged(256)}


@pytest.mark.parametrize("case", list(_replay_cases()))
def test_later_calls_replay_the_first(case):
    """The second and third calls of a kind replay the first one's launches (the planner is not called
    again) over their own tensors, into new outputs, and give what the ordinary path gives; a
    replayed call makes no host-device synchronization (packed sequences on ``hopper`` included: their work
    list is built on the device)."""
    from fmha import plan, replay
    make, call = _replay_cases()[case]
    inputs = [make(seed) for seed in range(3)]
    torch.cuda.synchronize()
    replay.clear()
    first = call(inputs[0])
    plans = []
    real = plan.plan
    plan.plan = lambda *a, **kw: plans.append(1) or real(*a, **kw)
    try:
        torch.cuda.set_sync_debug_mode("error")
        again = [call(inputs[1]), call(inputs[2])]
    finally:
        torch.cuda.set_sync_debug_mode("default")
        plan.plan = real
    assert not plans
    replay.clear()
    fresh = [call(inputs[1]), call(inputs[2])]
    as_list = lambda x: list(x) if isinstance(x, tuple) else [x]  # noqa: E731
    for a, b in zip(again, fresh):
        for x, y in zip(as_list(a), as_list(b)):
            assert torch.equal(x, y)
    assert as_list(again[0])[0].data_ptr() != as_list(again[1])[0].data_ptr()
    assert not torch.equal(as_list(first)[0], as_list(again[0])[0])


@pytest.mark.parametrize("layout,seqlen_q,return_lse", [("bhsd", 1, False), ("bshd", 512, True)],
                         ids=["decode", "prefill-lse"])
def test_a_plain_call_met_before_replays_before_anything_else(layout, seqlen_q, return_lse, monkeypatch):
    """The second call of a plain kind (no out, ALiBi, seqused_k, float8 factors, mask or dropout) is replayed from
    the entry point (:func:`fmha.forward.replayed_dense`), the ordinary entry not reached, and gives the bits a fresh
    recording gives; float8 K, whose ordinary entry adds its factors' table to the call, is not taken for it."""
    from fmha import forward, replay
    q, k, v = make_qkv(2, 8, 2, seqlen_q, 700, 64, torch.bfloat16, layout, seed=seqlen_q)
    again = [t + 1 for t in (q, k, v)]
    replay.clear()
    fmha.attention(q, k, v, causal=True, layout=layout, return_lse=return_lse)
    ordinary = forward.dense
    monkeypatch.setattr(forward, "dense", lambda *a, **kw: pytest.fail("the ordinary entry"))
    got = fmha.attention(*again, causal=True, layout=layout, return_lse=return_lse)
    monkeypatch.setattr(forward, "dense", ordinary)
    replay.clear()
    want = fmha.attention(*again, causal=True, layout=layout, return_lse=return_lse)
    for x, y in zip(got if return_lse else [got], want if return_lse else [want]):
        assert torch.equal(x, y)
    k8, v8 = (t.to(torch.float8_e4m3fn) for t in (k, v))
    first = fmha.attention(q, k8, v8, causal=True, layout=layout)
    entered = []
    monkeypatch.setattr(forward, "dense", lambda *a, **kw: entered.append(1) or ordinary(*a, **kw))
    assert torch.equal(fmha.attention(q, k8, v8, causal=True, layout=layout), first) and entered


def test_a_packed_call_met_before_replays_before_anything_else(monkeypatch):
    """attention_varlen's second call of a kind is replayed from the entry point (:func:`fmha.forward.replayed_packed`),
    the ordinary entry not reached, and gives the bits a fresh recording gives."""
    from fmha import forward, replay
    lens = [130, 1, 517, 64]
    q, cu = packed(lens, 8, 128, torch.bfloat16, 0)
    k, _ = packed(lens, 2, 128, torch.bfloat16, 1)
    v, _ = packed(lens, 2, 128, torch.bfloat16, 2)
    again = [t + 1 for t in (q, k, v)]
    replay.clear()
    fmha.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    ordinary = forward.packed
    monkeypatch.setattr(forward, "packed", lambda *a, **kw: pytest.fail("the ordinary entry"))
    got = fmha.attention_varlen(*again, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    monkeypatch.setattr(forward, "packed", ordinary)
    replay.clear()
    want = fmha.attention_varlen(*again, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("sizes,grown,causal", [((1, 8192, 128), (1, 8704, 128), False),
                                                ((1, 1024, 64), (1, 1040, 64), False),
                                                ((1024, 1024, 128), (1536, 1536, 128), False),
                                                ((256, 700, 96), (256, 1212, 96), True)],
                         ids=["decode", "decode-short", "prefill", "prefill-d96"])
def test_a_new_kind_launches_what_triton_compiled(sizes, grown, causal, monkeypatch):
    """A call of a new kind (a longer cache, a longer prompt) whose launches specialize as an earlier call's
    did goes to the kernels Triton compiled for that call without its JIT (:func:`fmha.replay._dispatch`), and
    gives the bits the ordinary path gives.  (Two earlier lengths: a decode's cache met at a second length grows,
    and is read by pointer from then on, :func:`fmha.replay.growing`.)"""
    from triton.runtime.jit import JITFunction
    from fmha import replay
    replay.clear()
    kw = dict(causal=causal, causal_align="bottom_right")
    for more in (0, 16):
        fmha.attention(*make_qkv(2, 8, 2, sizes[0], sizes[1] + more, sizes[2], torch.bfloat16, seed=0), **kw)
    jit = []
    real = JITFunction.run
    monkeypatch.setattr(JITFunction, "run", lambda self, *a, **k: jit.append(self.fn.__name__) or real(self, *a, **k))
    qkv = make_qkv(2, 8, 2, *grown, torch.bfloat16, seed=1)
    fast = fmha.attention(*qkv, **kw)
    assert not {"tiled_kernel", "hopper_kernel"} & set(jit), jit
    monkeypatch.setattr(JITFunction, "run", real)
    replay.clear()
    assert torch.equal(fast, fmha.attention(*qkv, **kw))
    check_against_reference(fast, *qkv, kw["causal"], "bottom_right")


@pytest.mark.parametrize("case", [(1, 32, 8, 1, 64, "bhsd", False, 1000), (2, 8, 2, 4, 128, "bshd", True, 3000),
                                  (1, 28, 4, 1, 128, "bhsd", True, 8180)], ids=["llama", "bshd-causal", "past-8k"])
def test_a_growing_cache_replays_from_its_family(case, monkeypatch):
    """Decoding against a cache one key longer at each call (generate()'s first layer): once its family has
    learned its lines (:func:`fmha.replay.lengthwise`) most lengths replay from them, launching nothing through
    the ordinary path, and every length gives the bits the ordinary path gives, across lengths divisible by 16
    and not, and a change of config (8k keys)."""
    from fmha import replay
    b, h, kvh, sq, d, layout, causal, start = case
    kw = dict(causal=causal, causal_align="bottom_right", layout=layout)
    lengths = range(start, start + 40)
    calls = [make_qkv(b, h, kvh, sq, n, d, torch.bfloat16, layout, seed=n) for n in lengths]
    replay.clear()
    launched = []
    real = replay.launch
    monkeypatch.setattr(replay, "launch", lambda *a, **kw: launched.append(1) or real(*a, **kw))
    grown = []
    for qkv in calls:
        before = len(launched)
        grown.append(fmha.attention(*qkv, **kw))
        launched.append(len(launched) == before)  # (True: replayed from the family)
    assert sum(x is True for x in launched) >= 20, launched
    monkeypatch.setattr(replay, "lengthwise", lambda *a: None)
    for qkv, o in zip(calls, grown):
        replay.clear()
        assert torch.equal(o, fmha.attention(*qkv, **kw))
    check_against_reference(grown[-1], *calls[-1], causal, "bottom_right", layout=layout)


@pytest.mark.parametrize("shape", [(2, 8, 2, 1000, 1000, 128), (1, 4, 4, 777, 1500, 64), (1, 2, 1, 300, 300, 256),
                                   (2, 4, 2, 513, 513, 96)], ids=lambda s: "b{}h{}kv{}-q{}k{}-d{}".format(*s))
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "bottom_right")])
def test_gradients_at_gpu_sizes(causal, align, shape):
    from fmha.verify import check_grads
    q, k, v = (t.requires_grad_(True) for t in make_qkv(*shape, torch.bfloat16, seed=shape[3]))
    o = fmha.attention(q, k, v, causal=causal, causal_align=align)
    do = torch.randn_like(o)
    o.backward(do)
    check_grads((q.grad, k.grad, v.grad), q, k, v, do, causal, align)
