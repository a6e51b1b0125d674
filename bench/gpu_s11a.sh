#!/usr/bin/env bash
# Session 11, call 1 (nvidia-h200-x2).  64-row programs (one consumer warpgroup), 2 or 3 per SM
# (`occupancy`), on D=64 causal beside the table: GPU 0 their GPU tests, then bf16; GPU 1 fp16, then
# decoding at 2-3 programs per SM with shallower rings or 32-key tiles (so two or three fit), 1 query row.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
AB="fmha:auto sdpa:cudnn fmha:hopper[block_m=64,occupancy=2] fmha:hopper[block_m=64,block_n=64,occupancy=2]
    fmha:hopper[block_m=64,block_n=64,occupancy=3]"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k "m64n" 2>&1 | tail -6 > $OUT/gpu0.txt
 bench 200 --dtype bfloat16 --where "head_dim=64 causal=1" --providers $AB --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 200 --dtype float16 --where "head_dim=64 causal=1" --providers $AB --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 120 --grid decode --dtype bfloat16 --where "seqlen_q=1" --providers fmha:auto sdpa:cudnn \
   "fmha:tiled[split_per_sm=2,num_stages=3]" "fmha:tiled[split_per_sm=2,num_stages=2]" \
   "fmha:tiled[split_per_sm=2,block_n=32]" "fmha:tiled[split_per_sm=3,block_n=32,num_stages=3]" \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
