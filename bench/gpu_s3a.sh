#!/usr/bin/env bash
# Session 3, call 1, on nvidia-h200-x2: two independent streams, one per GPU (ratios are taken within a GPU),
# then the NCCL ring check across both.  `bash bench/gpu_s3a.sh` (about 560 s).
set -o pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
clean() { tr '\r' '\n' | grep -v '^\['; }
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  # hopper's causal launch is one program per item again (56674c3) and `persistent` picks the schedule
  timeout 200 python3 -m pytest -q -n 12 -p no:benchmark -rfE tests/test_gpu.py -k "hopper or graph" 2>&1 | tail -15
  timeout 280 python3 -m fmha bench --cuda-graphs --dtype bfloat16 --providers fmha:auto sdpa:cudnn sdpa:flash \
    --ledger $OUT/ledger0.csv 2>&1 | clean
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  # causal: one program per item against the persistent head-major snake, every grid cell
  timeout 130 python3 -m fmha sweep --variant hopper --grid default --where causal=1 --cuda-graphs \
    --space "block_m=128 block_n=128 num_stages=2 persistent=0,1" --ledger $OUT/ledger1.csv 2>&1 | clean | tail -16
  # decoding at seqlen_q=1 trails cuDNN (0.85-0.98x): tile, ring depth and programs per SM of the key split
  timeout 130 python3 -m fmha sweep --variant tiled --grid decode --where seqlen_q=1 --cuda-graphs \
    --space "block_m=16 block_n=64,128 num_warps=4 num_stages=2,3,4 split_per_sm=2,4,8" \
    --ledger $OUT/ledger1.csv 2>&1 | clean | tail -6
  timeout 250 python3 -m fmha bench --cuda-graphs --dtype float16 --providers fmha:auto sdpa:cudnn sdpa:flash \
    --ledger $OUT/ledger1.csv 2>&1 | clean
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -40 $OUT/gpu0.txt; tail -45 $OUT/gpu1.txt
# issue 8's run: NCCL across the two GPUs, against one device
timeout 60 torchrun --nproc-per-node 2 examples/ring_attention.py --causal --seqlen 131072 --time 3 2>&1 \
  | tee $OUT/ring_nccl.txt | tail -6
