#!/usr/bin/env bash
# Eighth H200 call: the default grid with the final hopper configs.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 330 python3 -m fmha bench --ledger $OUT/ledger.csv --providers fmha:auto fmha:hopper sdpa:cudnn sdpa:flash 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench.txt
