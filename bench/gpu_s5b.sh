#!/usr/bin/env bash
# Session 5, call 2 (nvidia-h200-x2, about 490 s): the grids with the final tables, one dtype per GPU
# (ratios within a GPU); the decode grid with one program per SM; the features grid (cut short in
# call 1); D=64 non-causal short sequences over head groups and ping-pong; decode tiles by warps,
# stages and key-tile size; decode_splits again.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  bench 230 --dtype bfloat16 --ledger $OUT/ledger0.csv
  sweep 70 --variant hopper --grid default --where "head_dim=64 causal=0 seqlen_q=512,1024,2048" \
    --ledger $OUT/ledger0.csv --space "block_m=128 block_n=128 num_stages=2 head_group=0,2,4,8 pingpong=0,1"
  sweep 100 --variant tiled --grid decode --where "seqlen_q=1" --ledger $OUT/ledger0.csv \
    --space "block_m=16 block_n=64,128 num_warps=4,8 num_stages=3,4,5 split_per_sm=1"
  sweep 40 --variant tiled --grid decode --where "seqlen_q=1" --ledger $OUT/ledger0.csv \
    --space "block_m=16 block_n=32 num_warps=4 num_stages=3,4 split_per_sm=1,2"
  timeout 50 python3 bench/decode_splits.py 2>&1
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  bench 230 --dtype float16 --ledger $OUT/ledger1.csv
  bench 80 --grid decode --dtype bfloat16 --ledger $OUT/ledger1.csv
  timeout 170 python3 -m fmha bench --cuda-graphs --grid features --dtype bfloat16 --ledger $OUT/ledger1.csv \
    --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:efficient 2>&1 | clean | grep -v "Warning\|return torch"
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -75 $OUT/gpu0.txt; tail -75 $OUT/gpu1.txt
