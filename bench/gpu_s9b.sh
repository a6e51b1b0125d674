#!/usr/bin/env bash
# Session 9, call 2 (nvidia-h200-x2).  The table with split_tail at D=128 non-causal 8k-16k keys (the O
# rescale back in its place).  GPU 0: the split and hopper reference tests (fp16), the bf16 grid, then the
# extra grid with split_tail beside the table at 128k.  GPU 1: the fp16 grid, a D=64 causal S=512 sweep,
# a decode sweep at 8k keys (one query row).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 120 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "split_tail or (hopper_matches_reference and None and float16)" 2>&1 | tail -6 > $OUT/gpu0.txt
 bench 230 --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt
 timeout 150 python3 -m fmha bench --cuda-graphs --ledger $OUT/ledger0.csv --dtype bfloat16 --grid extra \
   --providers fmha:auto "fmha:hopper[split_tail=1]" sdpa:cudnn sdpa:flash 2>&1 | clean >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 230 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 sweep 120 --variant hopper --grid default --dtype bfloat16 --ledger $OUT/ledger1.csv \
   --where "head_dim=64 causal=1 seqlen_q=512" \
   --space "block_m=128 num_stages=2,3 q_regs=1 fence=0,1 persistent=0,1" >> $OUT/gpu1.txt
 sweep 120 --variant tiled --grid decode --dtype bfloat16 --ledger $OUT/ledger1.csv \
   --where "seqlen_q=1 seqlen_k=8192" \
   --space "block_m=16 block_n=64,128 num_warps=2,4,8 num_stages=4,5 split_per_sm=1 tma=1" >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
