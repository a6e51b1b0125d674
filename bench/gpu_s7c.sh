#!/usr/bin/env bash
# Session 7, call 3 (nvidia-h200-x2).  Three K/V stages at D=128, O stored from registers (no room to stage
# it): each cell's table config with num_stages=3 against the table and cuDNN in one run.  GPU 0: the D=128
# half of the default grid, bf16 then fp16.  GPU 1 (run_id tagged gpu1): the tests that run 3 stages at D=128
# (and the paged ones), then the extra grid (GQA, seqlen_q != seqlen_k, 128k) bf16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
ab() {
  local limit=$1 ledger=$2; shift 2
  timeout "$limit" python3 -m fmha bench --cuda-graphs --ledger "$ledger" \
    --providers fmha:auto "fmha:hopper[num_stages=3]" sdpa:cudnn "$@" 2>&1 | clean
}
(export CUDA_VISIBLE_DEVICES=0
 ab 270 $OUT/ledger0.csv --where head_dim=128 --dtype bfloat16 > $OUT/gpu0.txt
 ab 270 $OUT/ledger0.csv --where head_dim=128 --dtype float16 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 200 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_paged.py -k \
   "(hopper_matches_reference and m128n128w4s3) or refuses_what or hopper_paged or (hopper_features and d128)" \
   2>&1 | tail -6 > $OUT/gpu1.txt
 ab 300 $OUT/ledger1.csv --grid extra --dtype bfloat16 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
