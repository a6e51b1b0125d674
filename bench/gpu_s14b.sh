#!/usr/bin/env bash
# Session 14, call 2 (nvidia-h200-x2).  Chained items (KernelConfig.chain): an item's first Q K^T and softmax run
# beside the previous item's last P V instead of after its epilogue; P carried over in float32 (call 1 carried it
# narrowed, and ptxas copied it into the P V operand registers at every step of the key loop: 32 moves).  GPU 0:
# D=128 non-causal bf16 beside the table (chain alone, and with Q in registers), then a third of the GPU tests of
# the chained configs; GPU 1: D=128 causal and D=64 non-causal bf16 beside the table, then another third.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
chained() {  # the hopper GPU tests of the chained configs (their ids end in "c"), every second one from $1
  python3 -m pytest --collect-only -q tests/test_gpu.py 2>/dev/null \
    | grep -E '\[(m[0-9]+n[0-9]+w4s[0-9][a-z0-9]*c-|growth|[0-9]+-m[0-9]+n[0-9]+w4s[0-9][a-z0-9]*c)' | awk "NR % 2 == $1"
}
(export CUDA_VISIBLE_DEVICES=0
 bench 170 --dtype bfloat16 --where "head_dim=128 causal=0" \
   --providers fmha:auto "fmha:hopper[chain=1]" "fmha:hopper[chain=1,q_regs=1]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv > $OUT/gpu0.txt
 timeout 120 python3 -m pytest -q -x $(chained 0 | awk "NR % 3 == 0") 2>&1 | tail -6 >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 100 --dtype bfloat16 --where "head_dim=128 causal=1" --providers fmha:auto "fmha:hopper[chain=1]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 100 --dtype bfloat16 --where "head_dim=64 causal=0" --providers fmha:auto "fmha:hopper[chain=1]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 timeout 100 python3 -m pytest -q -x $(chained 1 | awk "NR % 3 == 1") 2>&1 | tail -6 >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
