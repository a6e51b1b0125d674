"""Grids past CUDA's 65535 programs on axis 1 (a kernel's batch * heads): :func:`fmha.replay.launch` splits them
over launches of at most :data:`fmha.replay.GRID_STEP` programs, each told its first (``BH_BASE``).  The splitting
itself on a stand-in kernel; then every Triton kernel with a second grid axis, forward and backward, with the step
set to a few programs so that the interpreter's small problems take several launches, against float64."""
import pytest
import torch

import fmha
from conftest import DEVICE, check_against_reference, check_varlen, make_qkv, nan_like, packed
from fmha import replay
from fmha.verify import check_grads, check_mask_grad


class _StandIn:
    """A kernel that records each launch's grid and ``BH_BASE`` instead of running."""

    def __init__(self):
        self.launches = []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launches.append((grid, kwargs.get("BH_BASE", 0)))


def test_a_long_second_axis_goes_as_launches_of_at_most_the_step(monkeypatch):
    """Also with compiled launches kept, as a GPU process has them once any kernel ran: a kernel that is no
    Triton JIT function goes to its own launch, never to the compiled-launch lookup."""
    monkeypatch.setattr(replay, "_remember", lambda *a: None)
    monkeypatch.setitem(replay._COMPILED, ("another kernel",), [])
    kernel = _StandIn()
    replay.launch(kernel, (2, 131073, 3), 1, x=2)
    assert kernel.launches == [((2, 65520, 3), 0), ((2, 65520, 3), 65520), ((2, 33, 3), 131040)]
    kernel.launches.clear()
    replay.launch(kernel, (7, 65520), 1)
    replay.launch(kernel, (70000,), 1)
    assert kernel.launches == [((7, 65520), 0), ((70000,), 0)]


@pytest.fixture
def step(monkeypatch):
    """Three (batch, head) programs a launch: every call below spans several."""
    monkeypatch.setattr(replay, "GRID_STEP", 3)
    replay.clear()
    yield
    replay.clear()


@pytest.mark.parametrize("variant", ["tiled", "singlewave", "pipelined"])
@pytest.mark.parametrize("splits", [1, 3])
def test_the_forward_over_several_launches(step, variant, splits):
    q, k, v = make_qkv(3, 4, 2, 21, 50, 64, torch.bfloat16, layout="bshd", seed=1)
    alibi = torch.rand(3, 4, generator=torch.Generator().manual_seed(2)).to(DEVICE) if variant == "tiled" else None
    out = nan_like(q)
    o, lse = fmha.attention(q, k, v, causal=True, layout="bshd", variant=variant, num_splits=splits,
                            alibi_slopes=alibi, return_lse=True, out=out)
    check_against_reference(out, q, k, v, True, layout="bshd", lse=lse, alibi_slopes=alibi)


@pytest.mark.parametrize("merged", [True, False])
def test_decoding_over_several_launches(step, monkeypatch, merged):
    """One query row a sequence, GQA rows packed (batch * KV heads programs), keys split and merged inside the split
    launch (a launch's tickets back at 0 when it ends, for the next) or by the merge kernel."""
    from fmha import forward
    monkeypatch.setattr(forward, "merge_in_split", lambda device: merged)
    q, k, v = make_qkv(5, 8, 2, 1, 300, 64, torch.float16, seed=3)
    seqused = torch.tensor([300, 17, 0, 255, 128], dtype=torch.int32, device=DEVICE)
    o, lse = fmha.attention(q, k, v, num_splits=4, seqused_k=seqused, return_lse=True)
    for b, n in enumerate(seqused.tolist()):
        check_against_reference(o[b:b + 1], q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], False,
                                lse=lse[b:b + 1])


def test_packed_and_paged_calls_over_several_launches(step):
    lens = [9, 30, 1, 17]
    (q, cu), (k, _) = packed(lens, 4, 64, torch.bfloat16, 4), packed(lens, 2, 64, torch.bfloat16, 5)
    v = packed(lens, 2, 64, torch.bfloat16, 6)[0]
    o, lse = fmha.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, return_lse=True)
    check_varlen(o, lse, q, k, v, cu, cu, causal=True, causal_align="bottom_right")
    pages = torch.randn(12, 16, 2, 64, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16).to(DEVICE)
    table = torch.randperm(12, generator=torch.Generator().manual_seed(8)).to(torch.int32).to(DEVICE).view(3, 4)
    lengths = torch.tensor([64, 5, 40], dtype=torch.int32, device=DEVICE)
    qd = torch.randn(3, 2, 4, 64, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16).to(DEVICE)
    od = fmha.attention_paged(qd, pages, pages, table, lengths, causal=True)
    for b, n in enumerate(lengths.tolist()):
        keys = pages[table[b].long()].reshape(-1, 2, 64)[:n].transpose(0, 1)[None]
        check_against_reference(od[b:b + 1], qd[b:b + 1], keys, keys, True, "bottom_right")


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_backward_over_several_launches(step, deterministic):
    """delta, dK/dV, dQ (added atomically, or its own kernel) and the cast, each a kernel over (batch, head)s; and a
    bias's gradient, stored by the dQ kernel."""
    q, k, v = make_qkv(3, 4, 2, 19, 33, 64, torch.bfloat16, seed=10)
    bias = torch.randn(3, 1, 19, 33, generator=torch.Generator().manual_seed(11)).to(DEVICE)
    q, k, v, leaf = (t.detach().clone().requires_grad_(True) for t in (q, k, v, bias))
    o = fmha.attention(q, k, v, causal=True, attn_mask=leaf, deterministic=deterministic)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(12)).to(o)
    o.backward(do)
    check_grads((q.grad, k.grad, v.grad), q, k, v, do, True, attn_mask=bias.expand(3, 4, 19, 33))
    check_mask_grad(leaf.grad, q, k, v, do, True, attn_mask=bias)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["auto", "tiled"])
def test_a_grid_past_cudas_limit_on_a_gpu(variant):
    """2100 sequences of 32 heads: 67200 (batch, head) programs, past the 65535 CUDA takes on a grid's axis 1, for
    the forward (decoding rows, then a prefill's) and the backward's kernels, against float64 at the first
    sequences, across the two launches' seam (program 65520: sequence 2047, head 16) and at the last."""
    seams = (slice(0, 2), slice(2046, 2049), slice(2098, 2100))
    for sq in (3, 40):
        q, k, v = make_qkv(2100, 32, 32, sq, 40, 64, torch.bfloat16, layout="bshd", seed=sq)
        out = nan_like(q)
        o, lse = fmha.attention(q, k, v, causal=True, layout="bshd", variant=variant, return_lse=True, out=out)
        for b in seams:
            check_against_reference(out[b], q[b], k[b], v[b], True, layout="bshd", lse=lse[b])
    q, k, v = (t.detach().clone().requires_grad_(True) for t in make_qkv(2100, 32, 32, 8, 40, 64, torch.bfloat16,
                                                                         seed=5))
    o = fmha.attention(q, k, v, causal=True, variant=variant)
    do = torch.randn(o.shape, generator=torch.Generator().manual_seed(6)).to(o)
    o.backward(do)
    for b in seams:
        check_grads((q.grad[b], k.grad[b], v.grad[b]), q[b], k[b], v[b], do[b], True)
