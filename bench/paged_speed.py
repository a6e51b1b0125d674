"""Time prefill against a paged KV cache (`fmha.attention_paged`) against the same keys contiguous.

`PYTHONPATH=src python3 bench/paged_speed.py [--ledger FILE]`: bf16, batch 4, GQA 32 query heads on 8 KV
heads and 16 on 16, D=128 and D=64, 2048 new queries (bottom-right causal and not) against caches of 8k and
32k keys (every key in use), pages of 256 keys shuffled in the pool.  Providers: fmha `auto` on the paged
cache (the Gluon kernel on sm_90), `tiled` on it, fmha `auto` on the contiguous cache (`fmha:dense`: what
paging costs), and torch SDPA's cuDNN and flash backends on the contiguous cache (what a user who gathers
the pages first gets, the gather not counted).  CUDA graphs; rows go to the ledger with features "paged".
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import ledger
from fmha.bench.flops import attention_flops
from fmha.bench.report import cell_lines, measured
from fmha.bench.timing import graph_median_ms

PAGE = 256
CELLS = [(32, 8, 128), (32, 32, 64)]  # (heads, kv_heads, head_dim)


def paged(t, g):
    """[B, KVH, S, D] -> the pool [B * S / PAGE, PAGE, KVH, D] with its pages shuffled, and the block table."""
    b, kvh, s, d = t.shape
    pages = t.view(b, kvh, s // PAGE, PAGE, d).permute(0, 2, 3, 1, 4).reshape(-1, PAGE, kvh, d)
    perm = torch.randperm(pages.shape[0], generator=g, device="cpu").to(t.device)
    pool = torch.empty_like(pages)
    pool[perm] = pages
    return pool, perm.view(b, s // PAGE).to(torch.int32)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", default=str(ledger.DEFAULT_LEDGER))
    args = ap.parse_args()
    env = ledger.environment("cuda")
    b, sq = 4, 2048
    rows = []
    print(f"{'H/KV':>6} {'D':>4} {'Sk':>6} {'causal':>6} {'provider':<14} {'ms':>8} {'TFLOP/s':>8} {'x best peer':>11} "
          f"{'err':>8}")
    for heads, kv_heads, d in CELLS:
        for sk in (8192, 32768):
            g = torch.Generator().manual_seed(sk + d)
            q = torch.randn(b, heads, sq, d, generator=g).to("cuda", torch.bfloat16)
            k, v = (torch.randn(b, kv_heads, sk, d, generator=g).to("cuda", torch.bfloat16) for _ in range(2))
            (k_pool, table), (v_pool, _) = paged(k, torch.Generator().manual_seed(1)), \
                paged(v, torch.Generator().manual_seed(1))
            lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")
            for causal in (False, True):
                flops = attention_flops(b, heads, sq, sk, d, causal, "bottom_right")

                def sdpa(backend):
                    # SDPA's is_causal is top-left: bottom-right goes in as a boolean mask (what a user writes)
                    mask = torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq) if causal else None

                    def run():
                        with sdpa_kernel(backend):
                            return torch.nn.functional.scaled_dot_product_attention(
                                q, k, v, attn_mask=mask, enable_gqa=heads != kv_heads)
                    return run
                provs = {
                    "fmha:auto": lambda: fmha.attention_paged(q, k_pool, v_pool, table, lens, causal=causal),
                    "fmha:tiled": lambda: fmha.attention_paged(q, k_pool, v_pool, table, lens, causal=causal,
                                                               variant="tiled"),
                    "fmha:dense": lambda: fmha.attention(q, k, v, causal=causal, causal_align="bottom_right"),
                    "sdpa:cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                    "sdpa:flash": sdpa(SDPBackend.FLASH_ATTENTION),
                }
                ref = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", variant="tiled").float()

                def one(name, fn):
                    err = float(((fn().float() - ref).norm() / ref.norm()))
                    return min(graph_median_ms(fn), graph_median_ms(fn)), err
                label = f"{heads}/{kv_heads:<3} {d:>4} {sk:>6} {causal:>6}"
                for name, ms, tflops, ratio, err in cell_lines(label, measured(provs, one), flops,
                                                               lambda n: n.startswith("sdpa"), width=14):
                    rows.append(dict(env, provider=name, config="library default", dtype="bfloat16", batch=b,
                                     heads=heads, kv_heads=kv_heads, seqlen_q=sq, seqlen_k=sk, head_dim=d,
                                     causal=int(causal), ms=ms, tflops=tflops, ratio_best_peer=ratio,
                                     error=err, features="paged",
                                     note=f"pages of {PAGE} keys, shuffled; bottom-right; peers on the contiguous "
                                          "cache (gather not counted), cuda graph"))
    ledger.append(args.ledger, rows)


if __name__ == "__main__":
    main()
