"""Time decoding (seqlen_q = 1) at fixed split counts against cuDNN (one GPU, one run, CUDA graphs).

`PYTHONPATH=src python3 bench/decode_splits.py`: bf16, batch 4, 32 query heads on 8 KV heads, D=128,
the decode grid's key lengths.  For each length: cuDNN's and fmha's automatic split in microseconds,
then fmha at each fixed ``num_splits`` (the default config for that length) as cuDNN's time over
fmha's (> 1: fmha faster).  The automatic choice should sit at the row's best.
"""
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha.bench.timing import graph_median_ms

B, H, KV, D = 4, 32, 8, 128
SPLITS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)
print(f"{'seqlen_k':>8} {'cudnn us':>9} {'auto us':>8} {'auto':>6} " + " ".join(f"{n:>5}" for n in SPLITS))
for seqlen_k in (1024, 8192, 32768, 131072):
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, KV, seqlen_k, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    peer = graph_median_ms(cudnn)
    auto = graph_median_ms(lambda: fmha.attention(q, k, v))
    fixed = [graph_median_ms(lambda n=n: fmha.attention(q, k, v, num_splits=n)) for n in SPLITS]
    print(f"{seqlen_k:>8} {peer * 1e3:>9.2f} {auto * 1e3:>8.2f} {peer / auto:>6.3f} "
          + " ".join(f"{peer / ms:>5.3f}" for ms in fixed) + f"  auto: {fmha.api.describe(q, k, v)}", flush=True)
