#!/usr/bin/env bash
# Session 12, call 4 (nvidia-h200-x2).  The table with `lazy` at D=128 non-causal 1k-16k keys: the default
# grid against cuDNN and SDPA's flash, GPU 0 bf16, GPU 1 fp16; then GPU 1 the decode grid with cuDNN's
# decode shape beside the table (call 1's profile: 16 x 128 tiles, 8 splits a (batch, KV head), 256 programs).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 400 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 330 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 150 --grid decode --dtype bfloat16 --where seqlen_q=1 --providers fmha:auto \
   "fmha:tiled[block_n=128,split_per_sm=2]" "fmha:tiled[block_n=128]" sdpa:cudnn --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
