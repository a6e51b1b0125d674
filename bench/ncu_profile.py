"""One call of each kernel under Nsight Compute: fmha against cuDNN at the cells still short of the goals.

`ncu --profile-from-start off ... python3 bench/ncu_profile.py [CELL...]`: the script warms each call up
(so Triton compiles outside the profiled range), then opens the profiler (`cudaProfilerStart`) for one call
of each provider and closes it.  Cells (bf16): `d128nc16k` (B=1, H=16, S=16384, D=128, non-causal: the
670 TFLOP/s goal) and `decode8k` (B=4, 32 query heads on 8 KV heads, 1 query row, 8192 keys, D=128).
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha


def cell(name):
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    if name == "d128nc16k":
        return rand(1, 16, 16384, 128), rand(1, 16, 16384, 128), rand(1, 16, 16384, 128)
    if name == "decode8k":
        return rand(4, 32, 1, 128), rand(4, 8, 8192, 128), rand(4, 8, 8192, 128)
    raise SystemExit(f"unknown cell {name!r}")


def cudnn(q, k, v):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])


for name in sys.argv[1:] or ["d128nc16k", "decode8k"]:
    q, k, v = cell(name)
    print(f"{name}: fmha runs {fmha.api.describe(q, k, v)}", flush=True)
    for fn in (lambda: fmha.attention(q, k, v), lambda: cudnn(q, k, v)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
