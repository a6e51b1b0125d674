#!/usr/bin/env bash
# Session 11, call 5 (nvidia-h200-x2).  Stream-K decoding, now the decode table's: one program per SM, 132
# runs of equal length over every block's key tiles, not 4 splits of each of 32 blocks = 128 programs; the old
# split (`fmha:tiled[stream_k=0]`) beside it.  GPU 0 bf16, GPU 1 fp16, every decode cell; then GPU 0 the
# decode and split GPU tests.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
AB="fmha:auto fmha:tiled[stream_k=0] sdpa:cudnn"
(export CUDA_VISIBLE_DEVICES=0
 bench 120 --grid decode --dtype bfloat16 --providers $AB --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout -s INT 100 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_decode.py tests/test_paged.py \
   tests/test_gpu.py -k "decode or split or stream or paged or graph" 2>&1 | tail -4 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 120 --grid decode --dtype float16 --providers $AB --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
