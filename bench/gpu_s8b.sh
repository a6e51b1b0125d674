#!/usr/bin/env bash
# Session 8, call 2 (nvidia-h200-x2).  The softmax kept above the wait for P V (ptxas had moved the
# wgmma wait above the exponentials): the new tree against the previous commit's (bench/ab_old, carried
# for this call only), each with cuDNN in its run, same GPU one after the other; Q in registers
# (q_regs=1) beside.  GPU 0: hopper tests, then bf16.  GPU 1: fp16, then the extra grid.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
grid() {
  local limit=$1 ledger=$2; shift 2
  timeout "$limit" python3 -m fmha bench --cuda-graphs --ledger "$ledger" "$@" 2>&1 | clean
}
NEW="fmha:auto fmha:hopper[q_regs=1] sdpa:cudnn"
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "(hopper_matches_reference and (None or m128n128w4s2q or m128n128w4s2ppq)) or hopper_features or hopper_ragged" \
   2>&1 | tail -8 > $OUT/gpu0.txt
 grid 220 $OUT/ledger0.csv --dtype bfloat16 --providers $NEW >> $OUT/gpu0.txt
 FMHA_GIT_SHA=b9dd8bf FMHA_RUN_TAG=old PYTHONPATH=bench/ab_old/src \
   grid 160 $OUT/ledger0.csv --dtype bfloat16 --providers fmha:auto sdpa:cudnn >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 grid 220 $OUT/ledger1.csv --dtype float16 --providers $NEW > $OUT/gpu1.txt
 FMHA_GIT_SHA=b9dd8bf FMHA_RUN_TAG=gpu1-old PYTHONPATH=bench/ab_old/src \
   grid 160 $OUT/ledger1.csv --dtype float16 --providers fmha:auto sdpa:cudnn >> $OUT/gpu1.txt
 grid 150 $OUT/ledger1.csv --dtype bfloat16 --grid extra --providers $NEW >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
