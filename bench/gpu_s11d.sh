#!/usr/bin/env bash
# Session 11, call 4 (nvidia-h200-x2), the final code.  GPU 0: the GPU tests of window/softcap/ALiBi and packed
# sequences (now with cases up to 512 keys, the 64-row programs), then the bf16 default grid and the decode grid.
# GPU 1: the fp16 default grid, then the extra grid (GQA, seqlen_q != seqlen_k, 128k keys).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 110 python3 -m pytest -q -n 8 -p no:benchmark -rfE tests/test_gpu.py \
   -k "features or varlen_matches" 2>&1 | tail -4 > $OUT/gpu0.txt
 bench 300 --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt
 bench 110 --grid decode --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 340 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 170 --grid extra --dtype bfloat16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
