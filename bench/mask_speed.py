"""Time calls with an `attn_mask` (boolean, or SDPA's additive float bias) beside torch SDPA given the same mask.

`PYTHONPATH=src python3 bench/mask_speed.py [--ledger FILE] [--seqlens 1024 4096] [--forward-only] [--masks bool
bias bias-grad] [--shape B H KV D] [--no-causal] [--rows N] [--bias-dtype bfloat16]`: bf16, by default GQA 32 query
heads on 8 KV heads, D=128, batch 2, causal; three masks: a boolean `[batch, 1, rows, S]` (the band and a padded
batch's keys, as transformers builds it), a float32 bias `[1, heads, rows, S]` (T5's relative positions: a learned
bias a head, `-inf` above the diagonal when causal) and the same bias requiring grad (`fwd+bwd`: the bias's own
gradient too). `--rows 1` times a decoding step (one query row a sequence against S keys, the last row of the band);
`--shape 4 12 12 64 --no-causal` T5-base's encoder, `--bias-dtype bfloat16` its bias as transformers hands it. fmha
runs with `causal` beside the mask (its band's tiles skipped whole, the mask read on the rest: `tiled`); SDPA gets
the mask alone (the band in it), with its memory-efficient and cuDNN backends and its own pick. Each forward's error
is against SDPA's math backend in float32 on the same inputs and mask (a provider that dropped the mask would show
it). CUDA graphs for the forward; the backward eagerly (each call's gradients, q's, k's, v's and the bias's). Rows
go to the ledger with features "mask=bool", "mask=bias bias=float32", "mask=bias-grad bias=float32" (or bfloat16).
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import ledger
from fmha.bench.flops import attention_flops
from fmha.bench.report import cell_lines, measured
from fmha.bench.timing import graph_median_ms, median_ms

MASKS = ("bool", "bias", "bias-grad")


def masks(batch: int, heads: int, rows: int, s: int, causal: bool, g: torch.Generator,
          bias_dtype: torch.dtype = torch.float32) -> dict:
    """The three masks of a cell (``rows`` queries, the last of ``s`` keys), each with the band in it (SDPA's
    is_causal cannot join a mask); every other sequence padded to its last quarter of keys."""
    band = torch.ones(s, s, dtype=torch.bool).tril()[s - rows:] if causal else torch.ones(rows, s, dtype=torch.bool)
    real = torch.arange(s)[None, :] < torch.tensor([s if b % 2 == 0 else s * 3 // 4 for b in range(batch)])[:, None]
    boolean = (band[None] & real[:, None, :])[:, None].cuda()
    bias = (torch.randn(1, heads, rows, s, generator=g) * 2).masked_fill(~band, float("-inf")).to("cuda", bias_dtype)
    return {"bool": boolean, "bias": bias, "bias-grad": bias}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", default=str(ledger.DEFAULT_LEDGER))
    ap.add_argument("--seqlens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--masks", nargs="+", choices=MASKS, default=list(MASKS))
    ap.add_argument("--shape", type=int, nargs=4, metavar=("BATCH", "HEADS", "KV_HEADS", "HEAD_DIM"),
                    default=[2, 32, 8, 128])
    ap.add_argument("--no-causal", dest="causal", action="store_false")
    ap.add_argument("--rows", type=int, default=0, help="query rows a sequence (default: S, a prefill)")
    ap.add_argument("--bias-dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the bias's dtype (transformers' T5 adds a bias of the model's dtype)")
    args = ap.parse_args()
    batch, heads, kv_heads, head_dim = args.shape
    causal = args.causal
    env = ledger.environment("cuda")
    rows = []
    print(f"{'S':>6} {'mask':<10} {'provider':<16} {'ms':>8} {'TFLOP/s':>8} {'x best peer':>11} {'err':>8}")
    for s in args.seqlens:
        g = torch.Generator().manual_seed(s)
        rows_q = args.rows or s
        q = torch.randn(batch, heads, rows_q, head_dim, generator=g).to("cuda", torch.bfloat16)
        k, v = (torch.randn(batch, kv_heads, s, head_dim, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
        for kind, mask in masks(batch, heads, rows_q, s, causal, g, getattr(torch, args.bias_dtype)).items():
            grad = kind == "bias-grad"
            if kind not in args.masks or grad and args.forward_only:
                continue
            flops = attention_flops(batch, heads, rows_q, s, head_dim, causal, "bottom_right") * (3.5 if grad else 1.0)
            ref = None
            if not grad:
                exact_mask = mask if mask.dtype == torch.bool else mask.float()
                with sdpa_kernel(SDPBackend.MATH):
                    ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                                           attn_mask=exact_mask, enable_gqa=True)

            def call(fn):
                if not grad:
                    return fn
                leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v, mask)]
                do = torch.randn(batch, heads, rows_q, head_dim, generator=g).to("cuda", torch.bfloat16)

                def step():
                    out = fn(*leaves)
                    torch.autograd.grad(out, leaves, do)
                    return out
                return step

            def sdpa(backend):
                def run(q=q, k=k, v=v, m=mask):
                    with sdpa_kernel(backend):
                        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
                return run
            provs = {
                "fmha:auto": lambda q=q, k=k, v=v, m=mask: fmha.attention(
                    q, k, v, causal=causal, causal_align="bottom_right", attn_mask=m),
                "sdpa:efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION),
                "sdpa:cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                "sdpa:default": lambda q=q, k=k, v=v, m=mask: torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=m, enable_gqa=True),
            }

            def one(name, fn):
                run = call(fn)
                err = float("nan") if ref is None else float((run().float() - ref).norm() / ref.norm())
                timer = median_ms if grad else graph_median_ms
                return min(timer(run), timer(run)), err
            label = f"{s:>6} {kind:<10}"
            for name, ms, tflops, ratio, err in cell_lines(label, measured(provs, one), flops,
                                                           lambda n: n.startswith("sdpa"), width=16):
                rows.append(dict(env, provider=name, config="library default", dtype="bfloat16", batch=batch,
                                 heads=heads, kv_heads=kv_heads, seqlen_q=rows_q, seqlen_k=s, head_dim=head_dim,
                                 causal=int(causal), ms=ms, tflops=tflops, ratio_best_peer=ratio, error=err,
                                 features=f"mask={kind}" + (f" bias={args.bias_dtype}" if kind != "bool" else ""),
                                 **({"pass": "fwd+bwd"} if grad else {}),
                                 note=("fmha causal beside the mask, SDPA the mask alone; " if causal else "")
                                      + ("eager, the bias's gradient too" if grad else "cuda graph")))
    ledger.append(args.ledger, rows)


if __name__ == "__main__":
    main()
