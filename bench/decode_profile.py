"""Where a decoding call's time goes: each GPU kernel's mean duration, fmha against cuDNN.

`PYTHONPATH=src python3 bench/decode_profile.py`: bf16, batch 4, 32 query heads on 8 KV heads, D=128,
seqlen_q=1, at the decode grid's key lengths.  Runs each call 200 times under torch.profiler (CUPTI
kernel records) and prints, per kernel, the mean duration in microseconds and its share; the sum
is GPU busy time only (launch gaps are not in it, unlike a CUDA-graph timing).
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench.timing import kernel_times

B, H, KV, D, REPS = 4, 32, 8, 128, 200

for seqlen_k in (1024, 8192, 131072):
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, KV, seqlen_k, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    print(f"seqlen_k={seqlen_k}: fmha runs {fmha.api.describe(q, k, v)}")
    for name, fn in (("fmha", lambda: fmha.attention(q, k, v)), ("cudnn", cudnn)):
        times = kernel_times(fn, REPS, warmup=10)
        busy = sum(times.values())
        print(f"  {name:<6} busy {busy:7.2f} us: " + "; ".join(f"{n} {t:.2f}" for n, t in times.items()), flush=True)
