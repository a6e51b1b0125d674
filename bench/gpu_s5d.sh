#!/usr/bin/env bash
# Session 5, call 4 (nvidia-h200-x2, about 400 s): the ragged key mask folded into the causal edge's
# select and applied from the tile that holds seqlen_k only (call 3 selected on every tile: D=64 ragged
# cells 0.75-0.90x cuDNN).  GPU 0: the hopper tests on the ragged shapes and features, then the fp16
# grid.  GPU 1: the ragged grid, then the extra grid (GQA, seqlen_q != seqlen_k, one 128k sequence).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 120 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests/test_gpu.py \
    -k "hopper and (k1537 or k77 or features or ragged)" 2>&1 | tail -12
  bench 225 --dtype float16 --ledger $OUT/ledger0.csv
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout 140 python3 -m fmha bench --cuda-graphs --grid ragged --dtype bfloat16 --ledger $OUT/ledger1.csv \
    --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:flash 2>&1 | clean
  bench 190 --grid extra --dtype bfloat16 --ledger $OUT/ledger1.csv
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -45 $OUT/gpu0.txt; tail -45 $OUT/gpu1.txt
