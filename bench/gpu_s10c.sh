#!/usr/bin/env bash
# Session 10, call 3 (nvidia-h200-x2).  D=64 with FlashAttention-3's ping-pong (192-row ping-pong read +2% at
# 4k/16k non-causal in one run of session 4) beside the table: GPU 0 bf16, GPU 1 fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
AB="fmha:auto fmha:hopper[pingpong=1] sdpa:cudnn"
(export CUDA_VISIBLE_DEVICES=0
 bench 200 --dtype bfloat16 --where "head_dim=64" --providers $AB --ledger $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 200 --dtype float16 --where "head_dim=64" --providers $AB --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
