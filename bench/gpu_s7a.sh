#!/usr/bin/env bash
# Session 7, call 1 (nvidia-h200-x2).  The probabilities' exp2 shared between the SFU and the FMA units
# (KernelConfig.exp_poly: 1 of every 2, 4 or 8 by a polynomial), each cell's table config with and without
# it, cuDNN in the same run.  GPU 0: the D=64 half of the default grid, bf16 (where the softmax is the bound);
# GPU 1 (2 s later: another run_id): the D=128 half, then the hopper tests of the exp_poly configs.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
ab() {
  local limit=$1 ledger=$2; shift 2
  timeout "$limit" python3 -m fmha bench --cuda-graphs --dtype bfloat16 --ledger "$ledger" "$@" 2>&1 | clean
}
(export CUDA_VISIBLE_DEVICES=0
 ab 560 $OUT/ledger0.csv --where head_dim=64 --providers fmha:auto "fmha:hopper[exp_poly=2]" \
   "fmha:hopper[exp_poly=4]" "fmha:hopper[exp_poly=8]" "fmha:hopper[exp_poly=4,pingpong=1]" sdpa:cudnn \
   > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1
 sleep 2
 ab 330 $OUT/ledger1.csv --where head_dim=128 --providers fmha:auto "fmha:hopper[exp_poly=4]" \
   "fmha:hopper[exp_poly=8]" sdpa:cudnn > $OUT/gpu1.txt
 timeout 200 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py \
   -k "hopper_matches_reference and (e4 or e2 or e8)" 2>&1 | tail -6 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
