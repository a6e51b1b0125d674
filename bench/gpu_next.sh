#!/usr/bin/env bash
# For the next H200 session (written at the end of session 4; nothing below has run at the final commit).
# On nvidia-h200-x2: `FMHA_GIT_SHA=<sha> bash bench/gpu_next.sh` (about 510 s), one stream per GPU.
# GPU 0: the whole GPU suite at the final commit (session 4 ran it whole at c888eb2, before the hopper
# window/softcap/ALiBi and the 4-head-group table rows), then the decode grid.  GPU 1: both grids
# with the final table (D=128 non-causal 1k-4k now takes 4-head item groups: sweeps only so far),
# then the window/softcap/ALiBi speed on hopper against tiled.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 420 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests 2>&1 | tail -25
  bench 80 --grid decode --dtype bfloat16 --ledger $OUT/ledger0.csv
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  bench 230 --dtype bfloat16 --ledger $OUT/ledger1.csv
  bench 230 --dtype float16 --ledger $OUT/ledger1.csv
  timeout 45 python3 bench/window_speed.py 2>&1
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -45 $OUT/gpu0.txt; tail -70 $OUT/gpu1.txt
