#!/usr/bin/env bash
# Session 10, call 1 (nvidia-h200-x2).  Causal pairs with the last rounds dealt by LPT (`balance`):
# GPU 0 its GPU test, then bf16 causal cells and the extra grid's causal cells, `fmha:hopper[balance=1]` beside
# the table; GPU 1 the same in fp16, then decoding at 2 programs per SM (`fmha:tiled[split_per_sm=2]`), 1 query row.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
AB="fmha:auto fmha:hopper[balance=1] sdpa:cudnn"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 90 python3 -m pytest -q -n 8 -p no:benchmark -rfE tests/test_gpu.py -k balanced 2>&1 | tail -4 > $OUT/gpu0.txt
 bench 150 --dtype bfloat16 --where "causal=1" --providers $AB --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt
 bench 100 --grid extra --dtype bfloat16 --where "causal=1" --providers $AB --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 150 --dtype float16 --where "causal=1" --providers $AB --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 80 --grid decode --dtype bfloat16 --where "seqlen_q=1" --providers fmha:auto "fmha:tiled[split_per_sm=2]" \
   sdpa:cudnn --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
