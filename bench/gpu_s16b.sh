#!/usr/bin/env bash
# Session 16, call 2 (nvidia-h200-x2).  2-CTA clusters with K/V multicast (KernelConfig.cluster, kernels/multicast.py).
# Each stream first runs one guarded call (a deadlock would hang the whole call), then: GPU 0 the cluster GPU tests
# and power_probe beside the table; GPU 1 the D=128 non-causal cells, bf16 then fp16, beside the table and cuDNN.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
sanity() {
  timeout 90 python3 - <<'PY'
import torch, fmha
q, k, v = (torch.randn(1, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
cfg = fmha.KernelConfig(128, 128, 4, 2, cluster=1, split_tail=1, fence=1, lazy=1)
o = fmha.attention(q, k, v, variant="hopper", config=cfg)
ref = fmha.attention(q, k, v, variant="tiled")
torch.cuda.synchronize()
print("sanity: max |cluster - tiled| =", (o.float() - ref.float()).abs().max().item())
PY
}
(export CUDA_VISIBLE_DEVICES=0
 sanity > $OUT/gpu0.txt 2>&1 && {
 timeout 200 python3 -m pytest -q -x tests/test_gpu.py -k cluster 2>&1 | tail -4 >> $OUT/gpu0.txt
 timeout 150 python3 bench/power_probe.py --seconds 5 --gpu 0 --hopper cluster=1 cluster=1,split_tail=0 >> $OUT/gpu0.txt 2>&1; }) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 sanity > $OUT/gpu1.txt 2>&1 && {
 bench 150 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[cluster=1]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 bench 120 --dtype float16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[cluster=1]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt; }) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
