#!/usr/bin/env bash
# Session 12, call 1 (nvidia-h200).  Where the time goes in the two cells still short of their goals, fmha
# against cuDNN: Nsight Compute's full set on one call of each (bench/ncu_profile.py), the details page and
# the hopper kernel's SASS with its stall samples; then each decode kernel's mean duration (decode_profile.py).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv > $OUT/smi.txt
timeout 300 ncu --profile-from-start off --clock-control none --set full --import-source no \
  -o $OUT/prof -f python3 bench/ncu_profile.py > $OUT/ncu_run.txt 2>&1
tail -5 $OUT/ncu_run.txt
ncu -i $OUT/prof.ncu-rep --page details > $OUT/details.txt 2>&1
ncu -i $OUT/prof.ncu-rep --page source --csv --print-source sass -k regex:hopper > $OUT/hopper_sass.csv 2>&1
ncu -i $OUT/prof.ncu-rep --page source --csv --print-source sass -k regex:tiled > $OUT/tiled_sass.csv 2>&1
ls -la $OUT
timeout 120 python3 bench/decode_profile.py 2>&1 | clean > $OUT/decode_profile.txt
cat $OUT/decode_profile.txt
grep -E "^  [a-z_]|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Issue Slots Busy|Executed Ipc A" $OUT/details.txt | head -150
