"""Time decoding (one query row) at fixed split counts beside SDPA (one GPU, one run, CUDA graphs).

    PYTHONPATH=src python3 bench/decode_splits.py [--shapes 4x32x8x128 1x28x4x128 ...] [--seqlens 1024 8192 ...]
        [--splits 1 2 4 8 16 32 ...]

Shapes are batch x heads x kv_heads x head_dim (bf16, bhsd).  For each shape and key length: cuDNN's time and SDPA's
own pick's (``enable_gqa``: what transformers' SDPA path calls), fmha's automatic split in microseconds, then fmha at
each fixed ``num_splits`` (the decode config for that length) as the better peer's time over fmha's (> 1: fmha
faster; a count past the keys' tiles runs as many splits as there are tiles).  The automatic choice should sit at
the row's best.
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench.timing import graph_median_ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["4x32x8x128"], help="batch x heads x kv_heads x head_dim")
    p.add_argument("--seqlens", nargs="+", type=int, default=[1024, 8192, 32768, 131072])
    p.add_argument("--splits", nargs="+", type=int, default=[1, 2, 4, 8, 12, 16, 24, 32, 48, 64])
    args = p.parse_args()
    print(f"{'shape':>12} {'seqlen_k':>8} {'cudnn us':>9} {'sdpa us':>8} {'auto us':>8} {'auto':>6} "
          + " ".join(f"{n:>5}" for n in args.splits))
    for shape in args.shapes:
        b, h, kv, d = (int(x) for x in shape.split("x"))
        for seqlen_k in args.seqlens:
            q = torch.randn(b, h, 1, d, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(b, kv, seqlen_k, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))

            def sdpa():
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return sdpa()
            peers = [graph_median_ms(cudnn), graph_median_ms(sdpa)]
            peer = min(peers)
            auto = graph_median_ms(lambda: fmha.attention(q, k, v))
            fixed = [f"{peer / graph_median_ms(lambda n=n: fmha.attention(q, k, v, num_splits=n)):>5.3f}"
                     for n in args.splits]
            print(f"{shape:>12} {seqlen_k:>8} {peers[0] * 1e3:>9.2f} {peers[1] * 1e3:>8.2f} {auto * 1e3:>8.2f} "
                  f"{peer / auto:>6.3f} " + " ".join(fixed) + f"  auto: {fmha.api.describe(q, k, v)}", flush=True)


if __name__ == "__main__":
    main()
