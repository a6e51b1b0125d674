#!/usr/bin/env bash
# Session 14, call 3 (nvidia-h200-x2).  The final grids at the session's closing code (the kernels as at 9aa86bf,
# this session's chained items reverted): the default grid against cuDNN and SDPA's flash, GPU 0 bf16, GPU 1 fp16;
# then the extra grid in the same dtype.  Last, on GPU 1: D=128 non-causal bf16 at 8k and 16k keys in 192-row
# programs of 64-key tiles (three consumer warpgroups: 1.5x the FLOPs per K/V byte read from L2), last measured
# in session 1 (606 against 625, run 20261129T131415), before lazy rescaling and the fence.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 330 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 bench 200 --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 330 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 200 --grid extra --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 bench 100 --dtype bfloat16 --where "head_dim=128 causal=0 seqlen_q=8192,16384" \
   --providers fmha:auto "fmha:hopper[block_m=192,block_n=64]" "fmha:hopper[block_m=192,block_n=64,num_stages=3]" \
   sdpa:cudnn --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
