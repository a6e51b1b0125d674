#!/usr/bin/env bash
# Session 8, call 4 (nvidia-h200-x2).  The hopper GPU tests on the new table (call 3's test streams ran
# out of time before their summaries): interrupted by SIGINT at the limit, pytest still prints one.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout -s INT 190 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k \
   "hopper_matches_reference and (None or m192n128w4s2z or m128n128w4s3qz)" 2>&1 | tail -5 > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1
 timeout -s INT 190 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_paged.py -k \
   "hopper_features or hopper_ragged or (hopper and (varlen or seqused or paged or lengths))" 2>&1 | tail -5 \
   > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
