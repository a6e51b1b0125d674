#!/usr/bin/env bash
# Session 2, H200 run 3 (two calls: `bash bench/gpu_run10.sh a`, then `... b`): the ledger run.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
if [ "$1" = a ]; then
  timeout 80 python3 -m pytest -q -n 14 -p no:benchmark -rfE tests/test_gpu.py -k "hopper_matches or decode or paged" > $OUT/gpu_tests.txt 2>&1; tail -8 $OUT/gpu_tests.txt
  timeout 90 python3 -m fmha bench --grid decode --dtype bfloat16 --cuda-graphs --providers fmha:auto sdpa:cudnn sdpa:flash sdpa:efficient --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[\|Warning\|scaled_dot' | tee $OUT/bench_decode.txt
  timeout 60 python3 bench/host_profile.py 2>&1 | head -60 | tee $OUT/host_profile.txt
  timeout 150 python3 -m fmha bench --cuda-graphs --dtype float16 --providers fmha:auto sdpa:cudnn sdpa:flash --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_fp16.txt
else
  timeout 170 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --providers fmha:auto sdpa:cudnn sdpa:flash --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_bf16.txt
  timeout 100 python3 -m fmha bench --grid extra --cuda-graphs --dtype bfloat16 --providers fmha:auto sdpa:cudnn sdpa:flash --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_extra.txt
fi
