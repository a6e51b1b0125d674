#!/usr/bin/env bash
# Session 5, call 1 (nvidia-h200-x2, about 540 s), one stream per GPU.
# GPU 0: the whole GPU suite (last run whole at c888eb2, before hopper's window/softcap/ALiBi, the
# 4-head-group rows, `overlap` and the split count rounded down).
# GPU 1: decoding at seqlen_q=1 (below cuDNN at 0.93-0.97x): fixed split counts against cuDNN, the
# decode tiles x programs per SM, then the decode grid; `overlap` (never run) on the D=64 cells;
# the features grid (window, softcap, ALiBi; never run).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 500 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests 2>&1 | tail -25
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout 90 python3 bench/decode_splits.py 2>&1
  timeout 120 python3 -m fmha sweep --cuda-graphs --variant tiled --grid decode --where "seqlen_q=1" \
    --ledger $OUT/ledger1.csv --space "block_m=16 block_n=64,128 num_warps=4 num_stages=3,4 split_per_sm=1,2,4" \
    2>&1 | clean | grep -v "^$"
  bench 75 --grid decode --dtype bfloat16 --ledger $OUT/ledger1.csv
  timeout 95 python3 -m fmha sweep --cuda-graphs --variant hopper --grid default --where "head_dim=64" \
    --ledger $OUT/ledger1.csv --space "block_m=128 block_n=128 num_stages=2 overlap=0,1" 2>&1 | clean | grep -v "^$"
  timeout 150 python3 -m fmha bench --cuda-graphs --grid features --dtype bfloat16 --ledger $OUT/ledger1.csv \
    --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:efficient 2>&1 | clean
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -45 $OUT/gpu0.txt; tail -110 $OUT/gpu1.txt
