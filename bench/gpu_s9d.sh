#!/usr/bin/env bash
# Session 9, call 4 (nvidia-h200-x2).  The final table (D=64 causal past 4k keys: 192 rows, persistent pairs):
# GPU 0 the hopper reference test on 192-row configs, then the bf16 grid; GPU 1 the fp16 grid.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 70 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "hopper_matches_reference and m192n128w4s2-" 2>&1 | tail -4 > $OUT/gpu0.txt
 bench 220 --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 220 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
