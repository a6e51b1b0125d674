#!/usr/bin/env bash
# Session 12, call 5 (nvidia-h200-x2).  Decoding (1 query row), more bytes in flight on each SM (call 1's profile:
# cuDNN keeps two programs of 86 KB on an SM, ours one of 121 KB): 5 or 6 ring stages of 64-key tiles, 128-key
# tiles in 2 or 3 stages, beside the table, bf16 on both GPUs.  Then D=128 non-causal with Q in registers
# beside the table (now lazy): GPU 0 bf16, GPU 1 fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 bench 150 --grid decode --dtype bfloat16 --where seqlen_q=1 --providers fmha:auto "fmha:tiled[num_stages=6]" \
   "fmha:tiled[block_n=128,num_stages=3]" sdpa:cudnn --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 bench 150 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[q_regs=1]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 150 --grid decode --dtype bfloat16 --where seqlen_q=1 --providers fmha:auto "fmha:tiled[num_stages=5]" \
   "fmha:tiled[block_n=128,num_stages=2]" sdpa:cudnn --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 150 --dtype float16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[q_regs=1]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
