#!/usr/bin/env bash
# Session 4, call 2 (nvidia-h200-x2, about 520 s). GPU 0: the GPU suite (the hopper tests now run each
# non-table config in one dtype and layout), then the decode merge by programmatic dependent launch
# (pdl=1) against the plain launch. GPU 1: the item order across heads (head_group) and ping-pong at
# D=128 non-causal, then the D=64 cells still below cuDNN.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
sweep() {
  local limit=$1; shift
  timeout "$limit" python3 -m fmha sweep --cuda-graphs "$@" 2>&1 | clean | grep -v "^$"
}
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 400 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests 2>&1 | tail -25
  sweep 110 --variant tiled --grid decode --where "seqlen_q=1" --ledger $OUT/ledger0.csv \
    --space "block_m=16 block_n=64,128 num_warps=4 num_stages=3,4 split_per_sm=2 pdl=0,1"
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  sweep 190 --variant hopper --grid default --where "head_dim=128 causal=0" --ledger $OUT/ledger1.csv \
    --space "block_m=128 block_n=128 num_stages=2 pingpong=0,1 head_group=0,4,16"
  sweep 110 --variant hopper --grid default --where "head_dim=64 causal=1 seqlen_q=512,1024,2048" \
    --ledger $OUT/ledger1.csv --space "block_m=128 block_n=128 num_stages=2,3,4 pingpong=0,1"
  sweep 90 --variant hopper --grid default --where "head_dim=64 causal=0 seqlen_q=512,1024,2048" \
    --ledger $OUT/ledger1.csv --space "block_m=128 block_n=128 num_stages=2,3 pingpong=0,1"
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -30 $OUT/gpu0.txt; tail -40 $OUT/gpu1.txt
