#!/usr/bin/env bash
# Second H200 call: hopper correctness, then the default grid against the peers.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 300 python3 -m pytest -q -x -n 8 tests/test_gpu.py -k hopper 2>&1 | tail -15 | tee $OUT/gpu_hopper_tests.txt
timeout 420 python3 -m fmha bench --ledger $OUT/ledger.csv --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:flash sdpa:efficient 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench.txt
