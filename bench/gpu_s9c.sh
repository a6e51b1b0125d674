#!/usr/bin/env bash
# Session 9, call 3 (nvidia-h200-x2).  The final table (split_tail at D=128 non-causal 4k-16k): GPU 0 the
# hopper tests with modifiers and lengths per sequence, the bf16 grid again, then D=64 causal with 192
# rows beside the table.  GPU 1: the fp16 grid again, D=64 non-causal with 3 stages or the fence beside
# the table, the extra grid and the decode grid.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
ab() {
  local limit=$1; shift
  timeout "$limit" python3 -m fmha bench --cuda-graphs "$@" 2>&1 | clean
}
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_paged.py -k \
   "split_tail or hopper_features or hopper_ragged or (hopper and (varlen or seqused or paged or lengths)) or features_at_gpu" \
   2>&1 | tail -6 > $OUT/gpu0.txt
 bench 230 --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt
 ab 120 --dtype bfloat16 --ledger $OUT/ledger0.csv --where "head_dim=64 causal=1" --providers fmha:auto \
   "fmha:hopper[block_m=192,q_regs=0]" "fmha:hopper[block_m=192,q_regs=0,persistent=0]" sdpa:cudnn >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 230 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 ab 110 --dtype bfloat16 --ledger $OUT/ledger1.csv --where "head_dim=64 causal=0" --providers fmha:auto \
   "fmha:hopper[num_stages=3]" "fmha:hopper[fence=1]" "fmha:hopper[num_stages=3,fence=1]" sdpa:cudnn >> $OUT/gpu1.txt
 bench 100 --dtype bfloat16 --grid extra --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 bench 90 --dtype bfloat16 --grid decode --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
