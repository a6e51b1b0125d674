#!/usr/bin/env bash
# Session 20, call 4 (nvidia-h200-x2).  The standing pivot with the first-seen guard (a row whose first visible keys
# come after its item's first tile takes that tile again, for a real maximum): every GPU test of the table's paths
# and of the stale configs, split over both GPUs, each result on its own line; then the one cell the guard touches
# (D=128 causal at 512 keys, bf16 and fp16).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
K="not (test_hopper_matches_reference and not None and not x-) and not (test_gpu_matches_reference and not auto)"
K="$K and not (cluster_matches and not x-) or rescales"
python3 -m pytest --collect-only -q -m gpu tests -k "$K" 2>/dev/null | grep '::' > $OUT/ids.txt
mapfile -t ODD < <(awk 'NR%2==1' $OUT/ids.txt)
mapfile -t EVEN < <(awk 'NR%2==0' $OUT/ids.txt)
(export CUDA_VISIBLE_DEVICES=0
 timeout 420 python3 -m pytest -v -rf -n 14 -p no:cacheprovider "${ODD[@]}" 2>&1 | grep -v Warning > $OUT/tests0.txt
 timeout 60 python3 -m fmha bench --cuda-graphs --dtype bfloat16 float16 --where "head_dim=128 causal=1 seqlen_k=512" \
   --ledger $OUT/ledger0.csv --providers fmha:auto "fmha:hopper[stale=0]" sdpa:cudnn 2>&1 | clean > $OUT/ab0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 420 python3 -m pytest -v -rf -n 14 -p no:cacheprovider "${EVEN[@]}" 2>&1 | grep -v Warning > $OUT/tests1.txt) &
wait
wc -l < $OUT/ids.txt; grep -h "FAILED\|passed\|failed" $OUT/tests0.txt $OUT/tests1.txt | grep -v "^\[gw" | tail -20
grep -h "FAILED" $OUT/tests0.txt $OUT/tests1.txt | head -20; cat $OUT/ab0.txt
