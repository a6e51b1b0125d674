#!/usr/bin/env bash
# Session 11, call 2 (nvidia-h200-x2).  64-row programs, 2-4 per SM, beside the table on every default-grid
# cell (at D=128 only the 64-key tiles with 2 per SM fit in shared memory; the others fail there and say so):
# GPU 0 bf16, GPU 1 fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
AB="fmha:auto sdpa:cudnn fmha:hopper[block_m=64,block_n=64,occupancy=3,pingpong=0]
    fmha:hopper[block_m=64,occupancy=2,pingpong=0] fmha:hopper[block_m=64,block_n=64,occupancy=2,pingpong=0]
    fmha:hopper[block_m=64,block_n=64,occupancy=4,q_regs=0,pingpong=0]"
(export CUDA_VISIBLE_DEVICES=0
 bench 520 --dtype bfloat16 --providers $AB --ledger $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 520 --dtype float16 --providers $AB --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
