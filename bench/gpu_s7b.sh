#!/usr/bin/env bash
# Session 7, call 2 (nvidia-h200-x2).  The Gluon kernel on a paged KV cache.  GPU 0: the paged tests and the
# hopper regression subset (varlen, seqused, features, ragged, the table's configs in bf16 bhsd), then the
# bf16 default grid.  GPU 1 (run_id tagged gpu1): bench/paged_speed.py, then the fp16 default grid.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout 280 python3 -m pytest -q -n 16 -p no:benchmark -rfE tests/test_gpu.py tests/test_paged.py -k \
   "paged or (hopper and (varlen or seqused or features or k1537 or ragged)) or (hopper_matches_reference and None-torch.bfloat16-bhsd)" \
   2>&1 | tail -8 > $OUT/gpu0.txt
 bench 290 --dtype bfloat16 --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 220 python3 bench/paged_speed.py --ledger $OUT/ledger1.csv 2>&1 | grep -v "^W1129\|Warning\|warn" > $OUT/gpu1.txt
 bench 330 --dtype float16 --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
