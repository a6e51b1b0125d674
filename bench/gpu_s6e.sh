#!/usr/bin/env bash
# Session 6, call 5 (nvidia-h200-x2).  Packed sequences on the Gluon kernel: the work list now holds pairs of
# blocks of one sequence, costliest with cheapest, sequence by sequence (call 4 sorted single blocks by cost
# across sequences, heads innermost: D=64 causal lost its K/V reuse).  GPU 0: the varlen/seqused tests and the
# hopper ragged subset.  GPU 1 (after them): the varlen benchmark at random lengths, 2048x32 and 2000x32.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
quiet() { grep -v "^W1129\|Warning\|return torch\|^  warnings\|_warn_once\|skipped: ModuleNotFound"; }
export CUDA_VISIBLE_DEVICES=0
timeout 200 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_varlen.py \
  -k "varlen or seqused or per_sequence or work_list or (hopper and (k1537 or k77 or ragged))" 2>&1 | tail -15
export CUDA_VISIBLE_DEVICES=1
for lengths in random 2048x32 2000x32; do
  timeout 100 python3 bench/varlen_speed.py --lengths $lengths --ledger $OUT/ledger1.csv 2>&1 | quiet
done
