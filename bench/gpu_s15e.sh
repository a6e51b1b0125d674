#!/usr/bin/env bash
# Session 15, call 5 (nvidia-h200-x2).  192-row programs at head_dim 128 (1.5x the FLOPs per K/V byte from L2,
# about 5 TB/s at 16k keys with 128 rows): FlashAttention-3's ping-pong without the overlap inside a warpgroup
# (KernelConfig.pingpong=2: each warpgroup waits for its P V before its softmax, so S and P never live together
# and three warpgroups fit in 160 registers: 17 spill instructions in the 538 of the loop, against 644 spilled
# bytes with the overlap).  GPU 0: D=128 non-causal bf16 beside the table; GPU 1: the same, then the GPU tests
# of the pingpong=2 configs at head_dim 128.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
P192="fmha:hopper[block_m=192,pingpong=2,fence=0]"
cases() {  # the hopper GPU test ids of the pingpong=2 configs at head_dim 128, every other from $1 (0 or 1)
  python3 -m pytest --collect-only -q tests/test_gpu.py 2>/dev/null | grep -E "\[m[0-9]+n128w4s2ps[a-z0-9]*-.*d128\]" \
    | awk "NR % 2 == $1"
}
(export CUDA_VISIBLE_DEVICES=0
 bench 140 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "$P192" \
   "fmha:hopper[block_m=192,pingpong=2,fence=0,lazy=0]" "fmha:hopper[pingpong=2,fence=0]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout 100 python3 -m pytest -q $(cases 0) 2>&1 | tail -4 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 90 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "$P192" sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 timeout 140 python3 -m pytest -q $(cases 1) 2>&1 | tail -4 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
