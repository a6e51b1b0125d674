#!/usr/bin/env bash
# Session 17, call 4 (nvidia-h200-x2).  The final grids with the PTX pass v7 (no warpgroup bar.sync before the
# consumers' releases and ring waits on the cluster path).  GPU 0: the default and extra grids bf16.  GPU 1: the
# cluster tests of v7, then the default and extra grids fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 310 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 bench 180 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 95 python3 -m pytest -q -n 12 -rf --tb=line -p no:cacheprovider tests/test_gpu.py -k cluster 2>&1 \
   | grep -v "Warning\|warner" > $OUT/gpu1.txt
 bench 310 --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 bench 150 --grid extra --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
