#!/usr/bin/env bash
# Session 15, call 2 (nvidia-h200-x2).  256-key tiles at head_dim 64: Q K^T as one m64n256k16 wgmma a k-step,
# so Q's operand bytes per FLOP fall by half (call 1's m64n8k16 row sums, 19% more operand bytes a tile, lost
# 3.5%).  At D=64 two consumer warpgroups hold S (128 registers), P (64) and O (32): 12 spill instructions in
# the 829-instruction loop.  GPU 0: D=64 non-causal bf16 beside the table (192 rows ping-pong), then half of the
# n256 configs' GPU tests; GPU 1: D=64 causal bf16 and non-causal fp16, then the other half.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
N256="block_m=128,block_n=256,pingpong=0,occupancy=0,q_regs=0"
cases() {  # every other hopper GPU test id of the 256-key configs at head_dim 64, from $1 (0 or 1)
  python3 -m pytest --collect-only -q tests/test_gpu.py 2>/dev/null | grep -E "\[m128n256w4s[0-9][a-z0-9]*-.*d64\]" \
    | awk "NR % 2 == $1"
}
(export CUDA_VISIBLE_DEVICES=0
 bench 130 --dtype bfloat16 --where "head_dim=64 causal=0" --providers fmha:auto "fmha:hopper[$N256]" \
   "fmha:hopper[$N256,fence=1,lazy=1]" "fmha:hopper[$N256,num_stages=3]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout 120 python3 -m pytest -q $(cases 0) 2>&1 | tail -4 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 80 --dtype bfloat16 --where "head_dim=64 causal=1" --providers fmha:auto "fmha:hopper[$N256]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 60 --dtype float16 --where "head_dim=64 causal=0" --providers fmha:auto "fmha:hopper[$N256]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 timeout 110 python3 -m pytest -q $(cases 1) 2>&1 | tail -4 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
