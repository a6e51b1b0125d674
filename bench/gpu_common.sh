# Helpers for the device scripts (sourced): unbuffered Python on the work tree, progress lines dropped,
# `bench SECONDS ARGS...` = fmha bench under CUDA graphs against cuDNN and SDPA's flash, with a time limit.
export PYTHONPATH=src PYTHONUNBUFFERED=1
# the work tree copied to the GPU machine may carry a stale .git: every ledger row names the commit it ran
: "${FMHA_GIT_SHA:?run as FMHA_GIT_SHA=<the commit this call runs> bash bench/<script>.sh}"
clean() { tr '\r' '\n' | grep -v '^\['; }
bench() {
  local limit=$1; shift
  timeout "$limit" python3 -m fmha bench --cuda-graphs --providers fmha:auto sdpa:cudnn sdpa:flash "$@" 2>&1 | clean
}
# `sweep SECONDS ARGS...` = fmha sweep under CUDA graphs, with a time limit.
sweep() {
  local limit=$1; shift
  timeout "$limit" python3 -m fmha sweep --cuda-graphs "$@" 2>&1 | clean | grep -v "^$"
}
