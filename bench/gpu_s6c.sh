#!/usr/bin/env bash
# Session 6, call 3 (nvidia-h200-x2).  Why packed sequences run at 0.75-0.8 of the dense kernel: GPU 1 times
# varlen against the same batch dense (equal lengths, 2048 and 2000 rows: no tail / a tail in every
# sequence) and the persistent schedule against one program per work item (hopper-p0), then the random
# lengths again.  GPU 0: the fp16 default grid at this commit.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
quiet() { grep -v "^W1129\|Warning\|return torch\|^  warnings\|_warn_once"; }
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  bench 260 --dtype float16 --ledger $OUT/ledger0.csv
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  for lengths in 2048x32 2000x32 random; do
    timeout 120 python3 bench/varlen_speed.py --lengths $lengths --ledger $OUT/ledger1.csv 2>&1 | quiet \
      | grep -v "skipped: ModuleNotFound"
  done
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -34 $OUT/gpu0.txt; cat $OUT/gpu1.txt
