#!/usr/bin/env bash
# Session 18, call 6 (nvidia-h200).  Why the split tail loses on the cluster row (sessions 17/18: -1 to -4% in
# grid cells, -1.4% sustained, though the half-full last round idles about 3% of the SM time): Nsight Compute's
# full set on one call each of the table, cuDNN and the table with split_tail=1 (its merge kernel too) at 16k bf16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
timeout 400 ncu --profile-from-start off --clock-control none --set full --import-source no \
  -o $OUT/prof -f python3 bench/ncu_profile.py d128nc16k --hopper split_tail=1 > $OUT/ncu_run.txt 2>&1
tail -3 $OUT/ncu_run.txt
ncu -i $OUT/prof.ncu-rep --page details > $OUT/details.txt 2>&1
ncu -i $OUT/prof.ncu-rep --page source --csv --print-source sass -k regex:hopper > $OUT/hopper_sass.csv 2>&1
rm -f $OUT/prof.ncu-rep
grep -E "^  [a-z_]|Duration|SM Frequency|Elapsed Cycles|SM Active Cycles|Compute \(SM\) Throughput|Issue Slots Busy|Grid Size" \
  $OUT/details.txt
