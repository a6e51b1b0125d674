#!/usr/bin/env bash
# For the next H200 session: what this session built but could not run on a GPU.
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -n 12 -p no:benchmark -rfE tests > $OUT/gpu_tests_full.txt 2>&1; tail -40 $OUT/gpu_tests_full.txt
# issue 8 on one GPU: two gloo ranks sharing the H200 (the overlap and merge logic with CUDA tensors)
timeout 90 torchrun --nproc-per-node 2 examples/ring_attention.py --backend gloo --causal --seqlen 8192 2>&1 | tail -8 | tee $OUT/ring_gloo.txt
timeout 60 torchrun --nproc-per-node 2 examples/ring_attention.py --backend gloo --seqlen 8192 2>&1 | tail -8 | tee -a $OUT/ring_gloo.txt
timeout 200 python3 -m fmha bench --grid decode --dtype bfloat16 --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_decode.txt
timeout 150 python3 -m fmha bench --cuda-graphs --providers fmha:auto fmha:hopper sdpa:cudnn sdpa:flash --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_graphs.txt
# on nvidia-h200-x2 (issue 8): torchrun --nproc-per-node 2 examples/ring_attention.py --causal --seqlen 131072
