#!/usr/bin/env bash
# Session 8, call 1 (nvidia-h200-x2).  P narrowed to 16 bits by packed cvt (no byte permutes at D=64) in
# every config, and Q held in registers (config q_regs=1) A/B against the table's configs, cuDNN in the
# same run.  GPU 0: the hopper tests on both changes, then the default grid in bf16.  GPU 1: fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
ab() {
  local limit=$1 ledger=$2; shift 2
  timeout "$limit" python3 -m fmha bench --cuda-graphs --ledger "$ledger" "$@" \
    --providers fmha:auto "fmha:hopper[q_regs=1]" sdpa:cudnn 2>&1 | clean
}
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "(hopper_matches_reference and (None or m128n128w4s2q or m128n128w4s2ppq)) or hopper_features or hopper_ragged" \
   2>&1 | tail -8 > $OUT/gpu0.txt
 ab 360 $OUT/ledger0.csv --dtype bfloat16 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 ab 360 $OUT/ledger1.csv --dtype float16 > $OUT/gpu1.txt
 ab 180 $OUT/ledger1.csv --dtype bfloat16 --grid extra >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
