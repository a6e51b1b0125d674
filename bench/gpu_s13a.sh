#!/usr/bin/env bash
# Session 13, call 1 (nvidia-h200-x2).  192-key tiles (FlashAttention-4's sm_90 tile at D=128 non-causal; here two
# ring slots of 128 and 64 keys, a wgmma each): GPU 0 runs their GPU tests, then D=128 non-causal bf16 beside the
# table; GPU 1 the same in fp16, then D=64 non-causal bf16 (128 rows, 192 keys).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
N192='fmha:hopper[block_n=192,q_regs=0,pingpong=0]'
N192F='fmha:hopper[block_n=192,q_regs=0,pingpong=0,fence=0]'
N192P='fmha:hopper[block_n=192,q_regs=0,pingpong=0,fence=0,lazy=0]'
(export CUDA_VISIBLE_DEVICES=0
 timeout 170 python3 -m pytest -q -x tests/test_gpu.py -k "n192" 2>&1 | tail -15 > $OUT/gpu0.txt
 bench 200 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "$N192" "$N192F" "$N192P" sdpa:cudnn \
   --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 200 --dtype float16 --where "head_dim=128 causal=0" --providers fmha:auto "$N192" "$N192F" "$N192P" sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 150 --dtype bfloat16 --where "head_dim=64 causal=0" --providers fmha:auto \
   'fmha:hopper[block_m=128,block_n=192,q_regs=0,pingpong=0]' sdpa:cudnn --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
