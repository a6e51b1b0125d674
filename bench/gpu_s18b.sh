#!/usr/bin/env bash
# Session 18, call 2 (nvidia-h200-x2).  GPU 0: where the cluster row's consumers wait at 16k bf16 (the 670 cell),
# Nsight Compute's full set on one call of fmha and of cuDNN (bench/ncu_profile.py), the hopper kernel's SASS with
# its stall samples.  GPU 1: the GPU tests of the table with head groups of 2 (clusters, the table's configs, auto).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout 300 ncu --profile-from-start off --clock-control none --set full --import-source no \
   -o $OUT/prof -f python3 bench/ncu_profile.py d128nc16k > $OUT/ncu_run.txt 2>&1
 tail -3 $OUT/ncu_run.txt
 ncu -i $OUT/prof.ncu-rep --page details > $OUT/details.txt 2>&1
 ncu -i $OUT/prof.ncu-rep --page source --csv --print-source sass -k regex:hopper > $OUT/hopper_sass.csv 2>&1
 rm -f $OUT/prof.ncu-rep) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 280 python3 -m pytest -q -n 12 -rf --tb=line -p no:cacheprovider tests/test_gpu.py \
   -k "cluster or (hopper_matches_reference and None) or (gpu_matches_reference and auto)" 2>&1 \
   | grep -v "Warning\|warner" > $OUT/tests.txt) &
wait
tail -5 $OUT/tests.txt
grep -E "^  [a-z_]|Duration|SM Frequency|Compute \(SM\) Throughput|Registers Per|Issue Slots Busy|Executed Ipc A|L2 Hit|Tensor" \
  $OUT/details.txt | head -60
ls -la $OUT
