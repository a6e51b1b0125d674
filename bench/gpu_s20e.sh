#!/usr/bin/env bash
# Session 20, call 5 (nvidia-h200, the last 4 minutes of device time).  The extra grid (bf16) with the standing
# pivot on the past-16k row too (656 against 631 at 128k keys in call 3), beside the row without it.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
timeout 175 python3 -m fmha bench --cuda-graphs --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv \
  --providers fmha:auto "fmha:hopper[stale=0]" sdpa:cudnn 2>&1 | clean | grep -v "Warning\|return torch"
