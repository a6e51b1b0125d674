#!/usr/bin/env bash
# Session 18, call 1 (nvidia-h200-x2).  Head groups on the D=128 non-causal cluster row (1k-16k keys): the one
# candidate session 17 left (+0.3% in a grid A/B at 4k-16k, +0.8% sustained).  GPU 0: sustained at 16k, 6 s a
# phase (the table with head groups of 4, then 2, 3 and 1), then the bf16 cells 1k-16k with fmha:auto beside
# fmha:hopper[head_group=2] and cuDNN, the list twice, the second time reversed.  GPU 1: the same two lists in fp16,
# then bf16 again.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
WHERE="head_dim=128 causal=0 seqlen_k=1024,2048,4096,8192,16384"
ab() {  # ab DTYPE LEDGER
  bench 150 --dtype "$1" --where "$WHERE" --providers fmha:auto "fmha:hopper[head_group=2]" sdpa:cudnn --ledger "$2"
  bench 150 --dtype "$1" --where "$WHERE" --providers sdpa:cudnn "fmha:hopper[head_group=2]" fmha:auto --ledger "$2"
}
(export CUDA_VISIBLE_DEVICES=0
 timeout 150 python3 bench/power_probe.py --seconds 6 --gpu 0 --hopper head_group=2 head_group=3 head_group=1 2>&1 \
   > $OUT/gpu0.txt
 ab bfloat16 $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 ab float16 $OUT/ledger1.csv > $OUT/gpu1.txt
 ab bfloat16 $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
