#!/usr/bin/env bash
# Session 19, call 6 (nvidia-h200-x2).  Head groups on the short non-causal cells (512 and 1k keys, D=64 and 128,
# bf16 and fp16), the tightest ratios of the grid: the table's rows against head groups of 2 and 4, three rounds on
# each GPU, the provider order turned each round.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
A=(fmha:auto "fmha:hopper[head_group=2]" "fmha:hopper[head_group=4]" sdpa:cudnn)
B=(sdpa:cudnn "fmha:hopper[head_group=4]" "fmha:hopper[head_group=2]" fmha:auto)
run() {  # GPU, tag, rounds of provider lists
  local gpu=$1 tag=$2; shift 2
  for order in "$@"; do
    local -n list=$order
    CUDA_VISIBLE_DEVICES=$gpu FMHA_RUN_TAG=$tag timeout 100 python3 -m fmha bench --cuda-graphs --dtype bfloat16 float16 \
      --where "causal=0 seqlen_k=512,1024" --ledger $OUT/ledger$gpu.csv --providers "${list[@]}" 2>&1 | clean
  done > $OUT/gpu$gpu.txt
}
run 0 "" A B A &
run 1 gpu1 B A B &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
