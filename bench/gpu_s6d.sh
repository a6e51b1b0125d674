#!/usr/bin/env bash
# Session 6, call 4 (nvidia-h200-x2).  Packed sequences on the Gluon kernel take their work from a host-built
# list, longest first, dealt out snake-wise (call 3: the round-robin numbering left causal varlen at 0.56-0.78x
# the same batch dense).  GPU 0: the varlen/seqused tests and the hopper ragged subset, then the extra grid.
# GPU 1 (after GPU 0's tests): the varlen benchmark at random lengths, 2048x32 and 2000x32.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
quiet() { grep -v "^W1129\|Warning\|return torch\|^  warnings\|_warn_once\|skipped: ModuleNotFound"; }
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 200 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_varlen.py \
    -k "varlen or seqused or per_sequence or (hopper and (k1537 or k77 or ragged))" 2>&1 | tail -15
  touch $OUT/tests_done
  bench 200 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  while [ ! -e $OUT/tests_done ]; do sleep 2; done
  for lengths in random 2048x32 2000x32; do
    timeout 100 python3 bench/varlen_speed.py --lengths $lengths --ledger $OUT/ledger1.csv 2>&1 | quiet
  done
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -22 $OUT/gpu0.txt; cat $OUT/gpu1.txt
