#!/usr/bin/env bash
# For the next H200 session (written at the end of session 2; nothing below has run yet).
# Call A: `bash bench/gpu_next.sh a` (about 520 s); call B right after: `bash bench/gpu_next.sh b` (about 500 s).
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
if [ "$1" = a ]; then
  # the causal hopper launch changed after the last run (one program per item again): check, then time
  timeout 200 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py -k "hopper or graph" > $OUT/gpu_tests.txt 2>&1; tail -8 $OUT/gpu_tests.txt
  timeout 300 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --providers fmha:auto fmha:hopper fmha:tiled sdpa:cudnn sdpa:flash --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_bf16.txt
else
  timeout 250 python3 -m fmha bench --cuda-graphs --dtype float16 --providers fmha:auto sdpa:cudnn sdpa:flash --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tee $OUT/bench_fp16.txt
  # causal: one program per item (the default) against the persistent head-major snake
  timeout 90 python3 -m fmha sweep --variant hopper --cuda-graphs --space "block_m=128 block_n=128 num_stages=2 persistent=0,1" --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tail -10 | tee $OUT/sweep_hopper.txt
  # decoding at seqlen_q=1 trails cuDNN (0.85-0.98x): which tiles feed the memory system best
  timeout 150 python3 -m fmha sweep --variant tiled --grid decode --cuda-graphs --space "block_m=16 block_n=64,128 num_warps=4 num_stages=3,4" --ledger $OUT/ledger.csv 2>&1 | tr '\r' '\n' | grep -v '^\[' | tail -14 | tee $OUT/sweep_decode.txt
fi
# on nvidia-h200-x2 (issue 8), when lent: the NCCL check, then tokens/s per GPU against one GPU
#   torchrun --nproc-per-node 2 examples/ring_attention.py --causal --seqlen 131072
#   for n in 1 2; do for s in 131072 524288 1048576; do
#     torchrun --nproc-per-node $n examples/ring_attention.py --causal --seqlen $s --no-check --time 3; done; done
