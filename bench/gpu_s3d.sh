#!/usr/bin/env bash
# Session 3, call 4, on nvidia-h200-x2 (one stream per GPU; ratios within a GPU): hopper's O store now
# runs under the next item's key loop; decoding below 32k keys takes 3 stages and 2 programs per SM.
# GPU 0: the bf16 grid, then the decode grid; GPU 1: the fp16 grid, then a D=64 tile sweep.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
clean() { tr '\r' '\n' | grep -v '^\['; }
bench() {  # bench SECONDS ARGS...
  local limit=$1; shift
  timeout "$limit" python3 -m fmha bench --cuda-graphs --providers fmha:auto sdpa:cudnn sdpa:flash "$@" 2>&1 | clean
}
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  bench 200 --dtype bfloat16 --ledger $OUT/ledger0.csv
  bench 80 --grid decode --dtype bfloat16 --ledger $OUT/ledger0.csv
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  bench 240 --dtype float16 --ledger $OUT/ledger1.csv
  # for the next session: D=64 non-causal short sequences, 128 rows (no padded rows) against 192
  timeout 45 python3 -m fmha sweep --variant hopper --grid default --cuda-graphs --where "head_dim=64 causal=0 \
    seqlen_q=512,1024,2048" --space "block_m=128,192 block_n=128 num_stages=2" --ledger $OUT/ledger1.csv 2>&1 | clean
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -50 $OUT/gpu0.txt; tail -32 $OUT/gpu1.txt
