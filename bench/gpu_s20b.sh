#!/usr/bin/env bash
# Session 20, call 2 (nvidia-h200-x2).  The table with the standing pivot: the GPU tests of every path the table
# takes (config None, auto, features, varlen, seqused, paged, split tail, balance, graphs), half on each GPU; then
# the default grid, bf16 on GPU 0 and fp16 on GPU 1; then GPU 0 the extra grid (bf16) beside the standing pivot
# on its 128k row, GPU 1 sustained at (1,16,16384,128) against the table without it (session 19's row).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
K="not (test_hopper_matches_reference and not None) and not (test_gpu_matches_reference and not auto)"
K="$K and not cluster_matches and not rescales"
python3 -m pytest --collect-only -q -m gpu tests -k "$K" 2>/dev/null | grep '::' > $OUT/ids.txt
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider $(awk 'NR%2==1' $OUT/ids.txt) > $OUT/tests0.txt 2>&1
 bench 260 --dtype bfloat16 --ledger $OUT/ledger0.csv > $OUT/grid0.txt
 timeout 110 python3 -m fmha bench --cuda-graphs --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv \
   --providers fmha:auto "fmha:hopper[stale=1]" sdpa:cudnn sdpa:flash 2>&1 | clean > $OUT/extra0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider $(awk 'NR%2==0' $OUT/ids.txt) > $OUT/tests1.txt 2>&1
 bench 260 --dtype float16 --ledger $OUT/ledger1.csv > $OUT/grid1.txt
 timeout 100 python3 bench/power_probe.py --seconds 6 --gpu 1 --hopper stale=0,lazy=1 > $OUT/probe1.txt 2>&1) &
wait
wc -l < $OUT/ids.txt; tail -3 $OUT/tests0.txt $OUT/tests1.txt; cat $OUT/grid0.txt $OUT/grid1.txt $OUT/extra0.txt $OUT/probe1.txt
