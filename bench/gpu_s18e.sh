#!/usr/bin/env bash
# Session 18, call 5 (nvidia-h200-x2).  Does the final grid reproduce?  The default grid bf16 on both GPUs at once
# (the final kernels and table, as call 3's grid on GPU 0).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 330 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 330 --dtype bfloat16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
