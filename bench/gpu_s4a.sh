#!/usr/bin/env bash
# Session 4, call 1 (written at the end of session 3 as gpu_next.sh).
# On nvidia-h200-x2: `bash bench/gpu_s4a.sh` (about 540 s), one stream per GPU; ratios are taken within a GPU.
# GPU 0: the whole GPU suite (no full run completed in session 3; it now covers ping-pong too); GPU 1: the
# ping-pong sweep, then the grids with the final tables (D=64 non-causal up to 1k keys now takes 128-row
# blocks: measured by sweep only).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 540 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests 2>&1 | tail -25
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  # FA3's ping-pong between the consumer warpgroups (session 3 built it, never timed): every grid cell
  timeout 170 python3 -m fmha sweep --variant hopper --grid default --cuda-graphs \
    --space "block_m=128 block_n=128 num_stages=2 pingpong=0,1" --ledger $OUT/ledger1.csv 2>&1 | clean | tail -26
  # the cells still below cuDNN (D=64, S <= 1k): deeper K/V rings fit at D=64 (98/131/164 KB at 2/3/4 stages)
  timeout 150 python3 -m fmha sweep --variant hopper --grid default --cuda-graphs --where "head_dim=64 \
    seqlen_q=512,1024" --space "block_m=128,192 block_n=128 num_stages=2,3,4 pingpong=0,1" \
    --ledger $OUT/ledger1.csv 2>&1 | clean | tail -6
  bench 200 --dtype bfloat16 --ledger $OUT/ledger1.csv
}
gpu0 > $OUT/gpu0_tests.txt 2>&1 &
gpu1 > $OUT/gpu1_bench.txt 2>&1 &
wait
tail -25 $OUT/gpu0_tests.txt; tail -75 $OUT/gpu1_bench.txt
