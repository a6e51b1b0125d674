#!/usr/bin/env bash
# Session 6, call 1 (nvidia-h200-x2): the Gluon kernel takes packed sequences (varlen) and per-batch key
# lengths (seqused_k).  GPU 0: their hopper tests, the hopper ragged/feature tests and every non-hopper
# varlen/seqused/paged/decode test, then the S=512/1k default cells (the dense path gained one mbarrier
# init).  GPU 1: where decoding's time goes (kernel durations, fmha against cuDNN), then, once GPU 0's
# tests are done (they starve the host), the varlen benchmark.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
gpu0() {
  export CUDA_VISIBLE_DEVICES=0
  timeout 300 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_varlen.py \
    tests/test_paged.py tests/test_decode.py \
    -k "varlen or seqused or per_sequence or (hopper and (k1537 or k77 or features or ragged)) or paged or decode" \
    2>&1 | tail -15
  touch $OUT/tests_done
  bench 150 --dtype bfloat16 --where "seqlen_q=512,1024" --ledger $OUT/ledger0.csv
}
gpu1() {
  export CUDA_VISIBLE_DEVICES=1
  timeout 120 python3 bench/decode_profile.py 2>&1
  while [ ! -e $OUT/tests_done ]; do sleep 2; done
  timeout 240 python3 bench/varlen_speed.py --json $OUT/varlen.json 2>&1
}
gpu0 > $OUT/gpu0.txt 2>&1 &
gpu1 > $OUT/gpu1.txt 2>&1 &
wait
tail -40 $OUT/gpu0.txt; tail -60 $OUT/gpu1.txt
