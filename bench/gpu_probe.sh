#!/usr/bin/env bash
# First look at the H200: gpu tests, the demo, and the tiled kernel's configs.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv
python3 -c "import torch, triton, numpy; print(torch.__version__, triton.__version__, numpy.__version__)"
python3 -m pytest -q -x -n 8 tests/test_gpu.py 2>&1 | tail -15 | tee $OUT/gpu_tests.txt
python3 -m fmha demo 2>&1 | tee $OUT/demo.txt
python3 bench/probe_tiled.py 2>&1 | tee $OUT/probe_tiled.txt
