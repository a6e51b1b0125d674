#!/usr/bin/env bash
# Session 16, call 3 (nvidia-h200-x2).  The clusters again, their stores now from both CTAs (Triton stored a broadcast
# layout's tensor from CTA 0 only: LSE, the pieces and O from registers were lost for every second block).  GPU 0: the
# cluster GPU tests, then the D=128 non-causal bf16 cells; GPU 1: those cells with 3 stages (the multicast's round
# trip between the CTAs has a tile more to hide in), then fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout 240 python3 -m pytest -q tests/test_gpu.py -k cluster --tb=line 2>&1 | tail -15 > $OUT/gpu0.txt
 bench 150 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[cluster=1]" \
   "fmha:hopper[cluster=1,split_tail=0]" sdpa:cudnn --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 200 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[cluster=1,num_stages=3]" \
   "fmha:hopper[cluster=1,num_stages=3,q_regs=1]" "fmha:hopper[num_stages=3]" sdpa:cudnn --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 120 --dtype float16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[cluster=1,num_stages=3]" \
   sdpa:cudnn --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
