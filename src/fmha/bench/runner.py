"""Run a grid of cells over providers: time, check, and turn results into ledger rows.

A run times one pass: ``fwd`` (the forward), ``bwd`` (the gradients of q, k and v from an output whose
forward ran once, untimed), or ``fwd+bwd``.  TFLOP/s count the forward's FLOPs times 1, 2.5 or 3.5
(the backward's five matrix products against the forward's two, BENCH.md's convention).  Under CUDA graphs
the backward alone cannot be captured (autograd runs it on the stream its forward ran on, outside the
capture), so ``bwd`` is then the replays of ``fwd+bwd`` less those of ``fwd``: the issue's own definition of
the peers' backward time."""
from __future__ import annotations

import math
import sys
import time
from typing import Callable

import torch

from . import ledger
from .flops import attention_bytes, attention_flops
from .grids import Cell
from .layouts import arrange
from .providers import Provider, sdpa_mask, modifiers
from .timing import graph_median_ms, median_ms, tflops


def progress(i: int, n: int, what: str, stream=sys.stderr) -> None:
    """A one-line progress bar on stderr."""
    width = 30
    done = int(width * i / max(n, 1))
    stream.write(f"\r[{'#' * done}{'.' * (width - done)}] {i}/{n} {what[:60]:<60}")
    if i == n:
        stream.write("\n")
    stream.flush()


def time_ms(fn: Callable | tuple[Callable, Callable], device: str, graphs: bool = False) -> float:
    """Milliseconds of ``fn``, or of the first of a pair less the second (:func:`_checked`)."""
    if isinstance(fn, tuple):
        return time_ms(fn[0], device, graphs) - time_ms(fn[1], device, graphs)
    if device == "cuda":
        return graph_median_ms(fn) if graphs else median_ms(fn)
    t0 = time.perf_counter()  # the interpreter: one run, a number that means nothing
    fn()
    return (time.perf_counter() - t0) * 1e3


def ceilings(device: str) -> list[dict]:
    """Measured matmul (bf16) and copy ceilings of this run, as ledger rows."""
    n = 8192 if device == "cuda" else 256
    dt = torch.bfloat16 if device == "cuda" else torch.float32
    a, b = (torch.randn(n, n, device=device, dtype=dt) for _ in range(2))
    ms = time_ms(lambda: a @ b, device)
    rows = [{"provider": "ceiling:matmul", "config": f"{n}^3 {str(dt)[6:]}", "dtype": str(dt)[6:],
             "ms": ms, "tflops": tflops(2 * n ** 3, ms), "pct_peak": 100.0, "note": "matmul ceiling"}]
    x = torch.empty(2 ** 28 if device == "cuda" else 2 ** 20, device=device, dtype=torch.float32)
    y = torch.empty_like(x)
    ms = time_ms(lambda: y.copy_(x), device)
    rows.append({"provider": "ceiling:copy", "config": f"{x.numel() * 4 >> 20} MiB", "dtype": "float32",
                 "ms": ms, "tbps": 2 * x.numel() * 4 / (ms * 1e-3) / 1e12, "note": "copy ceiling (read+write)"})
    return rows


REFERENCE_BYTES = 4 << 30  # past this, SDPA's math backend (K/V repeated to every query head) runs a batch at a time


def _reference(q, k, v, cell: Cell) -> torch.Tensor:
    """Float32 attention through SDPA's exact backends (no low-precision rounding), a batch at a time where
    the math backend's copies would be large (MLA's 128 query heads on one latent head), a window and ALiBi
    given as SDPA's additive mask; a cell with softcap, which SDPA lacks, through
    :func:`fmha.reference.dense_attention` (float64, host), a batch at a time."""
    if cell.softcap:
        from fmha import reference
        kw = {name: x for name, x in modifiers(cell, "cpu").items() if name != "dropout_p"}  # (the expectation)
        out = [torch.from_numpy(reference.dense_attention(*(t[b:b + 1].cpu() for t in (q, k, v)), causal=cell.causal,
                                                         **kw)) for b in range(cell.batch)]
        return torch.cat(out).to(q.device, torch.float32)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    backends = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if q.is_cuda else [SDPBackend.MATH]
    per_batch = cell.heads * max(cell.seqlen_q, cell.seqlen_k) * (2 * cell.head_dim + cell.seqlen_q) * 4
    step = max(1, REFERENCE_BYTES // per_batch)
    mask = sdpa_mask(q, cell, torch.float32) if cell.modified else None
    with sdpa_kernel(backends):
        return torch.cat([torch.nn.functional.scaled_dot_product_attention(
            q[b:b + step].float(), k[b:b + step].float(), v[b:b + step].float(), attn_mask=mask,
            is_causal=cell.causal and mask is None, enable_gqa=cell.heads != cell.kv_heads)
            for b in range(0, cell.batch, step)])


def check_error(err: float, cell: Cell, what: str = "result") -> None:
    """Raise unless ``err``, a provider's relative error against the reference (which draws no dropout), is what
    a right answer gives: at most 5e-2; with attention dropout at p, one draw of the dropped pairs against their
    expectation, ``sqrt(p / (1 - p))`` for random inputs (in the output and in each gradient alike), within a
    factor 1.5 (no pairs dropped, or twice as many, falls outside)."""
    if cell.dropout:
        expected = math.sqrt(cell.dropout / (1 - cell.dropout))
        if not expected / 1.5 <= err <= expected * 1.5:
            raise RuntimeError(f"wrong {what}: relative error {err:.2e}, where dropout at {cell.dropout:g} gives "
                               f"{expected:.2e}")
    elif not math.isfinite(err) or err > 5e-2:
        raise RuntimeError(f"wrong {what}: relative error {err:.2e}")


def cell_inputs(cell: Cell, dtype: torch.dtype, device: str, seed: int = 0):
    """Random normal q, k, v (bhsd views, in the cell's memory layout) for ``cell``, its float32 reference
    output, and its FLOPs."""
    g = torch.Generator(device=device).manual_seed(seed)
    shape = lambda h, s: (cell.batch, h, s, cell.head_dim)  # noqa: E731
    q = torch.randn(shape(cell.heads, cell.seqlen_q), generator=g, device=device, dtype=dtype)
    k = torch.randn(shape(cell.kv_heads, cell.seqlen_k), generator=g, device=device, dtype=dtype)
    v = torch.randn((*shape(cell.kv_heads, cell.seqlen_k)[:3], cell.head_dim_v or cell.head_dim), generator=g,
                    device=device, dtype=dtype)
    q, k, v = arrange(q, k, v, cell.layout)
    flops = attention_flops(cell.batch, cell.heads, cell.seqlen_q, cell.seqlen_k, cell.head_dim, cell.causal,
                            window=cell.window, head_dim_v=cell.head_dim_v)
    return q, k, v, _reference(q, k, v, cell), flops


def quantized(t: torch.Tensor):
    """``t`` in float8 e4m3 with one descale factor per (batch, head), FlashAttention-3's form: ``(t8, scale)``, float32
    ``scale`` ``[batch, heads]`` with ``t8 * scale`` about ``t``."""
    scale = (t.float().abs().amax(dim=(2, 3)) / 448).clamp_min(1e-6)
    return (t.float() / scale[:, :, None, None]).to(torch.float8_e4m3fn), scale


def cell_columns(cell: Cell, dtype: torch.dtype) -> dict:
    """The ledger columns that name the cell."""
    return {"dtype": str(dtype)[6:], "batch": cell.batch, "heads": cell.heads, "kv_heads": cell.kv_heads,
            "seqlen_q": cell.seqlen_q, "seqlen_k": cell.seqlen_k, "head_dim": cell.head_dim,
            "causal": int(cell.causal), "features": cell.features}


PASSES = {"fwd": 1.0, "bwd": 2.5, "fwd+bwd": 3.5}  # FLOPs against the forward's


def _reference_grads(q, k, v, do, cell: Cell):
    """Float32 gradients of q, k, v through SDPA's exact backends, a window and ALiBi given as its additive
    mask (softcap, which SDPA lacks, is not timed backward)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    leaves = [t.detach().float().requires_grad_(True) for t in (q, k, v)]
    backends = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH] if q.is_cuda else [SDPBackend.MATH]
    mask = sdpa_mask(q, cell, torch.float32) if cell.modified else None
    with sdpa_kernel(backends):
        o = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=mask,
                                                             is_causal=cell.causal and mask is None,
                                                             enable_gqa=cell.heads != cell.kv_heads)
    return torch.autograd.grad(o, leaves, do.float())


def _scoped(p: Provider, fn: Callable) -> Callable:
    """``fn`` run inside the provider's scope."""
    def run():
        with p.scope():
            return fn()
    return run


def _checked(p: Provider, q, k, v, cell: Cell, ref, pass_: str, do, ref_grads, graphs: bool = False):
    """The provider's timed callable for ``pass_``, after checking its output (fwd) or its gradients
    (bwd, fwd+bwd) against the float32 reference; returns (callable, relative error).  The backward under CUDA
    graphs is a pair, the forward and backward and the forward alone, whose times' difference counts.  Every
    call, checked or timed, runs inside the provider's scope."""
    made = p.make(q, k, v, cell)
    fn = _scoped(p, made)
    o = fn()
    if pass_ == "fwd":
        err = ((o.float() - ref).norm() / ref.norm()).item()
    else:
        grads = _scoped(p, lambda: torch.autograd.grad(o, (q, k, v), do))()
        err = max(((g.float() - r).norm() / r.norm()).item() for g, r in zip(grads, ref_grads))
    check_error(err, cell, "result" if pass_ == "fwd" else "gradients")
    if pass_ == "fwd":
        return fn, err
    both = _scoped(p, lambda: torch.autograd.grad(made(), (q, k, v), do))
    if pass_ == "bwd" and graphs:
        return (both, fn), err
    if pass_ == "bwd":
        out = fn()  # one forward, its graph kept: each timed call runs the backward alone
        return _scoped(p, lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True)), err
    return both, err


def run_cell(cell: Cell, dtype: torch.dtype, provs: list[Provider], device: str, peak: float,
             seed: int = 0, tick: Callable[[str], None] = lambda s: None, graphs: bool = False,
             pass_: str = "fwd") -> list[dict]:
    """Every provider on one cell: rows with ms, TFLOP/s, % of peak, error (ratios filled later)."""
    q, k, v, ref, flops = cell_inputs(cell, dtype, device, seed)
    flops = int(flops * PASSES[pass_])
    do = ref_grads = None
    if pass_ != "fwd":
        if cell.softcap:
            raise ValueError("the backward passes are timed on cells without softcap (their reference is SDPA's)")
        q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
        do = torch.randn(ref.shape, generator=torch.Generator(device=device).manual_seed(seed + 1), device=device,
                         dtype=dtype)
        ref_grads = _reference_grads(q, k, v, do, cell)
    nbytes = attention_bytes(cell.batch, cell.heads, cell.kv_heads, cell.seqlen_q, cell.seqlen_k,
                             cell.head_dim, q.element_size(), cell.head_dim_v)
    base = dict(cell_columns(cell, dtype), **{"pass": pass_})
    rows, ready = [], []
    for p in provs:  # first every provider once: compile, check; a failure is recorded, the run goes on
        with p.scope():
            row = dict(base, provider=p.name, config=_config_of(p, cell, q, k, v, pass_), _peer=p.peer)
        if graphs and pass_ != "fwd" and not p.graph_backward:
            row.update(note="failed: its backward cannot be captured in a CUDA graph (time it without --cuda-graphs)")
            rows.append(row)
            continue
        try:
            fn, row["error"] = _checked(p, q, k, v, cell, ref, pass_, do, ref_grads, graphs)
            ready.append((row, fn))
        except Exception as e:
            row.update(note=f"failed: {type(e).__name__}: {' '.join(str(e).split())[:160]}")
        rows.append(row)
    for row, ms in time_in_rounds(ready, device, graphs, lambda row: tick(f"{cell} {base['dtype']} {row['provider']}")):
        row.update(ms=ms, tflops=tflops(flops, ms), tbps=nbytes / (ms * 1e-3) / 1e12,
                   pct_peak=100.0 * tflops(flops, ms) / peak, note=_timed_as(graphs, pass_))
    _fill_ratios(rows)
    return rows


def rounds(device: str) -> int:
    """How many times each provider of a cell is timed: on a GPU twice (clock and cache states drift), elsewhere
    once (the interpreter's times mean nothing)."""
    return 2 if device == "cuda" else 1


def time_in_rounds(ready: list[tuple[dict, Callable]], device: str, graphs: bool,
                   tick: Callable[[dict], None]) -> list[tuple[dict, float]]:
    """Each ready (row, fn) with its time: the better of :func:`rounds` medians, each round over the providers in
    the reverse order of the round before.  A long cell heats the GPU, and under its power cap the provider timed
    right after another runs at lower clocks (two identical providers read 2.5% apart at 16k tokens, the first
    ahead): reversed, no provider always runs first.  A provider whose timing fails (e.g. one that cannot be
    captured in a CUDA graph) gets the failure in its row's note and no time."""
    best: dict[int, float] = {}
    failed: set[int] = set()
    order = list(ready)
    for _ in range(rounds(device)):
        for row, fn in order:
            if id(row) in failed:
                continue
            tick(row)
            try:
                ms = time_ms(fn, device, graphs)
            except Exception as e:
                row.update(note=f"failed: {type(e).__name__}: {' '.join(str(e).split())[:160]}")
                failed.add(id(row))
                best.pop(id(row), None)
                continue
            best[id(row)] = min(ms, best.get(id(row), ms))
        order.reverse()
    return [(row, best[id(row)]) for row, _ in ready if id(row) in best]


def _timed_as(graphs: bool, pass_: str) -> str:
    """The ledger's note on how a row was timed."""
    if not graphs:
        return "ok"
    return "ok, cuda graph (fwd+bwd less fwd)" if pass_ == "bwd" else "ok, cuda graph"


def _config_of(p: Provider, cell: Cell, q, k, v, pass_: str = "fwd") -> str:
    """What ran: a provider's own config, or fmha's forward (:func:`fmha.api.describe`) and, for a backward
    pass, its backward (:func:`fmha.backward.describe`)."""
    if p.config is not None:
        return str(p.config(cell))
    if not p.name.startswith("fmha:"):
        return "library default"
    from fmha import api, backward
    variant = p.name.split(":", 1)[1]
    deterministic = variant == "deterministic"  # (auto's forward, the deterministic backward)
    variant = "auto" if variant in ("deterministic", "triton-backward") else variant
    try:
        config = api.describe(q, k, v, causal=cell.causal, variant=variant, **modifiers(cell, q.device))
    except ValueError as e:
        return f"{variant} ({e})"
    if pass_ == "fwd":
        return config
    mods = modifiers(cell, q.device)
    return f"{config}; {backward.describe(q, k, v, causal=cell.causal, deterministic=deterministic, **mods)}"


def _fill_ratios(rows: list[dict]) -> None:
    """ratio_best_peer = (fastest peer's ms) / (this row's ms): > 1 means faster than every peer."""
    peer_ms = [r["ms"] for r in rows if r.pop("_peer") and "ms" in r]
    best = min(peer_ms) if peer_ms else None
    for r in rows:
        if best is not None and "ms" in r:
            r["ratio_best_peer"] = best / r["ms"]


def run_grid(cells: list[Cell], dtypes: list[torch.dtype], provs: list[Provider], device: str,
             ledger_path, show_progress: bool = True, graphs: bool = False,
             pass_: str = "fwd") -> tuple[list[dict], list[dict]]:
    """Measure the ceilings, then every (cell, dtype); append all rows to the ledger."""
    env = ledger.environment(device)
    ceil = [dict(env, **r) for r in ceilings(device)]
    peak = ceil[0]["tflops"]
    ledger.append(ledger_path, ceil)
    todo = [(c, d) for d in dtypes for c in cells]
    n = len(todo) * len(provs) * rounds(device)
    count = [0]

    def tick(what):
        if show_progress:
            progress(count[0], n, what)
        count[0] += 1

    rows = []
    for cell, dt in todo:
        cell_rows = [dict(env, **r) for r in run_cell(cell, dt, provs, device, peak, tick=tick, graphs=graphs,
                                                      pass_=pass_)]
        ledger.append(ledger_path, cell_rows)
        rows += cell_rows
        if device == "cuda":
            torch.cuda.empty_cache()
    if show_progress:
        progress(n, n, "done")
    return ceil, rows
