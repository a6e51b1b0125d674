#!/usr/bin/env bash
# Session 9, call 1 (nvidia-h200-x2).  Two changes: the O rescale under the next Q K^T (every config) and
# split_tail (a partly filled last round's items in pieces, merged by LSE; non-causal).  GPU 0: the split
# test and the hopper reference test on the table, then split_tail (and Q+fence at 8k-16k) A/B beside the
# table and cuDNN, non-causal bf16; a D=64 causal S=512 sweep.  GPU 1: the bf16 grid on this tree, then on
# session 8's (bench/ab_old/src, commit 22a2439), same GPU one after the other.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "split_tail or (hopper_matches_reference and None and bfloat16)" 2>&1 | tail -6 > $OUT/gpu0.txt
 timeout 250 python3 -m fmha bench --cuda-graphs --ledger $OUT/ledger0.csv --dtype bfloat16 --where causal=0 \
   --providers fmha:auto "fmha:hopper[split_tail=1]" "fmha:hopper[q_regs=1,fence=1,split_tail=1]" sdpa:cudnn \
   2>&1 | clean >> $OUT/gpu0.txt
 sweep 120 --variant hopper --dtype bfloat16 --ledger $OUT/ledger0.csv --where "head_dim=64 causal=1 seqlen_q=512" \
   --space "block_m=128 num_stages=2,3 q_regs=1 fence=0,1 persistent=0,1" >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 260 python3 -m fmha bench --cuda-graphs --ledger $OUT/ledger1.csv --dtype bfloat16 \
   --providers fmha:auto sdpa:cudnn 2>&1 | clean > $OUT/gpu1.txt
 FMHA_RUN_TAG=gpu1-old FMHA_GIT_SHA=22a2439 PYTHONPATH=bench/ab_old/src timeout 260 python3 -m fmha bench \
   --cuda-graphs --ledger $OUT/ledger1.csv --dtype bfloat16 --providers fmha:auto sdpa:cudnn 2>&1 | clean >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
