#!/usr/bin/env bash
# Session 12, call 3 (nvidia-h200-x2).  FlashAttention-4's conditional rescale (`lazy`: a row's pivot moves
# only when its max grows by more than 2**8, and a thread skips the 64 multiplications of O when both its
# rows kept theirs) beside the table, with and without the fence: GPU 0 bf16, GPU 1 fp16, then GPU 0 the
# GPU tests of the lazy configs (growing keys included).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
AB="fmha:auto fmha:hopper[lazy=1] fmha:hopper[lazy=1,fence=1] sdpa:cudnn"
(export CUDA_VISIBLE_DEVICES=0
 bench 330 --dtype bfloat16 --providers $AB --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout -s INT 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py \
   -k "rescales or (hopper_matches_reference and l-)" 2>&1 | tail -6 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 480 --dtype float16 --providers $AB --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
