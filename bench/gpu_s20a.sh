#!/usr/bin/env bash
# Session 20, call 1 (nvidia-h200-x2).  A standing pivot (stale=1: no row max past a key tile's first; a tile
# whose row sum passes 2**15 is taken again): GPU 0 the bf16 default grid beside the table, then sustained at
# (1,16,16384,128); GPU 1 the GPU tests of the new configs, then the fp16 D=128 cells beside the table, then sustained.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout 260 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --ledger $OUT/ledger0.csv \
   --providers fmha:auto "fmha:hopper[stale=1]" sdpa:cudnn 2>&1 | clean > $OUT/ab0.txt
 timeout 120 python3 bench/power_probe.py --seconds 6 --gpu 0 --hopper stale=1 > $OUT/probe0.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 200 python3 -m pytest -q -n 8 tests/test_gpu.py -k "x- or rescales or x]" > $OUT/tests.txt 2>&1
 timeout 150 python3 -m fmha bench --cuda-graphs --dtype float16 --where "head_dim=128" --ledger $OUT/ledger1.csv \
   --providers "fmha:hopper[stale=1]" fmha:auto sdpa:cudnn 2>&1 | clean > $OUT/ab1.txt
 timeout 100 python3 bench/power_probe.py --seconds 6 --gpu 1 --hopper stale=1 > $OUT/probe1.txt 2>&1) &
wait
tail -15 $OUT/tests.txt; cat $OUT/ab0.txt $OUT/ab1.txt $OUT/probe0.txt $OUT/probe1.txt
