#!/usr/bin/env bash
# Session 11, call 3 (nvidia-h200-x2).  GPU 0: the GPU tests of the table's configs (64-row rows included) and
# of the split launches (decode, paged, CUDA graphs), then the decode grid with the merge inside the split
# launch (`fmha:tiled[fused_merge=1]`) beside the table.  GPU 1: the default grid, fp16 then bf16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 120 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py \
   -k "hopper_matches_reference and None" 2>&1 | tail -4 > $OUT/gpu0.txt
 timeout -s INT 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_decode.py \
   tests/test_paged.py -k "decode or split or graph or tma or paged or fused or tickets" 2>&1 | tail -4 >> $OUT/gpu0.txt
 bench 150 --grid decode --dtype bfloat16 --providers fmha:auto "fmha:tiled[fused_merge=1]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 260 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 260 --dtype bfloat16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
