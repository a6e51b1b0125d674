#!/usr/bin/env bash
# Session 4, call 5 (nvidia-h200-x2, about 130 s): window, softcap and ALiBi on the Gluon kernel, new.
# GPU 0: their tests against the float64 reference, then their speed against tiled; GPU 1: the hopper
# table's own tests (every shape, dtype, layout and mask) after the change.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 80 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests/test_gpu.py -k hopper_features 2>&1 | tail -12
  timeout 45 python3 bench/window_speed.py 2>&1
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout 125 python3 -m pytest -q -n 16 -m gpu -p no:benchmark -rfE tests/test_gpu.py \
    -k "test_hopper_matches_reference and None" 2>&1 | tail -8
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
cat $OUT/gpu0.txt; cat $OUT/gpu1.txt
