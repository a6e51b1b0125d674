#!/usr/bin/env bash
# Session 17, call 6 (nvidia-h200).  Sustained at (1, 16, 16384, 128) bf16 non-causal, 6 s a phase under the power
# cap (a steadier A/B than a grid cell's 10 replays of 100 ms): the final table (head groups of 4, clusters, pass v7)
# beside head groups of 2, the split tail, no clusters, cuDNN and the matmul.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
timeout 200 python3 bench/power_probe.py --seconds 6 --hopper head_group=2 split_tail=1 cluster=0 2>&1 \
  | tee $OUT/power.txt
