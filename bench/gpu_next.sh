#!/usr/bin/env bash
# For the next H200 session (written at the end of session 4; nothing below has run at the final commit).
# On nvidia-h200-x2: `FMHA_GIT_SHA=<sha> bash bench/gpu_next.sh` (about 520 s), one stream per GPU.
# The decode grid is left out: its code has not changed since run 20261129T180849.
# GPU 0: the whole GPU suite at the final commit (session 4 ran it whole at c888eb2, before the hopper
# window/softcap/ALiBi, the 4-head-group table rows and `overlap`; a failure in `overlap` configs means
# that knob, off by default).  GPU 1: `overlap` (the next item's first Q K^T under this item's epilogue,
# never run) on every D=64 cell, where the short sequences still trail cuDNN; the bf16 grid with the
# final table; the features grid (window, softcap, ALiBi: hopper, tiled, SDPA with an explicit mask).
# The fp16 grid waits for a second call.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 500 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests 2>&1 | tail -25
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout 100 python3 -m fmha sweep --cuda-graphs --variant hopper --grid default --where "head_dim=64" \
    --ledger $OUT/ledger1.csv --space "block_m=128 block_n=128 num_stages=2 overlap=0,1" 2>&1 | clean | grep -v "^$"
  bench 225 --dtype bfloat16 --ledger $OUT/ledger1.csv
  timeout 150 python3 -m fmha bench --cuda-graphs --grid features --dtype bfloat16 --ledger $OUT/ledger1.csv \
    --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:efficient 2>&1 | clean
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -45 $OUT/gpu0.txt; tail -75 $OUT/gpu1.txt
