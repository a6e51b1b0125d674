#!/usr/bin/env bash
# Session 7, call 4 (nvidia-h200-x2), the final code.  GPU 0: the extra grid (3 stages past 16k keys now in the
# table) and the decode grid, bf16.  GPU 1: the GPU suite but the hopper config product (that one for the
# 3-stage config and the table's configs in bf16 bhsd).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 280 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 bench 200 --grid decode --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 400 python3 -m pytest -q -n 16 -p no:benchmark -rfE -m gpu tests \
   -k "not hopper_matches_reference or m128n128w4s3 or (None and bfloat16 and bhsd)" 2>&1 | tail -8 > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
