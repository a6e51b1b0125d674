#!/usr/bin/env bash
# Session 19, call 2 (nvidia-h200-x2).  Clusters of four CTAs (cluster=4) on the D=128 non-causal row: how many
# clusters of 1/2/4/8 CTAs the H200 holds at once; GPU 0 runs the cluster GPU tests, then the sustained probe;
# GPU 1 the D=128 non-causal cells side by side with the table, then the sustained probe (list reversed).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
python3 -c "
from fmha.kernels import cluster_room
print('clusters held at once (CTAs: clusters), 197 KB a CTA:', [(n, cluster_room(0, n, 197 * 1024)) for n in (1, 2, 4, 8)])"
LIST=(cluster=4 cluster=4,head_group=4 cluster=4,split_tail=1)
REV=(cluster=4,split_tail=1 cluster=4,head_group=4 cluster=4)
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m pytest -q -n 6 -x tests/test_gpu.py -k "cluster" > $OUT/tests.txt 2>&1
 timeout 170 python3 bench/power_probe.py --seconds 6 --gpu 0 --hopper "${LIST[@]}" > $OUT/gpu0.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 200 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --where "head_dim=128 causal=0" --ledger $OUT/ledger1.csv \
   --providers fmha:auto "fmha:hopper[cluster=4]" "fmha:hopper[cluster=4,head_group=4]" sdpa:cudnn 2>&1 | clean > $OUT/ab1.txt
 timeout 170 python3 bench/power_probe.py --seconds 6 --gpu 1 --hopper "${REV[@]}" > $OUT/gpu1.txt 2>&1) &
wait
tail -15 $OUT/tests.txt; cat $OUT/gpu0.txt $OUT/gpu1.txt $OUT/ab1.txt
