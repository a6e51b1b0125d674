"""Time the sliding window, softcap and ALiBi on hopper against tiled (one GPU, one run, CUDA graphs off).

`PYTHONPATH=src python3 bench/window_speed.py`: bf16, (B, H, S, D) = (1, 16, 16384, 128), causal;
prints TFLOP/s of the visible (query, key) pairs for each variant and the ratio hopper / tiled.
"""
import torch
import triton

import fmha

B, H, S, D = 1, 16, 16384, 128
q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
slopes = torch.tensor([2 ** -(i + 1) for i in range(H)], device="cuda")
cases = {"window (1024, 0)": dict(window=(1024, 0)), "softcap 30": dict(softcap=30.0),
         "alibi": dict(alibi_slopes=slopes)}
for name, kw in cases.items():
    left = kw.get("window", (-1, -1))[0]
    pairs = sum(min(i, left) + 1 if left >= 0 else i + 1 for i in range(S))
    flops = 4 * B * H * D * pairs
    ms = {var: triton.testing.do_bench(lambda: fmha.attention(q, k, v, causal=True, variant=var, **kw),
                                       return_mode="median") for var in ("hopper", "tiled")}
    print(f"{name:18s} hopper {flops / ms['hopper'] * 1e-9:6.0f} TFLOP/s  tiled {flops / ms['tiled'] * 1e-9:6.0f}"
          f"  hopper/tiled {ms['tiled'] / ms['hopper']:.2f}x")
