#!/usr/bin/env bash
# Session 18, call 4 (nvidia-h200-x2).  Sustained at (1, 16, 16384, 128) bf16 non-causal, 6 s a phase: the table's
# cluster row (head groups of 2) beside the knobs chosen before clusters, each turned back (fence=0, lazy=0,
# q_regs=0), 3 ring stages (O then stored from registers) and head groups of 4 (session 17's row, the control).
# Both GPUs, the second with the list reversed.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
LIST=(fence=0 lazy=0 q_regs=0 num_stages=3 head_group=4)
REV=(head_group=4 num_stages=3 q_regs=0 lazy=0 fence=0)
(export CUDA_VISIBLE_DEVICES=0
 timeout 230 python3 bench/power_probe.py --seconds 6 --gpu 0 --hopper "${LIST[@]}" > $OUT/gpu0.txt 2>&1) &
(export CUDA_VISIBLE_DEVICES=1
 timeout 230 python3 bench/power_probe.py --seconds 6 --gpu 1 --hopper "${REV[@]}" > $OUT/gpu1.txt 2>&1) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
