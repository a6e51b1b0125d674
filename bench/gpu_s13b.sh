#!/usr/bin/env bash
# Session 13, call 2 (nvidia-h200-x2).  The split tail as stream-K (the last round's key tiles in equal runs over
# the programs) and a merge of several rows a program, against the previous commit's code (old/src, an untracked
# copy of c51aba8's src carried with the tree) in the same call: new, old, new again.  GPU 0: the split, decode and
# merge GPU tests, then D=128 non-causal bf16; GPU 1: the same in fp16, then the decode grid (bf16) new and old.
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
NEW_SHA=$FMHA_GIT_SHA
abc() {  # abc LIMIT ARGS...: the new code, the old, the new again, one ledger
  bench "$@"
  (export PYTHONPATH=old/src FMHA_GIT_SHA=c51aba8 FMHA_RUN_TAG=${FMHA_RUN_TAG:+$FMHA_RUN_TAG-}old; bench "$@")
  bench "$@"
}
(export CUDA_VISIBLE_DEVICES=0
 timeout 150 python3 -m pytest -q -x tests/test_gpu.py tests/test_decode.py -k "split_tail or decode or graph or merge" \
   2>&1 | tail -4 > $OUT/gpu0.txt
 abc 100 --dtype bfloat16 --where "head_dim=128 causal=0" --providers fmha:auto sdpa:cudnn \
   --ledger $OUT/ledger0.csv >> $OUT/gpu0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 abc 100 --dtype float16 --where "head_dim=128 causal=0" --providers fmha:auto sdpa:cudnn \
   --ledger $OUT/ledger1.csv > $OUT/gpu1.txt
 bench 100 --grid decode --dtype bfloat16 --providers fmha:auto sdpa:cudnn --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt
 (export PYTHONPATH=old/src FMHA_GIT_SHA=c51aba8 FMHA_RUN_TAG=gpu1-old
  bench 100 --grid decode --dtype bfloat16 --providers fmha:auto sdpa:cudnn --ledger $OUT/ledger1.csv >> $OUT/gpu1.txt)) &
wait
echo "new sha $NEW_SHA"
cat $OUT/gpu0.txt $OUT/gpu1.txt
