#!/usr/bin/env bash
# Session 18, call 7 (nvidia-h200-x2).  The cluster kernel's K release moved below the exponentials (both its
# arrivals: ptxas had put the remote one there in the table's build but not in the split tail's, whose loop then
# ran about 3% slower, call 6).  Sustained at 16k bf16, 5 s a phase: the new tree's table and table + split_tail,
# the old tree's table (oldsrc/, the commit before: FMHA_GIT_SHA names the new one), on both GPUs in opposite
# orders; then GPU 1 runs the cluster tests on the new tree.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
new() { PYTHONPATH=src timeout 120 python3 bench/power_probe.py --seconds 5 --gpu "$1" --hopper split_tail=1 2>&1; }
old() { PYTHONPATH=oldsrc/src timeout 90 python3 bench/power_probe.py --seconds 5 --gpu "$1" 2>&1; }
(export CUDA_VISIBLE_DEVICES=0
 { echo "== new"; new 0; echo "== old"; old 0; echo "== new"; new 0; } > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1
 { echo "== old"; old 1; echo "== new"; new 1; echo "== old"; old 1; } > $OUT/gpu1.txt
 timeout 100 python3 -m pytest -q -n 12 -rf --tb=line -p no:cacheprovider tests/test_gpu.py -k cluster 2>&1 \
   | grep -v "Warning\|warner" >> $OUT/gpu1.txt) &
wait
grep -v "one call" $OUT/gpu0.txt; grep -v "one call" $OUT/gpu1.txt
