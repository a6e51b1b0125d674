#!/usr/bin/env bash
# Session 19, call 7 (nvidia-h200-x2).  The default grid at the final table (head groups of 2 on the 512-key row):
# bf16 on GPU 0, fp16 on GPU 1.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 290 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 290 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
