#!/usr/bin/env bash
# Session 19, call 5 (nvidia-h200-x2).  Causal 2-CTA clusters (the K/V multicast of the non-causal row, now with the
# cluster's second block's key range): GPU 0 runs the cluster GPU tests (causal ones new), then the causal D=128
# cells bf16 with the providers in reverse; GPU 1 the causal D=128 cells in bf16 and fp16 beside the table.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
P=(fmha:auto "fmha:hopper[cluster=1]" "fmha:hopper[cluster=1,fence=1]" "fmha:hopper[cluster=1,lazy=1,fence=1]")
(export CUDA_VISIBLE_DEVICES=0
 timeout 220 python3 -m pytest -q -n 8 -x tests/test_gpu.py -k "cluster" > $OUT/tests.txt 2>&1
 timeout 150 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --where "head_dim=128 causal=1" --ledger $OUT/ledger0.csv \
   --providers "fmha:hopper[cluster=1,lazy=1,fence=1]" "fmha:hopper[cluster=1,fence=1]" "fmha:hopper[cluster=1]" fmha:auto \
   sdpa:cudnn 2>&1 | clean > $OUT/ab0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 300 python3 -m fmha bench --cuda-graphs --dtype bfloat16 float16 --where "head_dim=128 causal=1" \
   --ledger $OUT/ledger1.csv --providers "${P[@]}" sdpa:cudnn 2>&1 | clean > $OUT/ab1.txt) &
wait
tail -5 $OUT/tests.txt; cat $OUT/ab1.txt $OUT/ab0.txt
