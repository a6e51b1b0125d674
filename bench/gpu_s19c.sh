#!/usr/bin/env bash
# Session 19, call 3 (nvidia-h200, branch `trace`, not merged): each CTA's items on the timeline at (1, 16, 16384,
# 128) bf16, the table's cluster row and the same with the last round in pieces (bench/trace_tail.py, which
# `git apply bench/trace_tail.patch` adds with the kernel's timestamps; ran at 33e8928 on that branch).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
timeout 200 python3 bench/trace_tail.py 2>&1 | tee $OUT/trace.txt
