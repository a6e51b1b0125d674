"""Where the host time of one eager ``fmha.attention`` call goes (cProfile over many calls).

    PYTHONPATH=src python3 bench/host_profile.py [--variant auto] [--seqlen 512]
"""
import argparse
import cProfile
import pstats
import time

import torch

import fmha


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--variant", default="auto")
    p.add_argument("--seqlen", type=int, default=512)
    p.add_argument("--calls", type=int, default=300)
    args = p.parse_args()
    q, k, v = (torch.randn(32, 16, args.seqlen, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for name, fn in ((f"fmha:{args.variant}", lambda: fmha.attention(q, k, v, causal=True, variant=args.variant)),
                     ("sdpa", lambda: sdpa(q, k, v, is_causal=True))):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn()
        host = (time.perf_counter() - t0) / args.calls * 1e6
        torch.cuda.synchronize()
        print(f"{name}: {host:.1f} us of host time per call (enqueue only)")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.calls):
        fmha.attention(q, k, v, causal=True, variant=args.variant)
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
