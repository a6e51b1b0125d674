"""Test setup: the CPU interpreter unless a GPU is present, and the error yardstick.

Every check compares against the float64 reference and passes when the kernel's
error is at most twice PyTorch's own error computing the same thing at the input
precision (plus a small absolute term), both measured against float64.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from fmha import reference  # noqa: E402

# property tests draw the same examples on every run (CI's verdict reproducible);
# HYPOTHESIS_PROFILE=explore draws new ones, as many as asked with --hypothesis-seed
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ON_GPU = os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
# one unit in the last place at |o| = 1: the store to the input dtype alone can cost
# that on rows where the kernel and PyTorch round P differently
ATOL = {torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (runs the compiled kernels, larger sizes)")


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU with the interpreter off")
    for item in items:
        if "gpu" in item.keywords and not ON_GPU:
            item.add_marker(skip_gpu)


def make_qkv(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, dtype, layout="bhsd",
             contiguous=True, device=DEVICE, seed=0):
    """Random normal q, k, v in ``layout``; non-contiguous ones are strided views of larger buffers."""
    g = torch.Generator().manual_seed(seed)

    def one(h, s):
        shape = (batch, h, s, head_dim) if layout == "bhsd" else (batch, s, h, head_dim)
        if contiguous:
            return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).to(device)
        # every other row of a buffer twice as long, with a wider last dim: strides nothing assumes
        big = list(shape)
        big[2 if layout == "bhsd" else 1] *= 2
        big[3] += 8
        buf = torch.randn(big, generator=g, dtype=torch.float32).to(dtype).to(device)
        return buf[:, :, ::2, :head_dim] if layout == "bhsd" else buf[:, ::2, :, :head_dim]

    return one(heads, seqlen_q), one(kv_heads, seqlen_k), one(kv_heads, seqlen_k)


def to_bhsd(t, layout):
    return t if layout == "bhsd" else t.transpose(1, 2)


def torch_lowp(q, k, v, causal, causal_align, scale=None, window=(-1, -1), softcap=0.0, alibi_slopes=None):
    """The same attention in PyTorch at the input precision (scores and P V in q.dtype,
    softmax and the modifiers in float32): the yardstick for the kernel's error."""
    dt = q.dtype
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scale = 1.0 / q.shape[-1] ** 0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)).float() * scale
    s = torch.from_numpy(reference.score_mods(s.cpu().double().numpy(), q.shape[2], k.shape[2], causal_align, softcap,
                                              alibi_slopes)).float().to(q.device)
    mask = torch.from_numpy(reference.visible(q.shape[2], k.shape[2], causal, causal_align, window)).to(q.device)
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0).to(dt)
    return (p @ v).double().cpu().numpy()


def max_err(a, b):
    return float(np.max(np.abs(np.asarray(a, dtype=np.float64) - b), initial=0.0))


def check_against_reference(o, q, k, v, causal, causal_align="top_left", layout="bhsd", scale=None, lse=None,
                            **mods):
    """Assert ``o`` (in ``layout``) is finite and within 2x PyTorch's low-precision error
    (``mods``: window, softcap, alibi_slopes, as the kernel got them); and ``lse`` (natural log,
    ``[batch, heads, seqlen_q]``), when given, equal to the reference's: ``-inf`` on the same rows,
    within 2e-3 elsewhere."""
    q, k, v, o = (to_bhsd(t, layout) for t in (q, k, v, o))
    o = o.detach().cpu().double().numpy()
    assert np.isfinite(o).all(), "output has NaN/inf (unwritten element or broken guard)"
    ref, ref_lse = reference.dense_attention(q, k, v, causal=causal, causal_align=causal_align, scale=scale,
                                             return_lse=True, **mods)
    err = max_err(o, ref)
    base = max_err(torch_lowp(q, k, v, causal, causal_align, scale, **mods), ref)
    ulp = ATOL[q.dtype] * max(1.0, float(np.abs(ref).max(initial=0.0)))  # one unit in the last place at |o|
    assert err <= 2 * base + ulp, f"error {err:.3g} > 2 x torch's {base:.3g} + {ulp:.3g}"
    if lse is not None:
        check_lse(lse, ref_lse)
    return err, base


def check_lse(lse, ref_lse, atol=2e-3):
    """``lse`` (a tensor) against the reference's: ``-inf`` exactly where it is, close elsewhere."""
    got = lse.detach().cpu().double().numpy()
    assert got.shape == ref_lse.shape, (got.shape, ref_lse.shape)
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(ref_lse))
    fin = np.isfinite(ref_lse)
    np.testing.assert_allclose(got[fin], ref_lse[fin], atol=atol, rtol=1e-3)


def nan_like(q):
    return torch.full_like(q, float("nan"))


def packed(lens, heads, d, dtype, seed):
    """Random normal rows of packed sequences of ``lens`` rows, ``[total, heads, d]``, and their
    int32 ``cu_seqlens``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(sum(lens), heads, d, generator=g).to(dtype).to(DEVICE)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device=DEVICE)
    return x, cu


def check_varlen(o, lse, q, k, v, cu_q, cu_k, skip=(), causal=False, causal_align="top_left", **mods):
    """Each packed sequence of ``o`` (and of ``lse``, ``[heads, total_q]``) against the float64
    reference of that sequence alone, by :func:`check_against_reference`'s rule (``mods``: its
    modifiers); sequences in ``skip`` are not checked."""
    assert lse.shape == (q.shape[1], q.shape[0])
    for b in range(len(cu_q) - 1):
        qs, ks = slice(int(cu_q[b]), int(cu_q[b + 1])), slice(int(cu_k[b]), int(cu_k[b + 1]))
        if qs.start == qs.stop or b in skip:
            continue
        seq = [t[s].transpose(0, 1)[None] for t, s in ((o, qs), (q, qs), (k, ks), (v, ks))]
        check_against_reference(*seq, causal, causal_align, lse=lse[None, :, qs], **mods)
