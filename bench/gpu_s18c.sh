#!/usr/bin/env bash
# Session 18, call 3 (nvidia-h200-x2).  The final grids with the D=128 non-causal cluster row in head groups of 2.
# GPU 0: the default and extra grids bf16.  GPU 1: the default and extra grids fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 310 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 bench 180 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 310 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 180 --grid extra --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
