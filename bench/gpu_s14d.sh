#!/usr/bin/env bash
# Session 14, call 4 (nvidia-h200-x2).  The long cells (4k-16k tokens, D=64 and 128, causal off and on) timed the
# way BENCH.md's protocol and ../shared/gluon/fa_fwd_probe.py (the run that gave FA4's 671) time them: plain
# `triton.testing.do_bench` (median, L2 flushed before every call), no CUDA graphs -- `fmha bench` without
# --cuda-graphs, every provider alike.  These launches (0.35-3 ms of GPU time) are not tiny: the host's launch
# cost hides behind the GPU.  GPU 0 bf16, GPU 1 fp16.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
plain() { timeout 200 python3 -m fmha bench --providers fmha:auto sdpa:cudnn sdpa:flash "$@" 2>&1 | clean; }
(export CUDA_VISIBLE_DEVICES=0
 plain --dtype bfloat16 --where "seqlen_q=4096,8192,16384" --ledger $OUT/ledger0.csv > $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 plain --dtype float16 --where "seqlen_q=4096,8192,16384" --ledger $OUT/ledger1.csv > $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
