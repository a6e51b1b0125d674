#!/usr/bin/env bash
# Session 20, call 3 (nvidia-h200-x2).  Call 2's tests again (their ids hold spaces: passed as an array this time),
# half on each GPU; then GPU 0 the extra grid (bf16) beside the standing pivot on its 128k row, GPU 1 the bf16
# default grid again (is call 2's grid reproduced?).
set -o pipefail
source "$(dirname "$0")/gpu_common.sh"
K="not (test_hopper_matches_reference and not None) and not (test_gpu_matches_reference and not auto)"
K="$K and not cluster_matches and not rescales"
python3 -m pytest --collect-only -q -m gpu tests -k "$K" 2>/dev/null | grep '::' > $OUT/ids.txt
mapfile -t ODD < <(awk 'NR%2==1' $OUT/ids.txt)
mapfile -t EVEN < <(awk 'NR%2==0' $OUT/ids.txt)
(export CUDA_VISIBLE_DEVICES=0
 timeout 220 python3 -m pytest -q -n 8 -p no:cacheprovider "${ODD[@]}" > $OUT/tests0.txt 2>&1
 timeout 250 python3 -m fmha bench --cuda-graphs --grid extra --dtype bfloat16 --ledger $OUT/ledger0.csv \
   --providers fmha:auto "fmha:hopper[stale=1]" sdpa:cudnn sdpa:flash 2>&1 | clean | grep -v "Warning\|return torch" \
   > $OUT/extra0.txt) &
(export CUDA_VISIBLE_DEVICES=1 FMHA_RUN_TAG=gpu1
 timeout 220 python3 -m pytest -q -n 8 -p no:cacheprovider "${EVEN[@]}" > $OUT/tests1.txt 2>&1
 bench 250 --dtype bfloat16 --ledger $OUT/ledger1.csv > $OUT/grid1.txt) &
wait
wc -l < $OUT/ids.txt; for f in $OUT/tests0.txt $OUT/tests1.txt; do tail -n 3 $f; done; cat $OUT/extra0.txt $OUT/grid1.txt
