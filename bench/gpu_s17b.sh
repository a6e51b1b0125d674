#!/usr/bin/env bash
# Session 17, call 2 (nvidia-h200-x2).  What might still lift D=128 non-causal at 4k-16k keys (the grid of call 1:
# 643/655/658 bf16, goal 670 at 16k): the last round in pieces on top of the table's row (at 16k 1024 pairs over
# 66 clusters leave the 16th round half full), and head groups of 2 and 8 beside 4.  "hopper[cluster=1]" is the
# table's own config under another name: the noise between two providers of one run.  Each GPU runs its list twice,
# the second time in reverse order.  GPU 1 first runs the cluster tests (now with the table's row + split tail).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
CANDS=(fmha:auto "fmha:hopper[split_tail=1]" "fmha:hopper[head_group=2]" "fmha:hopper[head_group=8]"
       "fmha:hopper[cluster=1]")
REV=("fmha:hopper[cluster=1]" "fmha:hopper[head_group=8]" "fmha:hopper[head_group=2]" "fmha:hopper[split_tail=1]"
     fmha:auto)
ab() {  # ab DTYPE LEDGER
  bench 120 --dtype "$1" --where "head_dim=128 causal=0 seqlen_k=4096,8192,16384" --providers "${CANDS[@]}" \
    sdpa:cudnn --ledger "$2"
  bench 120 --dtype "$1" --where "head_dim=128 causal=0 seqlen_k=4096,8192,16384" --providers sdpa:cudnn \
    "${REV[@]}" --ledger "$2"
}
(export CUDA_VISIBLE_DEVICES=0
 ab bfloat16 $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 150 python3 -m pytest -q -n 12 -rf --tb=line -p no:cacheprovider tests/test_gpu.py -k cluster 2>&1 \
   | grep -v "Warning\|warner" > $OUT/gpu1.txt
 ab float16 $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
