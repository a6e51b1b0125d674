#!/usr/bin/env bash
# Session 6, call 2 (nvidia-h200-x2).  Varlen/seqused: the V tile past a sequence's end is zeroed at the
# next item's start (call 1 waited for it at once).  Decoding: the split launch releases the merge by
# programmatic dependent launch as soon as its programs have started.  GPU 0: the tests of both, then the
# bf16 default grid.  GPU 1: decode kernel times, the PDL A/B sweep, the decode grid, then (after GPU 0's
# tests, which starve the host) the varlen benchmark.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 240 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_varlen.py \
    tests/test_paged.py tests/test_decode.py -k "varlen or seqused or per_sequence or paged or decode or graph" \
    2>&1 | tail -15
  touch $OUT/tests_done
  bench 260 --dtype bfloat16 --ledger $OUT/ledger0.csv
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout 60 python3 bench/decode_profile.py 2>&1 | grep -v warn
  sweep 90 --variant tiled --grid decode --where "seqlen_q=1" --dtype bfloat16 --ledger $OUT/ledger1.csv \
    --space "block_m=16 block_n=64 num_warps=4 num_stages=4 split_per_sm=1 pdl=0,1"
  bench 150 --grid decode --dtype bfloat16 --ledger $OUT/ledger1.csv
  while [ ! -e $OUT/tests_done ]; do sleep 2; done
  timeout 150 python3 bench/varlen_speed.py --ledger $OUT/ledger1.csv 2>&1 | grep -v "^W1129\|Warning\|return torch"
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -50 $OUT/gpu0.txt; tail -80 $OUT/gpu1.txt
