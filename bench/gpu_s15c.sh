#!/usr/bin/env bash
# Session 15, call 3 (nvidia-h200-x2).  Ping-pong with hardware named barriers (KernelConfig.pingpong=2:
# bar.sync on this warpgroup's barrier, bar.arrive on the next one's, FlashAttention-3's warp scheduler barrier,
# which FlashAttention-4's sm_90 forward also runs beside its intra-warpgroup overlap at head_dim <= 128) against
# the mbarrier turns (pingpong=1, last measured at 16k in session 1) and the table.  GPU 0: D=128 non-causal bf16,
# then half of the named-barrier configs' GPU tests; GPU 1: D=128 causal and D=64 non-causal bf16, then the rest.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
cases() {  # every other hopper GPU test id of the named-barrier configs, from $1 (0 or 1)
  python3 -m pytest --collect-only -q tests/test_gpu.py 2>/dev/null | grep -E "\[m[0-9]+n128w4s2pn[a-z0-9]*-" \
    | awk "NR % 2 == $1"
}
(export CUDA_VISIBLE_DEVICES=0
 bench 130 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[pingpong=1]" \
   "fmha:hopper[pingpong=2]" sdpa:cudnn --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout 110 python3 -m pytest -q $(cases 0) 2>&1 | tail -4 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 70 --dtype bfloat16 --where "head_dim=128 causal=1" --providers fmha:auto "fmha:hopper[pingpong=2]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 60 --dtype bfloat16 --where "head_dim=64 causal=0" --providers fmha:auto "fmha:hopper[pingpong=2]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 timeout 110 python3 -m pytest -q $(cases 1) 2>&1 | tail -4 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
