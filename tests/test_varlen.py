"""Packed variable-length batches and per-batch key lengths against the float64 reference."""
import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import fmha
from conftest import DEVICE, check_varlen, max_err, packed
from fmha import reference
from fmha.kernels import VARIANTS, guards

F16, BF16 = torch.float16, torch.bfloat16


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("causal,align,window", [(False, "top_left", (-1, -1)), (True, "top_left", (-1, -1)),
                                                 (True, "bottom_right", (-1, -1)), (True, "bottom_right", (6, -1))])
def test_varlen_matches_per_sequence_reference(variant, causal, align, window):
    lens_q, lens_k = [5, 1, 37, 0, 20], [9, 30, 37, 4, 16]
    q, cu_q = packed(lens_q, 4, 64, BF16, 1)
    k, cu_k = packed(lens_k, 2, 64, BF16, 2)
    v, _ = packed(lens_k, 2, 64, BF16, 3)
    o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                   causal_align=align, variant=variant, window=window, return_lse=True)
    check_varlen(o, lse, q, k, v, cu_q, cu_k, causal=causal, causal_align=align, window=window)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_varlen_takes_alibi_slopes_per_sequence(variant):
    """``alibi_slopes`` ``[batch, heads]``: a row per packed sequence (FlashAttention's varlen form), each sequence
    against its own row."""
    lens_q, lens_k = [5, 1, 37, 0, 20], [9, 30, 37, 4, 16]
    q, cu_q = packed(lens_q, 4, 64, BF16, 4)
    k, cu_k = packed(lens_k, 2, 64, BF16, 5)
    v, _ = packed(lens_k, 2, 64, BF16, 6)
    slopes = torch.rand(5, 4, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True, variant=variant,
                                   alibi_slopes=slopes, return_lse=True)
    check_varlen(o, lse, q, k, v, cu_q, cu_k, causal=True, causal_align="bottom_right", alibi_slopes=slopes)
    with pytest.raises(ValueError, match=r"alibi_slopes must be a float32 tensor of shape \(4,\) or \(5, 4\)"):
        fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), alibi_slopes=slopes[:4])


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("causal,align", [(False, "top_left"), (True, "bottom_right")])
def test_seqused_k_is_key_padding(variant, causal, align):
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(3, 2, n, 32, generator=g).half().to(DEVICE) for n in (19, 40, 40))
    used = torch.tensor([40, 7, 23], dtype=torch.int32, device=DEVICE)
    k[1, :, 7:] = float("nan")  # padding is never read into the result
    o = fmha.attention(q, k, v, causal=causal, causal_align=align, variant=variant, seqused_k=used)
    for b, n in enumerate(used.tolist()):
        ref = reference.dense_attention(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n], causal=causal,
                                        causal_align=align)
        assert max_err(o[b:b + 1].cpu().double().numpy(), ref) < 4e-3


def test_varlen_errors():
    q, cu = packed([3, 4], 2, 32, F16, 0)
    if DEVICE == "cpu":  # on a GPU the device check's assert (test_bad_cu_seqlens_stop_the_gpu_stream)
        with pytest.raises(ValueError, match="must start at 0, never decrease and end at 7"):
            fmha.attention_varlen(q, q, q, cu.flip(0), cu, 4, 4)
        with pytest.raises(ValueError, match="max_seqlen for cu_seqlens_q is 3, but a sequence has 4 rows"):
            fmha.attention_varlen(q, q, q, cu, cu, 3, 4)
    with pytest.raises(ValueError, match="int32 tensor"):
        fmha.attention_varlen(q, q, q, cu.long(), cu.long(), 4, 4)
    with pytest.raises(ValueError, match="3-dimensional"):
        fmha.attention_varlen(q[None], q, q, cu, cu, 4, 4)
    with pytest.raises(ValueError, match="seqused_k must be an int32 tensor of shape"):
        fmha.attention(q[None], q[None], q[None], seqused_k=torch.ones(2, dtype=torch.int32, device=DEVICE))


def test_the_lengths_are_checked_on_the_device(monkeypatch):
    """No variant reads cu_seqlens on the host: they are checked on the device, in stream order
    (:mod:`fmha.kernels.guards`), and on the CPU the check's verdict comes back as a ``ValueError``."""
    q, cu = packed([3, 4], 2, 32, F16, 0)
    monkeypatch.setattr(torch.Tensor, "tolist", lambda *a: pytest.fail("the lengths were read on the host"))
    o = fmha.attention_varlen(q, q, q, cu, cu, 4, 4, variant="tiled")
    monkeypatch.undo()
    for b in range(2):
        seq = q[int(cu[b]):int(cu[b + 1])].transpose(0, 1)[None]
        ref = reference.dense_attention(seq, seq, seq)
        assert max_err(o[int(cu[b]):int(cu[b + 1])].transpose(0, 1)[None].cpu().double().numpy(), ref) < 4e-3
    if DEVICE == "cpu":  # the device check's verdict (on a GPU its assert: test_bad_cu_seqlens_stop_the_gpu_stream)
        with pytest.raises(ValueError, match="must start at 0, never decrease and end at 7"):
            fmha.attention_varlen(q, q, q, cu.flip(0), cu, 4, 4, variant="tiled")


@pytest.mark.parametrize("self_checked", [True, False])
def test_tiled_checks_its_own_cu_seqlens_in_one_launch(self_checked, monkeypatch):
    """Where ``tiled`` checks the cu_seqlens itself (:func:`fmha.forward.self_checked`; on a GPU its asserts, run
    by :func:`test_bad_cu_seqlens_stop_the_gpu_stream`) a packed call is one launch with the answer of the two;
    forced either way here, where the interpreter runs the checking kernel's code with its asserts skipped."""
    from fmha import replay
    from fmha.kernels import guards
    launched = []
    real = replay.launch
    monkeypatch.setattr(replay, "launch", lambda kernel, *a, **kw: (launched.append(kernel), real(kernel, *a, **kw)))
    monkeypatch.setattr(fmha.forward, "self_checked", lambda p, q: self_checked and p.variant == "tiled")
    replay.clear(compiled=False)  # (on a GPU a call of a kind seen before would replay its launches)
    lens_q, lens_k = [5, 0, 37, 20], [9, 4, 37, 16]
    q, cu_q = packed(lens_q, 4, 64, BF16, 1)
    k, cu_k = packed(lens_k, 2, 64, BF16, 2)
    v, _ = packed(lens_k, 2, 64, BF16, 3)
    o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                                   causal_align="bottom_right", variant="tiled", return_lse=True)
    assert launched == ([] if self_checked else [guards._check_cu_seqlens]) + [VARIANTS["tiled"]], launched
    check_varlen(o, lse, q, k, v, cu_q, cu_k, causal=True, causal_align="bottom_right")


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [128, 16])
@pytest.mark.parametrize("cu,max_q,says", [("[0, 4, 3]", 4, "cu_seqlens must start at 0, never decrease"),
                                           ("[0, 9, 7]", 9, "cu_seqlens must start at 0, never decrease"),
                                           ("[0, 3, 7]", 3, "a sequence is longer than its max_seqlen")])
def test_bad_cu_seqlens_stop_the_gpu_stream(cu, max_q, says, rows):
    """On the GPU the packed lengths are checked in stream order (no host read): a device-side assert
    naming the argument ends the process's CUDA context before the attention kernel reads.  In 16-row tiles
    ``tiled`` checks them itself (:func:`fmha.forward.self_checked`), in 128 the separate check before it."""
    import subprocess
    import sys
    script = f"""
import torch, fmha
q = torch.randn(7, 2, 32, device="cuda", dtype=torch.float16)
cu_q = torch.tensor({cu}, dtype=torch.int32, device="cuda")
cu_k = torch.tensor([0, 3, 7], dtype=torch.int32, device="cuda")
o = fmha.attention_varlen(q, q, q, cu_q, cu_k, {max_q}, 4, variant="tiled",
                          config=fmha.KernelConfig({rows}, 32, 4, 2))
torch.cuda.synchronize()
print("ANSWER", o.float().sum().item())
"""
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert run.returncode > 0 and "ANSWER" not in run.stdout, (run.returncode, run.stdout, run.stderr[-2000:])
    assert says in run.stderr and "device-side assert" in run.stderr, run.stderr[-2000:]


@pytest.mark.parametrize("lens", [([1000, 1, 0, 128, 300, 77, 2049], [1000, 300, 5, 128, 1, 0, 1537]),
                                  ([0, 0, 5], [0, 3, 0]), ([700], [900]), ([64] * 300 + [513], [64] * 300 + [2000])],
                         ids=lambda x: f"{len(x[0])}seqs")
@pytest.mark.parametrize("causal,align,window", [(False, "top_left", (-1, -1)), (True, "top_left", (-1, -1)),
                                                 (True, "bottom_right", (-1, -1)), (True, "bottom_right", (300, -1)),
                                                 (False, "top_left", (100, -1))])
def test_hopper_work_list_covers_every_block_longest_first(causal, align, window, lens):
    """The Gluon kernel's packed-sequence work list, built on the device from the cu_seqlens (a Triton
    program, :mod:`fmha.kernels.hopper.worklist`, run here by the interpreter): its count in front, then
    every block of query rows of every sequence exactly once, none past a sequence's end, costlier blocks
    first, within the room the host gave it; the programs' snake-wise deal (the kernel's
    ``_n_items``/``_tile``) hands out each item once; cu_seqlens that break the rules give no item."""
    from fmha import configs
    from fmha.kernels.hopper import worklist
    from fmha.plan import Problem, band
    lens_q, lens_k = (np.array(x) for x in lens)
    cu_q, cu_k = (torch.tensor(np.cumsum([0, *x]), dtype=torch.int32, device=DEVICE) for x in lens)
    upper, causal_offset, window_offset = band(causal, window, 0)
    prob = Problem(len(lens_q), 4, 2, int(lens_q.sum()), int(lens_k.sum()), 128, upper, causal_offset, 1.0,
                   window_offset=window_offset, align_br=align == "bottom_right", varlen=True)
    cfg = configs.hopper_config(128, causal, int(lens_k.max()), per_sequence=True)
    build = lambda cu: worklist.build(cu, cu_k, prob.seqlen_q, prob.seqlen_k, int(lens_q.max()),  # noqa: E731
                                      int(lens_k.max()), prob.heads, prob, cfg, causal_offset, window_offset or 0)
    built = build(cu_q).cpu().numpy()
    items = built[1:1 + built[0] // prob.heads]
    assert len(built) - 1 == worklist.capacity(prob.seqlen_q, len(lens_q), int(lens_q.max()), cfg.block_m)
    seq, block = items >> 16, items & 0xFFFF
    expected = sorted((b, m) for b, n in enumerate(lens_q) for m in range(-(-n // cfg.block_m)))
    assert sorted(zip(seq.tolist(), block.tolist())) == expected
    # cost: key tiles from the first with a visible key to the last, on the sequence's own diagonal
    def tiles(b, m):
        rows = np.arange(m * cfg.block_m, min((m + 1) * cfg.block_m, lens_q[b]))
        seen = np.flatnonzero(reference.visible(int(lens_q[b]), int(lens_k[b]), causal, align, window)[rows].any(0))
        return 1 if seen.size == 0 else seen[-1] // cfg.block_n - seen[0] // cfg.block_n + 1
    costs = [tiles(b, m) for b, m in zip(seq, block)]
    assert costs == sorted(costs, reverse=True)
    n_tiles, nprog = len(items) * prob.heads, 5
    dealt = []
    for pid in range(nprog):
        rounds, rest = divmod(n_tiles, nprog)
        mine = rounds + ((pid < rest) if rounds % 2 == 0 else (pid >= nprog - rest))
        dealt += [k * nprog + (pid if k % 2 == 0 else nprog - 1 - pid) for k in range(mine)]
    assert sorted(dealt) == list(range(n_tiles))
    if DEVICE == "cpu" and len(lens_q) > 1:  # (on a GPU the build's device assert ends the context)
        assert int(build(cu_q.flip(0).contiguous())[0]) == 0


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_causal_varlen_aligns_as_flash_attn_varlen_func(variant):
    """The README presents attention_varlen as flash_attn_varlen_func takes its arguments; that
    function aligns causal masks bottom-right, so a 17-query, 40-key sequence ported unchanged
    gets the same answer; top-left stays one argument away."""
    lens_q, lens_k = [17, 6], [40, 6]
    q, cu_q = packed(lens_q, 2, 32, F16, 7)
    k, cu_k = packed(lens_k, 2, 32, F16, 8)
    v, _ = packed(lens_k, 2, 32, F16, 9)
    for kw, align in (({}, "bottom_right"), ({"causal_align": "top_left"}, "top_left")):
        o, lse = fmha.attention_varlen(q, k, v, cu_q, cu_k, 17, 40, causal=True, variant=variant, return_lse=True,
                                       **kw)
        check_varlen(o, lse, q, k, v, cu_q, cu_k, causal=True, causal_align=align)


@pytest.mark.parametrize("sinks", [False, True])
def test_attention_varlen_compiles_whole(sinks):
    """Under ``torch.compile(fullgraph=True)`` ``attention_varlen`` traces as its custom op (no graph break): the
    output and the gradients of q, k, v (and the sinks) are the eager call's, GQA and a window included."""
    import torch._dynamo
    qp, cu_q = packed([5, 17, 9], 4, 32, torch.bfloat16, 21)
    kp, cu_k = packed([11, 17, 30], 2, 32, torch.bfloat16, 22)
    vp, _ = packed([11, 17, 30], 2, 32, torch.bfloat16, 23)
    sink = torch.tensor([0.5, -1.0, 2.0, 0.0], device=DEVICE) if sinks else None

    def step(q, k, v, s):
        o = fmha.attention_varlen(q, k, v, cu_q, cu_k, 17, 30, causal=True, window=(12, -1), sinks=s)
        return (o.float() * torch.linspace(-1, 1, o.shape[-1], device=o.device)).sum()
    results = []
    for run in (step, torch.compile(step, fullgraph=True, backend="eager")):
        leaves = [t.clone().requires_grad_(True) for t in (qp, kp, vp)] + \
            ([sink.clone().requires_grad_(True)] if sinks else [])
        loss = run(*leaves[:3], leaves[3] if sinks else None)
        loss.backward()
        results.append([loss.detach()] + [t.grad for t in leaves])
    torch._dynamo.reset()
    for eager, compiled in zip(*results):
        torch.testing.assert_close(compiled.float(), eager.float(), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(DEVICE != "cpu", reason="on a GPU a failed check asserts (test_bad_cu_seqlens_stop_the_gpu_stream)")
def test_each_program_checks_its_own_cu_seqlens_as_the_host_rules_say():
    """``tiled``'s own check (:func:`fmha.kernels.guards.program_checks`, one program a sequence, each reading only
    its two entries of each cu_seqlens) fails somewhere exactly where the host's rules
    (:func:`fmha.checks.check_cu_seqlens`) fail, over random lengths and their corruptions; the interpreter skips
    the asserts, so each program's verdict is stored."""
    from fmha.checks import check_cu_seqlens

    rng = np.random.default_rng(7)
    failed = 0
    for case in range(300):
        batch = int(rng.integers(1, 7))
        cu = [np.concatenate([[0], np.cumsum(rng.integers(0, 10, batch))]) for _ in range(2)]
        totals = [int(c[-1]) for c in cu]
        longest = [int(np.diff(c).max()) for c in cu]
        which = int(rng.integers(2))
        kind = case % 6
        if kind == 1:  # two entries swapped
            i = int(rng.integers(batch))
            cu[which][[i, i + 1]] = cu[which][[i + 1, i]]
        elif kind == 2:  # an entry moved
            cu[which][int(rng.integers(batch + 1))] += int(rng.integers(-3, 4))
        elif kind == 3:  # the total off by one
            totals[which] += int(rng.choice([-1, 1]))
        elif kind == 4:  # a max_seqlen one short
            longest[which] -= 1
        elif kind == 5:  # a negative entry
            cu[which][int(rng.integers(batch + 1))] = -1
        both = np.stack(cu).astype(np.int32)
        try:
            check_cu_seqlens(both, *totals, *longest)
            host_fails = False
        except ValueError:
            host_fails = True
        out = torch.full((batch,), -1, dtype=torch.int32)
        cu_q, cu_k = (torch.tensor(c, dtype=torch.int32) for c in both)
        _verdicts[(batch,)](cu_q, cu_k, out, *totals, *longest)
        assert (out >= 0).all() and bool(out.any()) == host_fails, (case, both, totals, longest, out)
        failed += host_fails
    assert 100 < failed < 250  # (both verdicts drawn often)


@triton.jit
def _verdicts(CuQ, CuK, Out, total_q, total_k, max_q, max_k):
    """Each program's verdict of :func:`fmha.kernels.guards.program_checks` over its sequence's entries."""
    b = tl.program_id(0)
    tl.store(Out + b, guards.program_checks(CuQ, CuK, CuQ, b, tl.num_programs(0), total_q, total_k, max_q, max_k, 0,
                                            True, False))
