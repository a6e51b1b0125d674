#!/usr/bin/env bash
# Session 4, call 3 (nvidia-h200-x2, about 440 s): the grids with the final tables, one dtype per GPU
# (ratios within a GPU), the decode grid and the hopper table's tests; then, for the next session,
# D=64 non-causal at long sequences (where FlashAttention-4 leads) and a repeat of the head-group /
# ping-pong comparison at D=128 non-causal 1k-4k.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
sweep() {
  local limit=$1; shift
  timeout "$limit" python3 -m fmha sweep --cuda-graphs "$@" 2>&1 | clean | grep -v "^$"
}
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  bench 230 --dtype bfloat16 --ledger $OUT/ledger0.csv
  bench 80 --grid decode --dtype bfloat16 --ledger $OUT/ledger0.csv
  timeout 100 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests/test_gpu.py \
    -k "test_hopper_matches_reference and None" 2>&1 | tail -5
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  bench 230 --dtype float16 --ledger $OUT/ledger1.csv
  sweep 80 --variant hopper --grid default --where "head_dim=64 causal=0 seqlen_q=4096,16384" \
    --ledger $OUT/ledger1.csv --space "block_m=192 block_n=128 num_stages=2,3,4 pingpong=0,1"
  sweep 50 --variant hopper --grid default --where "head_dim=64 causal=0 seqlen_q=4096,16384" \
    --ledger $OUT/ledger1.csv --space "block_m=128 block_n=256 num_stages=2 pingpong=0,1"
  sweep 80 --variant hopper --grid default --where "head_dim=128 causal=0 seqlen_q=1024,2048,4096" \
    --ledger $OUT/ledger1.csv --space "block_m=128 block_n=128 num_stages=2 pingpong=0,1 head_group=0,4"
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -45 $OUT/gpu0.txt; tail -45 $OUT/gpu1.txt
