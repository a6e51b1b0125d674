#!/usr/bin/env bash
# Session 17, call 5 (nvidia-h200).  The GPU tests that build the table's cluster kernels with the PTX pass v7 beside
# the cluster tests of call 4: every hopper shape and mask with the table's configs, auto on every shape, the split
# tail, the rescale, the CUDA-graph, torch.compile, thread, stream and feature checks.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
timeout 330 python3 -m pytest -q -n 12 -rf --tb=line -p no:cacheprovider tests/test_gpu.py -k "(hopper_matches_reference \
and None) or (gpu_matches_reference and auto) or graph or compile or threads or stream or features_at or refuses \
or split_tail or rescales" 2>&1 | grep -v "Warning\|warner" | tee $OUT/tests.txt
