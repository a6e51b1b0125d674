"""Time packed variable-length batches (`fmha.attention_varlen`) against the peers that take them.

`PYTHONPATH=src python3 bench/varlen_speed.py [--lengths 2048x32] [--ledger FILE]`: bf16, 32
sequences of 128 to 4096 rows (seed 0, about 71k tokens; `LxN`: N sequences of L rows),
self-attention (each sequence's keys are its queries), causal off and on, at (heads 16, D=128),
(32, D=64) and GQA (32 on 8, D=128).  Providers: fmha `auto` (the Gluon kernel on sm_90), the
Gluon kernel with one program per work item (`hopper-p0`; the default is persistent) and
`tiled`; with equal lengths also fmha on the same batch as a dense bshd tensor (`fmha:dense`:
what the varlen path costs over it); FlashAttention's `flash_attn_varlen_func` (`flash_attn`,
`flash_attn.cute`) when importable; torch SDPA on jagged nested tensors (each backend that
takes them).  TFLOP/s count the visible (query, key) pairs, 4 * D flops each; eager calls, every
provider alike.  Rows go to the ledger with features "varlen"
(seqlen_q and seqlen_k are the longest sequence's, batch the number of sequences).

`--pass bwd`: the backward, timed as the forward and backward together less the forward (TFLOP/s 2.5x the
forward's flops, as `fmha bench --pass bwd`), fmha `auto` beside `triton-backward` (auto's forward, the
backward held to the Triton kernels) and the peers' backward; the error is the largest of dQ's, dK's and dV's
against the Triton kernels' gradients.
"""
import argparse
import contextlib
import dataclasses

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import ledger
from fmha.bench.providers import entry, triton_backward
from fmha.bench.report import cell_lines, measured
from fmha.bench.timing import median_ms

CELLS = [(16, 16, 128), (32, 32, 64), (32, 8, 128)]  # (heads, kv_heads, head_dim)


def lengths(spec: str, n: int = 32, lo: int = 128, hi: int = 4096, seed: int = 0) -> list[int]:
    if spec != "random":
        rows, count = (int(x) for x in spec.split("x"))
        return [rows] * count
    return [int(x) for x in np.random.default_rng(seed).integers(lo, hi + 1, n)]


def visible_pairs(lens: list[int], causal: bool) -> int:
    return sum(s * (s + 1) // 2 if causal else s * s for s in lens)


def providers(q, k, v, cu, longest, causal):
    """name -> zero-argument callable, or the reason it cannot run."""
    out = {}
    for variant in ("auto", "tiled"):
        out[f"fmha:{variant}"] = lambda variant=variant: fmha.attention_varlen(
            q, k, v, cu, cu, longest, longest, causal=causal, variant=variant)
    if torch.cuda.get_device_capability()[0] == 9:
        cfg = fmha.configs.hopper_config(q.shape[2], causal, longest, per_sequence=True)
        out["fmha:hopper-p0"] = lambda cfg=dataclasses.replace(cfg, persistent=0): fmha.attention_varlen(
            q, k, v, cu, cu, longest, longest, causal=causal, variant="hopper", config=cfg)
    n = len(cu) - 1
    if q.shape[0] == n * longest:  # equal lengths: the same batch, dense
        out["fmha:dense"] = lambda: fmha.attention(*(t.view(n, longest, *t.shape[1:]) for t in (q, k, v)),
                                                   causal=causal, layout="bshd")
    for module in ("flash_attn", "flash_attn.cute"):
        fn = entry(module, "flash_attn_varlen_func")
        if fn is None:
            out[module] = "not installed"
            continue
        out[module] = lambda fn=fn: fn(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest,
                                       max_seqlen_k=longest, causal=causal)
    offsets = cu.long()
    qn, kn, vn = (torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2) for t in (q, k, v))
    for backend in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        def run(backend=backend):
            with sdpa_kernel(getattr(SDPBackend, backend)):
                return torch.nn.functional.scaled_dot_product_attention(qn, kn, vn, is_causal=causal,
                                                                        enable_gqa=q.shape[1] != k.shape[1])
        out[f"sdpa-jagged:{backend.lower().replace('_attention', '')}"] = run
    return out


def backward_providers(q, k, v, cu, longest, causal):
    """name -> zero-argument callable running a forward whose output the backward starts from, or a reason."""
    out = {name: fn for name, fn in providers(q, k, v, cu, longest, causal).items()
           if name in ("fmha:auto", "flash_attn", "flash_attn.cute") or name.startswith("sdpa")}
    out["fmha:triton-backward"] = out["fmha:auto"]
    return out


def flat(o, shape):
    """A provider's output as packed rows of ``shape``."""
    o = o[0] if isinstance(o, tuple) else o
    if o.is_nested:
        o = o.transpose(1, 2).values()
    return o.reshape(shape)


def time_backward(name, fn, leaves, do):
    """(backward ms, (dq, dk, dv)): the forward and backward together, less the forward alone."""
    scope = triton_backward() if name == "fmha:triton-backward" else contextlib.nullcontext()
    with scope:
        def both():
            return torch.autograd.grad(flat(fn(), do.shape), leaves, do)
        grads = both()
        with torch.no_grad():
            fwd = median_ms(fn)
        return median_ms(both) - fwd, grads


def cells(total: int, time_label: str):
    """Print the table's header; then per cell (heads, kv_heads, head dim, q, k, v and the generator that made
    them) of ``total`` packed rows."""
    print(f"{'H/KV':>6} {'D':>4} {'causal':>6} {'provider':<28} {time_label:>8} {'TFLOP/s':>8} {'x best peer':>11} "
          f"{'err':>8}")
    for heads, kv_heads, d in CELLS:
        g = torch.Generator(device="cuda").manual_seed(heads + d)
        q = torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
        k, v = (torch.randn(total, kv_heads, d, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))
        yield heads, kv_heads, d, q, k, v, g


def run_backward(args, lens, cu, total, longest, rows):
    for heads, kv_heads, d, q, k, v, g in cells(total, "bwd ms"):
        do = torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16, generator=g)
        leaves = [t.requires_grad_(True) for t in (q, k, v)]
        for causal in (False, True):
            flops = 2.5 * 4 * d * heads * visible_pairs(lens, causal)
            with triton_backward():
                ref = torch.autograd.grad(fmha.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal,
                                                                variant="tiled"), leaves, do)

            def one(name, fn):
                ms, grads = time_backward(name, fn, leaves, do)
                return ms, max(float((a.float() - b.float()).abs().max()) for a, b in zip(grads, ref))
            results = measured(backward_providers(q, k, v, cu, longest, causal), one)
            report(args, rows, results, lens, total, longest, heads, kv_heads, d, causal, flops, "bwd")


def report(args, rows, results, lens, total, longest, heads, kv_heads, d, causal, flops, pass_):
    """Print a cell's rows and keep them for the ledger."""
    label = f"{heads}/{kv_heads:<3} {d:>4} {causal:>6}"
    for name, ms, tflops, ratio, err in cell_lines(label, results, flops, lambda n: not n.startswith("fmha")):
        rows.append(dict(ledger.environment("cuda"), provider=name, config="library default", dtype="bfloat16",
                         batch=len(lens), heads=heads, kv_heads=kv_heads, seqlen_q=longest, seqlen_k=longest,
                         head_dim=d, causal=int(causal), ms=ms, tflops=tflops, ratio_best_peer=ratio,
                         error=err, features="varlen", note=f"{len(lens)} packed sequences of "
                         + (f"{lens[0]} rows" if args.lengths != "random" else "128-4096 rows (seed 0)")
                         + f", {total} tokens", **{"pass": pass_}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", default="random", help='"random" (default) or "LxN": N sequences of L rows')
    ap.add_argument("--pass", dest="pass_", choices=["fwd", "bwd"], default="fwd")
    ap.add_argument("--ledger", default=str(ledger.DEFAULT_LEDGER))
    args = ap.parse_args()
    lens = lengths(args.lengths)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    total, longest = sum(lens), max(lens)
    rows = []
    print(f"{len(lens)} sequences, {total} tokens, longest {longest}, {torch.cuda.get_device_name()}")
    if args.pass_ == "bwd":
        run_backward(args, lens, cu, total, longest, rows)
        ledger.append(args.ledger, rows)
        return
    for heads, kv_heads, d, q, k, v, _ in cells(total, "ms"):
        for causal in (False, True):
            flops = 4 * d * heads * visible_pairs(lens, causal)
            ref = fmha.attention_varlen(q, k, v, cu, cu, longest, longest, causal=causal, variant="tiled").float()

            def one(name, fn):
                o = fn()
                o = o[0] if isinstance(o, tuple) else o
                o = (o.transpose(1, 2).values() if o.is_nested else o).reshape(ref.shape)
                return median_ms(fn), float((o.float() - ref).abs().max())
            results = measured(providers(q, k, v, cu, longest, causal), one)
            report(args, rows, results, lens, total, longest, heads, kv_heads, d, causal, flops, "fwd")
    ledger.append(args.ledger, rows)


if __name__ == "__main__":
    main()
