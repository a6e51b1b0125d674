#!/usr/bin/env bash
# Session 12, call 2 (nvidia-h200-x2).  The softmax's row max and sum folded in column halves first
# (`folds`, independent chains instead of one per row; call 1's profile: the max was one chain of 32
# dependent FMNMX per row, 13% of a consumer's time at D=128 non-causal 16k) beside the table, bf16 on
# both GPUs (compare within a GPU): GPU 0 folds 2 and 3, GPU 1 folds 1 and 3 with the fence.  Then GPU 0
# runs the GPU tests of the folded configs.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 330 --dtype bfloat16 --providers fmha:auto "fmha:hopper[folds=2]" "fmha:hopper[folds=3]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout -s INT 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py \
   -k "hopper_matches_reference and x" 2>&1 | tail -4 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 480 --dtype bfloat16 --providers fmha:auto "fmha:hopper[folds=1]" "fmha:hopper[folds=3,fence=1]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
