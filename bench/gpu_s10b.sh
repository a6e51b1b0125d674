#!/usr/bin/env bash
# Session 10, call 2 (nvidia-h200-x2).  The table with `balance` on D=64 causal up to 16k keys:
# GPU 0 the hopper reference test on the table's configs (causal), then the bf16 grid and the extra grid;
# GPU 1 the fp16 grid, then D=128 non-causal 8k/16k with Q in registers and the fence on the split rows.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 100 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "hopper_matches_reference and None and True" 2>&1 | tail -4 > $OUT/gpu0.txt
 bench 220 --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt
 bench 120 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 220 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 80 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[q_regs=1,fence=1]" \
   sdpa:cudnn --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
