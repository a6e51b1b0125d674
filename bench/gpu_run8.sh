#!/usr/bin/env bash
# Eighth and ninth H200 calls: the default grid with the final hopper configs.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 280 python3 -m fmha bench --ledger $OUT/ledger.csv --providers fmha:auto fmha:hopper fmha:tiled sdpa:cudnn sdpa:flash 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench.txt
