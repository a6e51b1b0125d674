"""Every variant against the float64 reference (through the interpreter on a CPU).

Outputs are poisoned with NaN before each run; the error must stay within twice
PyTorch's own error at the input precision (see conftest).  Cases cover, for
every variant: lengths 1, 15, 16, 17, 113 (below, at and past the 16-key tile
of the seed kernels, and a prime past several tiles), mismatched seqlen_q and
seqlen_k both ways, both causal alignments, GQA and MQA, float16 and bfloat16,
every head_dim (96 exercises the masked non-power-of-two columns), both
layouts, and non-contiguous strided views.
"""
from dataclasses import dataclass

import pytest
import torch

import fmha
from fmha import configs
from fmha.kernels import VARIANTS
from conftest import check_against_reference, make_qkv, nan_like

F16, BF16 = torch.float16, torch.bfloat16


@dataclass(frozen=True)
class Case:
    sq: int
    sk: int
    d: int = 64
    causal: bool = False
    align: str = "top_left"
    dtype: torch.dtype = F16
    heads: int = 2
    kv_heads: int = 2
    batch: int = 1
    layout: str = "bhsd"
    contiguous: bool = True

    def __str__(self):
        c = f"causal-{self.align}" if self.causal else "full"
        return (f"b{self.batch}h{self.heads}kv{self.kv_heads}-q{self.sq}k{self.sk}-d{self.d}-{c}-"
                f"{str(self.dtype)[6:]}-{self.layout}{'' if self.contiguous else '-strided'}")


CASES = [
    # lengths around the 16-key tile, square
    *[Case(n, n) for n in (1, 15, 16, 17)],
    Case(113, 113, causal=True),
    Case(113, 113, dtype=BF16),
    # mismatched lengths, both alignments (bottom-right with sq > sk leaves rows with no key)
    Case(1, 113), Case(113, 1, dtype=BF16),
    Case(15, 40, causal=True, align="top_left"), Case(15, 40, causal=True, align="bottom_right"),
    Case(40, 15, causal=True, align="top_left", dtype=BF16),
    Case(40, 15, causal=True, align="bottom_right", dtype=BF16),
    Case(1, 33, causal=True, align="bottom_right"), Case(33, 1, causal=True, align="bottom_right"),
    # GQA and MQA, batch > 1
    Case(17, 33, heads=4, kv_heads=2, batch=2, causal=True),
    Case(33, 17, heads=6, kv_heads=1, dtype=BF16, causal=True, align="bottom_right"),
    # layouts and strides
    Case(17, 40, layout="bshd", heads=4, kv_heads=2, causal=True),
    Case(40, 17, layout="bshd", dtype=BF16),
    Case(17, 33, contiguous=False, causal=True),
    Case(33, 20, layout="bshd", contiguous=False, dtype=BF16, heads=4, kv_heads=1),
    # every head_dim, both dtypes
    *[Case(17, 37, d=d, causal=True, dtype=dt) for d in (32, 64, 96, 128, 256) for dt in (F16, BF16)],
    Case(40, 29, d=96, layout="bshd", contiguous=False, causal=True, align="bottom_right"),
]


def run_case(variant, c: Case, seed=0, **kw):
    q, k, v = make_qkv(c.batch, c.heads, c.kv_heads, c.sq, c.sk, c.d, c.dtype, c.layout,
                       c.contiguous, seed=seed)
    out = nan_like(q)
    o = fmha.attention(q, k, v, causal=c.causal, causal_align=c.align, layout=c.layout,
                       variant=variant, out=out, **kw)
    assert o is out
    return check_against_reference(o, q, k, v, c.causal, c.align, c.layout, kw.get("scale"))


@pytest.mark.parametrize("case", CASES, ids=str)
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_matches_reference(variant, case):
    run_case(variant, case)


@pytest.mark.parametrize("variant", ["auto", *VARIANTS])
def test_custom_scale(variant):
    run_case(variant, Case(17, 40, causal=True, dtype=BF16), scale=0.3)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_lse_matches_reference(variant):
    import numpy as np
    from fmha import reference
    q, k, v = make_qkv(1, 2, 1, 40, 15, 64, F16)
    o, lse = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", variant=variant,
                            return_lse=True)
    _, ref = reference.dense_attention(q, k, v, causal=True, causal_align="bottom_right", return_lse=True)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == ref.shape
    lse = lse.cpu().double().numpy()
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(ref))  # rows 0..24 see no key
    fin = np.isfinite(ref)
    np.testing.assert_allclose(lse[fin], ref[fin], atol=2e-3, rtol=1e-3)
    assert (o[:, :, :25] == 0).all()


@pytest.mark.parametrize("d", [64, 96, 128, 192, 256])
def test_tiled_amd_build_reads_v_without_masked_loads(monkeypatch, d):
    """An AMD build's V tiles (``tiled._v_rows_clamped``, ``tiled._v_columns``), run by the interpreter with the AMD
    table's tiles at each head dim: a masked tile's rows read clamped to the sequence's last key and zeroed past it,
    and a head dim padded to its tile (96, 192) reads its last columns again instead of masking them.  K and V are the
    first 45 rows of 64-row buffers whose other rows hold NaN, and batch 1 uses 30 keys (seqused_k) of them: rows past
    either end taken into P V as they lie (neither clamped nor zeroed) would bring NaN into every row of the last tile.
    Then a decode split three ways over the keys and merged, GQA-packed, on the AMD decode table's tiles."""
    from fmha import kernels
    monkeypatch.setattr(kernels, "amd_build", lambda q: True)
    q, k, v = make_qkv(2, 2, 1, 45, 64, d, BF16, seed=d)
    lens = torch.tensor([45, 30], dtype=torch.int32, device=q.device)
    k[:, :, 45:], v[:, :, 45:], k[1, :, 30:], v[1, :, 30:] = (float("nan"),) * 4
    out = nan_like(q)
    fmha.attention(q, k[:, :, :45], v[:, :, :45], causal=True, variant="tiled", config=configs.tiled_config("hip", d),
                   out=out, causal_align="bottom_right", seqused_k=lens)
    for b, n in enumerate(lens.tolist()):
        check_against_reference(out[b:b + 1], q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], True, "bottom_right")
    assert not out.isnan().any()
    q, k, v = make_qkv(1, 8, 2, 1, 300, d, BF16, seed=d + 1)
    o = fmha.attention(q, k, v, variant="tiled", config=configs.decode_config(4, 300, d, "hip"), num_splits=3)
    check_against_reference(o, q, k, v, False)


@pytest.mark.parametrize("max_d,cfg", [(d, cfg) for arch, d, cfg in configs.TILED if arch == "hip"], ids=str)
def test_tiled_amd_rows_match_reference(max_d, cfg):
    """Each of ``tiled``'s AMD rows (chosen by their builds, :data:`fmha.configs.TILED`), run by the interpreter
    at its largest head dim: its tile shapes walk ragged ends and the causal band right."""
    run_case("tiled", Case(37, 45, d=max_d, causal=True, align="bottom_right", dtype=BF16, heads=2, kv_heads=1),
             config=cfg)


@pytest.mark.parametrize("max_d,cfg", configs.TILED_HIP_MODIFIED, ids=str)
def test_tiled_amd_rows_beside_the_modifiers_match_reference(max_d, cfg):
    """The AMD rows taken beside a window, softcap or ALiBi (:data:`fmha.configs.TILED_HIP_MODIFIED`), run by the
    interpreter with all three at its largest head dim, against float64."""
    q, k, v = make_qkv(1, 2, 1, 37, 45, max_d, BF16, seed=max_d)
    mods = dict(window=(20, 0), softcap=5.0, alibi_slopes=torch.tensor([0.1, 0.3], device=q.device))
    out = nan_like(q)
    fmha.attention(q, k, v, causal=True, causal_align="bottom_right", variant="tiled", config=cfg, out=out, **mods)
    check_against_reference(out, q, k, v, True, "bottom_right", **mods)


@pytest.mark.parametrize("d", [80, 96, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_pipelined_amd_build_splits_q_k_over_the_head_dim(monkeypatch, d, causal):
    """The pipelined kernel as an AMD build runs it past head_dim 64 (``pipelined._qk``: Q K^T as two products over
    the head dimension's halves, the second half of K loaded for the second), run by the interpreter with a window,
    softcap and ALiBi at once, lengths off the 16-key tile, head dims whose second half is partly padding (80, 96);
    output and LSE against float64."""
    from fmha import kernels
    monkeypatch.setattr(kernels, "amd_build", lambda q: True)
    q, k, v = make_qkv(1, 2, 1, 37, 45, d, F16, seed=d + causal)
    mods = dict(window=(20, 3), softcap=5.0, alibi_slopes=torch.tensor([0.1, 0.3], device=q.device))
    out = nan_like(q)
    _, lse = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", variant="pipelined", out=out,
                            return_lse=True, **mods)
    check_against_reference(out, q, k, v, causal, "bottom_right", lse=lse, **mods)
