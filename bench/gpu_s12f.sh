#!/usr/bin/env bash
# Session 12, call 6 (nvidia-h200-x2).  The decode table's new long-key row (128-key tiles, 3 stages, from 8k
# keys) against the old one (`fmha:tiled[block_n=64,num_stages=4]`) and cuDNN, every decode cell: GPU 0 bf16,
# GPU 1 fp16; then GPU 0 the decode GPU tests (head_dim 64 to 256 from 8k keys, TMA or not).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
AB="fmha:auto fmha:tiled[block_n=64,num_stages=4] sdpa:cudnn sdpa:flash"
(export CUDA_VISIBLE_DEVICES=0
 bench 130 --grid decode --dtype bfloat16 --providers $AB --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout -s INT 100 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_decode.py \
   -k "decode or split or tma" 2>&1 | tail -6 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 130 --grid decode --dtype float16 --providers $AB --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
