#!/usr/bin/env bash
# Session 8, call 3 (nvidia-h200-x2).  The table with Q in registers and the fence (configs.HOPPER):
# GPU 0: the hopper tests on its configs, then the default grid in bf16 (`bench`: fmha:auto, cuDNN,
# SDPA flash).  GPU 1: the lengths-per-sequence and paged hopper tests, then fp16, then the extra grid.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout 210 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "(hopper_matches_reference and (None or m192n128w4s2z or m128n128w4s3qz)) or hopper_features or hopper_ragged" \
   2>&1 | tail -4 > $OUT/gpu0.txt
 bench 280 --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_paged.py -k \
   "hopper and (varlen or seqused or paged or lengths or m128n128w4s2q-)" 2>&1 | tail -4 > $OUT/gpu1.txt
 bench 250 --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 bench 110 --dtype bfloat16 --grid extra --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
