#!/usr/bin/env bash
# Session 15, call 1 (nvidia-h200-x2).  The row sums from the tensor cores (KernelConfig.mma_sum: P times a
# 128 x 8 block of ones, eight m64n8k16 wgmmas behind each P V) instead of 64 float adds a thread per key tile:
# the steady loop's SASS falls from 479 to 430 instructions.  GPU 0: D=128 non-causal bf16 beside the table,
# then half of the mma_sum configs' GPU tests; GPU 1: D=128 causal and D=64 non-causal bf16, then the other half.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
cases() {  # every other hopper GPU test id of the mma_sum configs, from $1 (0 or 1)
  python3 -m pytest --collect-only -q tests/test_gpu.py 2>/dev/null | grep -E "(\[m[0-9]+n[0-9]+w4s[0-9][a-z0-9]*u-|rescales.*u-)" \
    | awk "NR % 2 == $1"
}
(export CUDA_VISIBLE_DEVICES=0
 bench 120 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[mma_sum=1]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout 110 python3 -m pytest -q -x $(cases 0) 2>&1 | tail -4 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 70 --dtype bfloat16 --where "head_dim=128 causal=1" --providers fmha:auto "fmha:hopper[mma_sum=1]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 50 --dtype bfloat16 --where "head_dim=64 causal=0" --providers fmha:auto "fmha:hopper[mma_sum=1]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 timeout 110 python3 -m pytest -q -x $(cases 1) 2>&1 | tail -4 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
