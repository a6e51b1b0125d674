#!/usr/bin/env bash
# Session 4, call 4 (nvidia-h200-x2, about 200 s): the half diagonal tile (KernelConfig.trim), new.
# GPU 0: its correctness tests (every hopper test shape, causal and not, with and without ping-pong);
# GPU 1: every causal cell of the default grid, trim=0 against trim=1 in the same run.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 190 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests/test_gpu.py \
    -k "hopper_matches and (m128n128w4s2t or m128n128w4s2ppt)" 2>&1 | tail -15
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout 190 python3 -m fmha sweep --cuda-graphs --variant hopper --grid default --where "causal=1" \
    --ledger $OUT/ledger1.csv --space "block_m=128 block_n=128 num_stages=2 trim=0,1" 2>&1 | clean | grep -v "^$"
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
cat $OUT/gpu0.txt; tail -14 $OUT/gpu1.txt
