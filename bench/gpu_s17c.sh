#!/usr/bin/env bash
# Session 17, call 3 (nvidia-h200-x2).  The PTX pass v6 (25fd3c7) against the kernels as they were, D=128 non-causal
# 4k-16k keys (the cluster row), one process per tree, cuDNN in each: abold/src = 83212ee (pass v3: a warpgroup
# bar.sync before every release and before each loop's K wait; ptxas sinks each K release's remote arrive below the
# softmax), abv4a/src = v4 (no bar.sync; the remote arrive still sunk), src = v6 (no bar.sync, the remote arrive
# pinned).  Order old, v4, v6, v6, v4, old on each GPU; run_id tags name the tree.  GPU 1 first runs the cluster
# tests of v6.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
ab() {  # ab DTYPE LEDGER GPU
  local sha=$FMHA_GIT_SHA
  for tree in abold abv4a . . abv4a abold; do
    case $tree in abold) tag=old sha=83212ee ;; abv4a) tag=v4 sha=25fd3c7-v4 ;; *) tag=v6 sha=$FMHA_GIT_SHA ;; esac
    FMHA_GIT_SHA=$sha PYTHONPATH=$tree/src FMHA_RUN_TAG="$3-$tag" bench 75 --dtype "$1" \
      --where "head_dim=128 causal=0 seqlen_k=4096,8192,16384" --providers fmha:auto sdpa:cudnn --ledger "$2" \
      | grep -v "^fmha bench\|^TFLOP\|^fmha:auto\|ceilings\|^---\|dtype\|^$" | sed "s|^|$tag |"
  done
}
(export CUDA_VISIBLE_DEVICES=0
 ab bfloat16 $OUT/ledger0.csv gpu0 > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 110 python3 -m pytest -q -n 12 -rf --tb=line -p no:cacheprovider tests/test_gpu.py -k cluster 2>&1 \
   | grep -v "Warning\|warner" > $OUT/gpu1.txt
 ab float16 $OUT/ledger1.csv gpu1 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
