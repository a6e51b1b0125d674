#!/usr/bin/env bash
# Seventh H200 call: racecheck after the O-staging change, hopper tests, a stages sweep.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 120 compute-sanitizer --tool racecheck python3 bench/sanitize_case.py > $OUT/sanitizer_racecheck.txt 2>&1
grep -E "SUMMARY|Race reported" $OUT/sanitizer_racecheck.txt | cut -c1-150 | sort | uniq -c
timeout 150 python3 -m pytest -q -x -n 8 -p no:benchmark tests/test_gpu.py -k hopper 2>&1 | tail -3 | tee $OUT/gpu_hopper_tests.txt
timeout 150 python3 -m fmha sweep --variant hopper --space "block_m=128,192 block_n=128 num_stages=2,3" --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/sweep.txt
