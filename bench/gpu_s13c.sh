#!/usr/bin/env bash
# Session 13, call 3 (nvidia-h200-x2).  A K ring one slot deeper than V's (k_stages=3 beside num_stages=2: K loads
# a tile further ahead; the profile had 5.5% of the consumers' samples waiting for K/V, and 3 stages of both left
# no room to stage O).  GPU 0: the hopper GPU tests the producer's new order touches (reference configs with the
# deeper ring, split tail, ragged keys, varlen, seqused, paged), then D=128 non-causal bf16 beside the table;
# GPU 1: the same cells in fp16, then D=128 causal and D=64 bf16 beside the table.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
(export CUDA_VISIBLE_DEVICES=0
 timeout 200 python3 -m pytest -q -x tests/test_gpu.py tests/test_paged.py \
   -k "K3 or split_tail or ragged_keys or varlen or seqused or paged_prefill" 2>&1 | tail -4 > $OUT/gpu0.txt
 bench 120 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[k_stages=3]" sdpa:cudnn \
   --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 bench 120 --dtype float16 --where "head_dim=128 causal=0" --providers fmha:auto "fmha:hopper[k_stages=3]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 120 --dtype bfloat16 --where "head_dim=128 causal=1" --providers fmha:auto "fmha:hopper[k_stages=3]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 bench 120 --dtype bfloat16 --where "head_dim=64 causal=0" --providers fmha:auto "fmha:hopper[k_stages=3]" sdpa:cudnn \
   --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt) &
wait
cat $OUT/gpu0.txt $OUT/gpu1.txt
