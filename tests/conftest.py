"""Test setup: the CPU interpreter unless a GPU is present, inputs, and the error yardstick
(:mod:`fmha.verify`: at most twice PyTorch's own error at the input precision, plus one unit
in the last place, both against the float64 reference)."""
import os
import zlib

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from fmha.verify import (check as check_against_reference, check_lse, max_err, of_rows, to_bhsd,  # noqa: E402,F401
                         torch_lowp)

# property tests draw the same examples on every run (CI's verdict reproducible);
# HYPOTHESIS_PROFILE=explore draws new ones, as many as asked with --hypothesis-seed
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

ON_GPU = os.environ.get("TRITON_INTERPRET", "0") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"


def pytest_addoption(parser):
    parser.addoption("--shard", default=None, metavar="I/N",
                     help="run only the I-th of N parts of the collected tests (each test's part fixed by its id), "
                          "so a suite longer than one GPU call runs in N calls")


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (runs the compiled kernels, larger sizes)")


def in_shard(nodeid: str, shard: str) -> bool:
    """Whether test ``nodeid`` falls in part ``"I/N"`` (1 <= I <= N): by a CRC of its id, the same on every
    machine and run, each test in exactly one part."""
    i, n = (int(x) for x in shard.split("/"))
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--shard {shard}: I must run from 1 to N")
    return zlib.crc32(nodeid.encode()) % n == i - 1


def pytest_collection_modifyitems(config, items):
    shard = config.getoption("--shard")
    if shard:
        mine = [in_shard(item.nodeid, shard) for item in items]
        config.hook.pytest_deselected(items=[item for item, m in zip(items, mine) if not m])
        items[:] = [item for item, m in zip(items, mine) if m]
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


def poison_past(k, v, used, layout):
    """NaN in every key and value past batch b's first ``used[b]`` (a list): rows a kernel must never read."""
    seq = 1 if layout == "bhsd" else 0
    with torch.no_grad():
        for b, n in enumerate(used):
            for t in (k, v):
                t.select(0, b).narrow(seq, n, t.shape[seq + 1] - n).fill_(float("nan"))


def drawn_inputs(p):
    """q, k, v, the modifiers (attention sinks among them) and the keys used per batch of a
    hypothesis-drawn problem ``p`` (keys past those used hold NaN when ``p["seqused"]``)."""
    q, k, v = make_qkv(p["batch"], p["heads"], p["kv_heads"], p["seqlen_q"], p["seqlen_k"], p["head_dim"],
                       p["dtype"], p["layout"], p["contiguous"], seed=p["seed"])
    g = torch.Generator().manual_seed(p["seed"])
    mods = dict(window=p["window"], softcap=p["softcap"],
                alibi_slopes=torch.rand(p["heads"], generator=g).to(DEVICE) if p["alibi"] else None,
                sinks=(3 * torch.randn(p["heads"], generator=g)).to(DEVICE) if p.get("sinks") else None)
    used = torch.randint(0, p["seqlen_k"] + 1, (p["batch"],), generator=g, dtype=torch.int32) if p["seqused"] \
        else torch.full((p["batch"],), p["seqlen_k"], dtype=torch.int32)
    poison_past(k, v, used.tolist(), p["layout"])
    return q, k, v, mods, used


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
        check_against_reference(*seq, causal, causal_align, lse=lse[None, :, qs], **of_rows(mods, slice(b, b + 1)))


def replays_as_it_ran(inputs, grads, exact_dq, monkeypatch, recorded=True):
    """A backward's later calls of a kind against the ordinary path (:mod:`fmha.replay`): ``grads(inputs[i],
    i)`` for the second and third of ``inputs`` (the first call records), with nothing asking which kernel runs
    when the kind is ``recorded`` (and each call asking when it is not), no host-device synchronization, new
    gradients each call, and the same gradients as those calls run with no recipe: bit for bit, dQ too when
    ``exact_dq`` (its adds in one order).  Returns the replayed calls' ``(gradients, tensors)``."""
    from fmha import backward, replay
    torch.cuda.synchronize()
    replay.clear()
    grads(inputs[0], 0)
    asked, real = [], backward.kernel
    monkeypatch.setattr(backward, "kernel", lambda *a: asked.append(1) or real(*a))
    torch.cuda.set_sync_debug_mode("error")
    try:
        again = [grads(inputs[1], 1), grads(inputs[2], 2)]
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(asked) == (0 if recorded else 2)
    monkeypatch.setattr(backward, "kernel", real)
    replay.clear()
    fresh = [grads(inputs[1], 1), grads(inputs[2], 2)]
    for (a, _), (b, _) in zip(again, fresh):
        for i, (x, y) in enumerate(zip(a, b)):
            if i > 0 or exact_dq:
                assert torch.equal(x, y), "dq dk dv".split()[i]
    assert again[0][0][0].data_ptr() != again[1][0][0].data_ptr()
    return again
