#!/usr/bin/env bash
# Session 3, call 2, on nvidia-h200-x2 (one stream per GPU; ratios are taken within a GPU):
# GPU 0 checks the paired causal schedule and the one-launch split-key merge, then times decoding;
# GPU 1 sweeps the causal schedules and the decode tiles, then times the bf16 grid.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
clean() { tr '\r' '\n' | grep -v '^\['; }
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 330 python3 -m pytest -q -n 14 -p no:benchmark -rfE tests/test_gpu.py tests/test_decode.py 2>&1 | tail -15
  timeout 110 python3 -m fmha bench --grid decode --cuda-graphs --dtype bfloat16 \
    --providers fmha:auto sdpa:cudnn sdpa:flash --ledger $OUT/ledger0.csv 2>&1 | clean
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout 130 python3 -m fmha sweep --variant hopper --grid default --where causal=1 --cuda-graphs \
    --space "block_m=128 block_n=128 num_stages=2 persistent=0,1" --ledger $OUT/ledger1.csv 2>&1 | clean | tail -10
  timeout 90 python3 -m fmha sweep --variant tiled --grid decode --where seqlen_q=1 --cuda-graphs \
    --space "block_m=16 block_n=64,128 num_warps=4 num_stages=3,4 split_per_sm=2,4,8" \
    --ledger $OUT/ledger1.csv 2>&1 | clean | tail -5
  timeout 250 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --providers fmha:auto sdpa:cudnn sdpa:flash \
    --ledger $OUT/ledger1.csv 2>&1 | clean
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
cat $OUT/gpu0.txt | tail -45; tail -48 $OUT/gpu1.txt
