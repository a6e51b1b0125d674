"""Each variant once on an odd shape, for compute-sanitizer (memcheck, racecheck).

`compute-sanitizer --tool racecheck python3 bench/sanitize_case.py [VARIANT ...]` (default: every variant).
"""
import sys

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha

for variant, (sq, sk, d) in [("singlewave", (113, 203, 96)), ("pipelined", (113, 203, 96)),
                             ("tiled", (113, 203, 96)), ("hopper", (113, 256, 64)), ("hopper", (113, 256, 128))]:
    if sys.argv[1:] and variant not in sys.argv[1:]:
        continue
    for causal in (False, True):
        q = torch.randn(1, 4, sq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(1, 2, sk, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(1, 2, sk, d, device="cuda", dtype=torch.bfloat16)
        o = fmha.attention(q, k, v, causal=causal, causal_align="bottom_right", variant=variant)
        with sdpa_kernel(SDPBackend.MATH):  # the reference must not bring its own shared-memory kernel
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1),
                attn_mask=torch.ones(sq, sk, dtype=torch.bool, device="cuda").tril(sk - sq) if causal else None)
        err = ((o.float() - ref).norm() / ref.norm()).item()
        print(f"{variant} sq={sq} sk={sk} d={d} causal={causal} rel err {err:.1e}", flush=True)
