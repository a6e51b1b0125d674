#!/usr/bin/env bash
# The measurements docs/PERF.md quotes, in one script, on a GPU machine with torch and triton installed:
#   FMHA_GIT_SHA=$(git rev-parse --short HEAD) bash bench/reproduce.sh [LEDGER]
# (a work tree copied to the GPU machine may carry a stale .git: every ledger row names the commit it ran).
# Rows go to LEDGER (default bench/ledger.csv); every grid runs under CUDA graphs beside cuDNN and SDPA's flash.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src PYTHONUNBUFFERED=1
: "${FMHA_GIT_SHA:?set FMHA_GIT_SHA to the commit this tree holds}"
ledger=${1:-bench/ledger.csv}
bench() { python3 -m fmha bench --cuda-graphs --ledger "$ledger" --providers fmha:auto sdpa:cudnn sdpa:flash "$@"; }
bench --dtype bfloat16                   # the default grid
bench --dtype float16
bench --grid extra --dtype bfloat16      # GQA, seqlen_q != seqlen_k, 128k tokens
bench --grid decode --dtype bfloat16
bench --grid ragged --dtype bfloat16     # lengths off the 128-key tile
python3 -m fmha bench --cuda-graphs --ledger "$ledger" --grid features --dtype bfloat16 \
    --providers fmha:auto fmha:tiled sdpa:cudnn sdpa:efficient
python3 bench/varlen_speed.py --ledger "$ledger"
python3 bench/paged_speed.py --ledger "$ledger"
python3 bench/guard_cost.py --ledger "$ledger"
bench --grid models --dtype bfloat16     # real models' head counts in contiguous, transformers-view and fused-qkv layouts
python3 -m fmha bench --pass bwd --ledger "$ledger" --dtype bfloat16 float16 \
    --providers fmha:auto fmha:deterministic sdpa:cudnn sdpa:flash    # the backward, both dQ modes
python3 -m fmha bench --pass bwd --ledger "$ledger" --grid mla --dtype bfloat16 --providers fmha:auto sdpa:cudnn
python3 bench/backward_tiles.py --ledger "$ledger"                    # the backward's tile table, swept
python3 bench/host_profile.py --ledger "$ledger"
python3 bench/fp8_speed.py                                             # float8 K/V against bf16 (printed)
python3 bench/model_speed.py --ledger "$ledger"
bench --grid mla --dtype bfloat16        # DeepSeek-V3 prefill heads: q/k 192, v 128 (FA4 takes it when installed)
bench --grid head-dims --dtype bfloat16  # head dims 32, 96, 256 on the Gluon kernel
