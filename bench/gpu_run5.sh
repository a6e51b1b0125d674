#!/usr/bin/env bash
# Fifth H200 call: GQA, seqlen_q != seqlen_k and 128k cells; the demo.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 300 python3 -m fmha bench --grid extra --dtype bfloat16 --ledger $OUT/ledger.csv --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:flash 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_extra.txt
timeout 200 python3 -m fmha demo 2>&1 | tee $OUT/demo.txt
