#!/usr/bin/env bash
# Session 16, call 5 (nvidia-h200-x2).  The final grids with the table's clusters (D=128 non-causal, 513-16k keys;
# the PTX pass's v3: one elected arrive on both CTAs' barriers).  GPU 0: the default grid bf16, the extra grid bf16,
# then the D=128 non-causal cells beside the table without clusters.  GPU 1: the GPU tests of the clusters and of
# the table's configs (every hopper shape and mask, auto), then the default and extra grids in fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 330 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 bench 200 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt
 bench 100 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[cluster=0]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 200 python3 -m pytest -q -n 8 --tb=line tests/test_gpu.py \
   -k "cluster or (hopper_matches_reference and None) or (gpu_matches_reference and auto)" 2>&1 | tail -8 > $OUT/gpu1.txt
 bench 330 --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 bench 200 --grid extra --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
