#!/usr/bin/env bash
# Fourth H200 call: the whole test suite on the GPU, then the default grid.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 220 python3 -m pytest -q -n 12 -p no:benchmark tests 2>&1 | tail -8 | tee $OUT/gpu_tests.txt
timeout 350 python3 -m fmha bench --ledger $OUT/ledger.csv --providers fmha:auto fmha:hopper fmha:tiled sdpa:cudnn sdpa:flash sdpa:efficient 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench.txt
