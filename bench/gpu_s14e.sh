#!/usr/bin/env bash
# Session 14, call 5 (nvidia-h200-x2).  Chained items again, now with the next item's Q loaded during this item's
# key loop (KernelConfig.q_ahead, with Q in registers): call 2's chained items waited at every item boundary for a
# Q the producer had only just asked for.  GPU 0: D=128 non-causal bf16 beside the table, then the GPU tests of the
# q_ahead configs; GPU 1: D=128 causal bf16 beside the table, then the chained ones' tests.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
cases() {  # hopper GPU test ids whose config string ends in $1
  python3 -m pytest --collect-only -q tests/test_gpu.py 2>/dev/null | grep -E "\[m[0-9]+n[0-9]+w4s[0-9][a-z0-9]*$1-" | awk "NR % 4 == 0"
}
(export CUDA_VISIBLE_DEVICES=0
 bench 110 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[q_regs=1,q_ahead=1]" \
   "fmha:hopper[q_regs=1,q_ahead=1,chain=1]" sdpa:cudnn --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout 70 python3 -m pytest -q -x $(cases a) 2>&1 | tail -4 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 100 --dtype bfloat16 --where "head_dim=128 causal=1" --providers fmha:auto "fmha:hopper[q_ahead=1]" \
   "fmha:hopper[q_ahead=1,chain=1]" sdpa:cudnn --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 timeout 80 python3 -m pytest -q -x $(cases ca) 2>&1 | tail -4 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
