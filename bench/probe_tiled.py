"""One-off probe: tiled configs against cuDNN at two grid shapes (bf16)."""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench.flops import attention_flops
from fmha.bench.timing import median_ms, tflops

CFGS = [fmha.KernelConfig(*c) for c in [(128, 64, 4, 3), (128, 64, 8, 3), (128, 128, 8, 3),
                                         (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 4)]]
for (b, h, s, d) in [(4, 16, 4096, 128), (4, 32, 4096, 64)]:
    for causal in (False, True):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        fl = attention_flops(b, h, s, s, d, causal)
        def cud():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        ref = cud().float()
        print(f"({b},{h},{s},{d}) causal={causal} cudnn {tflops(fl, median_ms(cud)):.0f}", flush=True)
        for cfg in CFGS:
            try:
                def fn(cfg=cfg):
                    return fmha.attention(q, k, v, causal=causal, variant="tiled", config=cfg)
                err = ((fn().float() - ref).norm() / ref.norm()).item()
                print(f"   tiled {cfg} {tflops(fl, median_ms(fn)):.0f} err {err:.1e}", flush=True)
            except Exception as e:
                print(f"   tiled {cfg} FAILED {type(e).__name__}: {str(e)[:120]}", flush=True)
