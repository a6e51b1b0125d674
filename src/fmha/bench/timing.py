"""Timing on the GPU: median of triton's do_bench after a warm-up; each kernel's time under torch.profiler."""
from __future__ import annotations

from typing import Callable


def median_ms(fn: Callable[[], object], warmup_ms: int = 25, rep_ms: int = 100) -> float:
    import triton.testing
    return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))


def graph_median_ms(fn: Callable[[], object], rep_ms: int = 100) -> float:
    """Median over CUDA-graph replays of ``fn``: the GPU time without the host's launch cost
    (BENCH.md's protocol for tiny launches)."""
    import triton.testing
    return float(triton.testing.do_bench_cudagraph(fn, rep=rep_ms, return_mode="median"))


def kernel_times(fn: Callable[[], object], reps: int, warmup: int = 3) -> dict[str, float]:
    """Each GPU kernel's mean time (us) a call of ``fn``, longest first: ``reps`` calls under torch.profiler (CUPTI's
    kernel records) after ``warmup`` calls; their sum is the GPU's busy time (launch gaps are not in it)."""
    from collections import defaultdict

    import torch
    from torch.profiler import ProfilerActivity, profile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    total: dict = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name[:80]] += event.device_time
    return {name: us / reps for name, us in sorted(total.items(), key=lambda x: -x[1])}


def tflops(flops: int, ms: float) -> float:
    return flops / (ms * 1e-3) / 1e12
