#!/usr/bin/env bash
# Session 10, call 4 (nvidia-h200-x2).  The final table (D=64 non-causal past 1k keys: 192 rows with ping-pong;
# D=64 causal up to 16k keys: balance): GPU 0 the hopper reference test on the table's configs (non-causal),
# then the bf16 grid; GPU 1 the fp16 grid, then the decode grid.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 100 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "hopper_matches_reference and None and False" 2>&1 | tail -4 > $OUT/gpu0.txt
 bench 220 --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 220 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 100 --grid decode --dtype bfloat16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
