#!/usr/bin/env bash
# Session 16, call 4 (nvidia-h200-x2).  The clusters with CTA-scope remote arrivals (as CUTLASS's cluster barrier;
# call 3's .release.cluster arrivals may wait on more than the slot's reads).  GPU 0: the D=128 non-causal bf16
# cells beside the table, then half of the cluster GPU tests; GPU 1: the power probe, then the other half.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
cases() {  # every other cluster GPU test id, from $1 (0 or 1)
  python3 -m pytest --collect-only -q tests/test_gpu.py -k cluster 2>/dev/null | grep "::" | awk "NR % 2 == $1"
}
(export CUDA_VISIBLE_DEVICES=0
 bench 150 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[cluster=1]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout 200 python3 -m pytest -q --tb=line $(cases 0) 2>&1 | tail -6 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 100 python3 bench/power_probe.py --seconds 4 --gpu 1 --hopper cluster=1 > $OUT/gpu1.txt 2>&1
 timeout 200 python3 -m pytest -q --tb=line $(cases 1) 2>&1 | tail -6 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
