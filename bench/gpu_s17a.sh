#!/usr/bin/env bash
# Session 17, call 1 (nvidia-h200-x2).  The table of 3be4ac7 (D=128 non-causal up to 16k keys: head groups of 4, Q in
# registers, lazy rescale, 2-CTA clusters; no clusters for an odd number of query blocks) in full grids.  GPU 0: the
# default grid bf16, the D=128 non-causal cells beside the previous 8k-16k row (split tail, no head groups, Q in
# shared memory), then the extra grid bf16.  GPU 1: the GPU tests of the clusters and of the table's configs (names
# of any failure printed), then the default grid fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 300 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 bench 100 --dtype bfloat16 --where "head_dim=128 causal=0 seqlen_k=8192,16384" --providers fmha:auto \
   "fmha:hopper[head_group=0,q_regs=0,split_tail=1]" sdpa:cudnn --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt
 bench 170 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 250 python3 -m pytest -q -n 12 -rf --tb=line -p no:cacheprovider tests/test_gpu.py \
   -k "cluster or (hopper_matches_reference and None) or (gpu_matches_reference and auto)" 2>&1 \
   | grep -v "Warning\|warner" > $OUT/gpu1.txt
 bench 320 --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
