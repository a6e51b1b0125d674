#!/usr/bin/env bash
# Session 10, call 6 (nvidia-h200-x2).  balance on and off on every causal cell, at the final code, to check
# session 10's A/B once more (the S=512 cells read -1% bf16 and +2.5% fp16; D=128 no gain): GPU 0 bf16, GPU 1 fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
AB="fmha:hopper[balance=0] fmha:hopper[balance=1] sdpa:cudnn"
(export CUDA_VISIBLE_DEVICES=0
 bench 200 --dtype bfloat16 --where "causal=1" --providers $AB --ledger $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 200 --dtype float16 --where "causal=1" --providers $AB --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
