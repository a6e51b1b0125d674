#!/usr/bin/env bash
# Session 7, call 6 (nvidia-h200, the last minutes): the decode table now reads K/V by TMA.  The decode and
# paged tests on the GPU, the TMA choice and its fallback, decoding under CUDA-graph capture.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
timeout 150 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_decode.py tests/test_paged.py tests/test_gpu.py \
  -k "test_decode or test_paged or decode_reads or cuda_graph" 2>&1 | tail -6
