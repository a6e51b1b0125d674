#!/usr/bin/env bash
# Session 19, call 4 (nvidia-h200-x2).  The default grid at the final commit (kernels and table as session 18's):
# bf16 on GPU 0, fp16 on GPU 1, then the extra grid (GQA, seqlen_q != seqlen_k, 128k keys) bf16 on GPU 1; on GPU 0
# head groups of 2 on the 512-key ping-pong row (session 18 left it at 4), bf16 and fp16, twice.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 330 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 for i in 1 2; do
   timeout 60 python3 -m fmha bench --cuda-graphs --dtype bfloat16 float16 --where "head_dim=128 causal=0 seqlen_k=512" \
     --ledger $OUT/ledger3.csv --providers fmha:auto "fmha:hopper[head_group=2]" sdpa:cudnn 2>&1 | clean >> $OUT/gpu0hg.txt
 done) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 330 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 150 --grid extra --dtype bfloat16 --ledger $OUT/ledger2.csv > $OUT/gpu1x.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt $OUT/gpu1x.txt $OUT/gpu0hg.txt
