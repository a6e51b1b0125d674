#!/usr/bin/env bash
# Session 5, call 3 (nvidia-h200-x2, about 400 s): hopper with K/V through 3-D TMA descriptors, so any
# seqlen_k runs on it (a ragged last key tile reads zeros and is masked), new.
# GPU 0: the hopper GPU tests (the table's configs on every shape, every config on the ragged shapes,
# the features, the NaN-neighbour test).  GPU 1: the bf16 grid again (the default path now reads K/V
# through 3-D boxes), then the ragged grid (hopper against tiled and cuDNN).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests/test_gpu.py \
    -k "hopper and (None or k1537 or k77 or features or ragged)" 2>&1 | tail -25
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  bench 225 --dtype bfloat16 --ledger $OUT/ledger1.csv
  timeout 140 python3 -m fmha bench --cuda-graphs --grid ragged --dtype bfloat16 --ledger $OUT/ledger1.csv \
    --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:flash 2>&1 | clean
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -30 $OUT/gpu0.txt; tail -70 $OUT/gpu1.txt
