#!/usr/bin/env bash
# Session 2, H200 run 2: persistent hopper kernel, packed-GQA decoding, fused merge, ring over gloo on one GPU.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 60 python3 - <<'PY' 2>&1 | tail -5 | tee $OUT/smoke.txt
import torch, fmha
for d, c, s in [(128, False, 1000), (64, True, 4096), (128, True, 777)]:
    q, k, v = (torch.randn(2, 4, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    k, v = k[:, :, :s // 128 * 128], v[:, :, :s // 128 * 128]
    o = fmha.attention(q, k, v, causal=c, variant="hopper")
    r = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=c)
    print(d, c, s, (o.float() - r).abs().max().item())
PY
timeout 220 python3 -m pytest -q -n 14 -p no:benchmark -rfE tests > $OUT/gpu_tests_full.txt 2>&1; tail -15 $OUT/gpu_tests_full.txt
timeout 40 torchrun --nproc-per-node 2 examples/ring_attention.py --backend gloo --causal --seqlen 8192 2>&1 | grep -v Warn | tail -4 | tee $OUT/ring_gloo.txt
timeout 90 python3 -m fmha bench --grid decode --dtype bfloat16 --cuda-graphs --providers fmha:auto sdpa:cudnn sdpa:flash sdpa:efficient --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[\|Warning\|scaled_dot' | tee $OUT/bench_decode.txt
timeout 200 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --providers fmha:auto sdpa:cudnn sdpa:flash --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_graphs.txt
