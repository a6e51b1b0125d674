#!/usr/bin/env bash
# Session 16, call 1 (nvidia-h200-x2).  What would halving the 16k cell's K/V traffic (TMA multicast in a 2-CTA
# cluster) buy?  An upper bound, with wrong results: the producer loads only every other round of the K/V ring
# (kv_reuse=1: half the L2-to-SM bytes) or an item's first ring only (kv_reuse=2: almost none), same compute.
# power_probe on each GPU: cold single calls, then each kernel sustained with clock and power sampled.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
for g in 0 1; do
  (CUDA_VISIBLE_DEVICES=$g timeout 300 python3 bench/power_probe.py --seconds 5 --gpu $g \
     --hopper kv_reuse=1 kv_reuse=2 lazy=0 > $OUT/power$g.txt 2>&1) &
done
wait
nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv
cat $OUT/power0.txt $OUT/power1.txt
