#!/usr/bin/env bash
# Session 6, call 6 (nvidia-h200-x2).  Packed sequences: back to call 4's work list (single blocks, costliest
# first, heads innermost, dealt snake-wise; call 5's pairs per sequence were slower), and every partition now
# loads the next item's place and lengths while it runs the current one (two dependent loads an item, the work
# list then cu_seqlens, were on the critical path).  GPU 0: the varlen/seqused tests.  GPU 1 (after them): the
# varlen benchmark at random lengths and 2048x32.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
quiet() { grep -v "^W1129\|Warning\|return torch\|^  warnings\|_warn_once\|skipped: ModuleNotFound"; }
export CUDA_VISIBLE_DEVICES=0
timeout 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_varlen.py \
  -k "varlen or seqused or per_sequence or work_list or (hopper and k1537)" 2>&1 | tail -8
export CUDA_VISIBLE_DEVICES=1
for lengths in random 2048x32; do
  timeout 100 python3 bench/varlen_speed.py --lengths $lengths --ledger $OUT/ledger1.csv 2>&1 | quiet \
    | grep -v "sdpa-jagged:cudnn\|sdpa-jagged:eff"
done
