#!/usr/bin/env bash
# Session 13, call 4 (nvidia-h200-x2).  The final grids at the session's closing code (the kernels as at 9aa86bf,
# this session's experiments reverted): the default grid against cuDNN and SDPA's flash, GPU 0 bf16, GPU 1 fp16;
# then the extra grid (GQA 32/8, 2k queries on 8k keys, 128k) in the same dtype, last run in session 11.
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
