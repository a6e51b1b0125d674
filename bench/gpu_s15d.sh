#!/usr/bin/env bash
# Session 15, call 4 (nvidia-h200-x2).  FlashAttention-4's sm_90 forward at head_dim 128 runs 128 x 128 tiles, P
# in registers, the intra-warpgroup overlap, the warp scheduler barrier (ping-pong) and one CTA per tile (not
# persistent, no cluster): the same tile as the table's.  So its two structural differences, one program per work
# item (persistent=0) and that with named-barrier turns (pingpong=2), beside the table.  GPU 0 bf16, GPU 1 fp16,
# D=128 non-causal.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 150 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[persistent=0]" \
   "fmha:hopper[persistent=0,pingpong=2]" sdpa:cudnn --ledger $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 150 --dtype float16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[persistent=0]" \
   "fmha:hopper[persistent=0,pingpong=2]" sdpa:cudnn --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
