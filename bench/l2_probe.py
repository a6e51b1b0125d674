"""How fast can every SM read data that sits in L2?  A ceiling for the 16k cell's K/V traffic.

`PYTHONPATH=src python3 bench/l2_probe.py [--gpu-ms 300]`: a Triton kernel, a few programs per SM, reads
a bf16 buffer over and over with loads that skip L1 (``.cg``), each program striding through it, and
sums it; the buffer sizes from 4 MB (one head's K/V at 8k keys) to 32 MB stay in the 50 MB L2, and 2 GB
reads HBM for reference (offsets in int32: up to 2G elements).  Prints TB/s per size (bytes read over
the kernel's time, CUDA events over repeated launches after a warm-up).  At 128 query rows a program,
the (1, 16, 16384, 128) non-causal cell reads 64 KB of K/V from L2 per 8.4 MFLOP: 5.0 TB/s at 654 TFLOP/s.
"""
import argparse

import torch
import triton
import triton.language as tl

BLOCK = 4096  # bf16 elements a program loads at once (8 KB)


@triton.jit
def l2_read(X, Out, chunks, iters, BLOCK: tl.constexpr):
    """Program p sums chunks p, p + P, p + 2P, ... of ``X``, ``iters`` times over."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], tl.float32)
    for _ in range(iters):
        for c in range(pid, chunks, nprog):
            acc += tl.load(X + c * BLOCK + offs, cache_modifier=".cg").to(tl.float32)
    tl.store(Out + pid * BLOCK + offs, acc)


def rate(nbytes: int, gpu_ms: float, per_sm: int) -> float:
    """TB/s reading an ``nbytes`` bf16 buffer, about ``gpu_ms`` of kernel time."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    grid = sms * per_sm
    x = torch.randn(nbytes // 2, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(grid * BLOCK, device="cuda", dtype=torch.float32)
    chunks = x.numel() // BLOCK
    l2_read[(grid,)](x, out, chunks, 1, BLOCK=BLOCK, num_warps=8)  # compile, warm L2
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    l2_read[(grid,)](x, out, chunks, 4, BLOCK=BLOCK, num_warps=8)
    end.record()
    torch.cuda.synchronize()
    iters = max(1, int(4 * gpu_ms / start.elapsed_time(end)))
    start.record()
    l2_read[(grid,)](x, out, chunks, iters, BLOCK=BLOCK, num_warps=8)
    end.record()
    torch.cuda.synchronize()
    return iters * chunks * BLOCK * 2 / (start.elapsed_time(end) * 1e-3) / 1e12


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu-ms", type=float, default=300.0, help="kernel time per measurement")
    args = ap.parse_args()
    rate(4 << 20, 50.0, 2)  # a first call pays for the compile and the clocks' ramp
    print(torch.cuda.get_device_name(0))
    print(f"{'buffer':>8} {'programs/SM':>11} {'TB/s':>6}")
    for mb in (4, 8, 16, 32, 2048):
        for per_sm in (2, 4):
            print(f"{mb:>6}MB {per_sm:>11} {rate(mb << 20, args.gpu_ms, per_sm):>6.2f}", flush=True)


if __name__ == "__main__":
    main()
