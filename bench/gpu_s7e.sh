#!/usr/bin/env bash
# Session 7, call 5 (nvidia-h200-x2).  Decoding with K/V read by TMA (tiled, config tma=1): the decode
# table's config with and without it, cuDNN in the same run.  GPU 0: the decode grid, bf16.  GPU 1: the
# decode tests (the TMA path with packed GQA, splits, seqused_k padding of NaN) on the GPU.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m fmha bench --cuda-graphs --grid decode --dtype bfloat16 --ledger $OUT/ledger0.csv \
   --providers fmha:auto "fmha:tiled[tma=1]" sdpa:cudnn 2>&1 | clean > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 200 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_decode.py tests/test_gpu.py \
   -k "test_decode or tma or decode or graph" 2>&1 | tail -6 > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
