#!/usr/bin/env bash
# Session 19, call 1 (nvidia-h200-x2).  A V ring of 3 (KernelConfig.v_stages) on the D=128 non-causal cluster row:
# GPU 0 runs the GPU tests of the new configs, then the sustained probe; GPU 1 the sustained probe (the list
# reversed), then the D=128 non-causal grid cells side by side with the table.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
LIST=(v_stages=3 num_stages=3,v_stages=3 num_stages=3,v_stages=2)
REV=(num_stages=3,v_stages=2 num_stages=3,v_stages=3 v_stages=3)
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m pytest -q -n 12 -x tests/test_gpu.py -k "v3 or varlen_keys_stop" > $OUT/tests.txt 2>&1
 tail -3 $OUT/tests.txt
 timeout 200 python3 bench/power_probe.py --seconds 6 --gpu 0 --hopper "${LIST[@]}" > $OUT/gpu0.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 200 python3 bench/power_probe.py --seconds 6 --gpu 1 --hopper "${REV[@]}" > $OUT/gpu1.txt 2>&1
 timeout 180 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --where "head_dim=128 causal=0" --ledger $OUT/ledger1.csv \
   --providers fmha:auto "fmha:hopper[v_stages=3]" "fmha:hopper[num_stages=3,v_stages=3]" sdpa:cudnn 2>&1 | clean > $OUT/ab1.txt) &
wait
cat $OUT/tests.txt | tail -15; cat $OUT/gpu0.txt $OUT/gpu1.txt $OUT/ab1.txt
