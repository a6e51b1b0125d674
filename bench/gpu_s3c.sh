#!/usr/bin/env bash
# Session 3, call 3 (the committed grid runs), on nvidia-h200-x2, one stream per GPU (ratios within a GPU):
# GPU 0: the persistent causal pairs on the many-item shapes, then the fp16 grid and the extra grid;
# GPU 1: the bf16 grid, then the decode grid.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
clean() { tr '\r' '\n' | grep -v '^\['; }
bench() {  # bench SECONDS ARGS...
  local limit=$1; shift
  timeout "$limit" python3 -m fmha bench --cuda-graphs --providers fmha:auto sdpa:cudnn sdpa:flash "$@" 2>&1 | clean
}
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 100 python3 -m pytest -q -n 14 -p no:benchmark -rfE tests/test_gpu.py -k "hopper and (b3h23 or b4h16)" \
    2>&1 | tail -4
  bench 250 --dtype float16 --ledger $OUT/ledger0.csv
  bench 120 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  bench 250 --dtype bfloat16 --ledger $OUT/ledger1.csv
  bench 110 --grid decode --dtype bfloat16 --ledger $OUT/ledger1.csv
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -50 $OUT/gpu0.txt; tail -50 $OUT/gpu1.txt
