#!/usr/bin/env bash
# Session 15, call 6 (nvidia-h200-x2).  The final grids at the session's closing code (src/ as at the session's
# start, 9078b07: session 12's kernels): the default grid against cuDNN and SDPA's flash, GPU 0 bf16, GPU 1 fp16;
# then the extra grid in the same dtype.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 330 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 bench 200 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 330 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 200 --grid extra --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
