#!/usr/bin/env bash
# Third H200 call: hopper correctness (2/3 warpgroups, ragged seqlen_q), a hopper sweep, the grid.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -x -n 8 -p no:benchmark tests/test_gpu.py -k hopper 2>&1 | tail -8 | tee $OUT/gpu_hopper_tests.txt
timeout 200 python3 -m fmha sweep --variant hopper --space "block_m=128,192 block_n=64,128 num_stages=2,3" --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/sweep.txt
timeout 400 python3 -m fmha bench --ledger $OUT/ledger.csv --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:flash sdpa:efficient 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench.txt
