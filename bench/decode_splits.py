"""Time decoding (one query row) at fixed split counts beside SDPA (one GPU, one run, CUDA graphs).

    PYTHONPATH=src python3 bench/decode_splits.py [--shapes 4x32x8x128 1x28x4x128 ...] [--seqlens 1024 8192 ...]
        [--splits 1 2 4 8 16 32 ...] [--ledger bench/ledger.csv]

Shapes are batch x heads x kv_heads x head_dim (bf16, bhsd).  For each shape and key length: cuDNN's time and SDPA's
own pick's (``enable_gqa``: what transformers' SDPA path calls), fmha's automatic split in microseconds, then fmha at
each fixed ``num_splits`` (the decode config for that length) as the better peer's time over fmha's (> 1: fmha
faster; a count past the keys' tiles runs as many splits as there are tiles).  The automatic choice should sit at
the row's best.  With ``--ledger`` each time is a row (``provider`` ``sdpa:cudnn``, ``sdpa``, ``fmha:auto`` and
``fmha:tiled[num_splits=N]``; ``ratio_best_peer`` the better peer's time over the row's).
"""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench import ledger
from fmha.bench.timing import graph_median_ms


def rows(shape: str, seqlen_k: int, peers: list[float], auto: float, auto_config: str, fixed: dict) -> list[dict]:
    """Ledger rows of one shape and key length: the peers' times (cuDNN, SDPA's pick), fmha's automatic split and
    ``fixed`` ({split count asked: ms}), in milliseconds."""
    b, h, kv, d = (int(x) for x in shape.split("x"))
    best = min(peers)
    common = dict(dtype="bfloat16", batch=b, heads=h, kv_heads=kv, seqlen_q=1, seqlen_k=seqlen_k, head_dim=d, causal=0,
                  note="one query row, CUDA graphs", features="", **{"pass": "fwd"})
    timed = [("sdpa:cudnn", "", peers[0]), ("sdpa", "enable_gqa", peers[1]), ("fmha:auto", auto_config, auto)]
    timed += [(f"fmha:tiled[num_splits={n}]", "decode config", ms) for n, ms in fixed.items()]
    return [{**common, "provider": name, "config": config, "ms": ms, "ratio_best_peer": best / ms}
            for name, config, ms in timed]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", default=["4x32x8x128"], help="batch x heads x kv_heads x head_dim")
    p.add_argument("--seqlens", nargs="+", type=int, default=[1024, 8192, 32768, 131072])
    p.add_argument("--splits", nargs="+", type=int, default=[1, 2, 4, 8, 12, 16, 24, 32, 48, 64])
    p.add_argument("--ledger", default=None)
    args = p.parse_args()
    env = ledger.environment("cuda")
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
            fixed = {n: graph_median_ms(lambda n=n: fmha.attention(q, k, v, num_splits=n)) for n in args.splits}
            described = fmha.api.describe(q, k, v)
            print(f"{shape:>12} {seqlen_k:>8} {peers[0] * 1e3:>9.2f} {peers[1] * 1e3:>8.2f} {auto * 1e3:>8.2f} "
                  f"{peer / auto:>6.3f} " + " ".join(f"{peer / ms:>5.3f}" for ms in fixed.values())
                  + f"  auto: {described}", flush=True)
            ledger.append(args.ledger, [{**env, **row} for row in rows(shape, seqlen_k, peers, auto, described,
                                                                         fixed)])


if __name__ == "__main__":
    main()
