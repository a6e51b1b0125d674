"""Clock and power while one kernel runs back to back: is the sustained rate bound by the power limit?

`PYTHONPATH=src python3 bench/power_probe.py [--seconds 5] [--gpu 0] [--hopper head_group=2 ...]`: runs,
one after the other for ``--seconds`` each, fmha and cuDNN on (B=1, H=16, S=16384, D=128) bf16 non-causal
(and the ``hopper`` kernel on its table config with each ``--hopper`` change: ``field=value,...``) and an
8192^3 bf16 matrix product, while ``nvidia-smi`` samples the SM clock, the power draw and the clock event reasons
every 100 ms; prints each phase's rate (TFLOP/s over the whole phase, launches back to back) beside the
median clock and power of its samples and the reasons seen most.  First, each kernel's single call after
3 s idle (a CUDA-graph replay, timed by CUDA events): a single call from idle runs faster than the
same call sustained, under the 700 W cap.
"""
import argparse
import dataclasses
import statistics
import subprocess
import threading
import time
from collections import Counter

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha import configs
from fmha.bench.providers import config_changes

FIELDS = "clocks.sm,power.draw,enforced.power.limit,temperature.gpu,clocks_event_reasons.active"


def sample(gpu: int, out: list, stop: threading.Event) -> None:
    """(host time, fields...) from nvidia-smi every 100 ms until ``stop``."""
    proc = subprocess.Popen(["nvidia-smi", "-i", str(gpu), f"--query-gpu={FIELDS}", "--format=csv,noheader,nounits",
                             "-lms", "100"], stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        out.append((time.time(), [x.strip() for x in line.split(",")]))
        if stop.is_set():
            break
    proc.terminate()


def run_for(fn, seconds: float) -> tuple[float, float, int]:
    """(start, end, calls): ``fn`` back to back for about ``seconds``, synchronising every 8 calls."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, calls = time.time(), 0
    while time.time() - start < seconds:
        for _ in range(8):
            fn()
        calls += 8
        torch.cuda.synchronize()
    return start, time.time(), calls


def cold_call_ms(fn) -> float:
    """One replay of ``fn`` captured in a CUDA graph (no host time inside the timed span) after 3 s with
    the GPU idle, in ms by CUDA events."""
    fn()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    time.sleep(3.0)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--gpu", type=int, default=0, help="nvidia-smi's index of the GPU torch runs on")
    ap.add_argument("--hopper", nargs="*", default=[], help="table-config changes to run too: field=value,...")
    args = ap.parse_args()
    q, k, v = (torch.randn(1, 16, 16384, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    attention_flops = 4 * 16 * 16384 * 16384 * 128
    def changed(spec: str):
        cfg = dataclasses.replace(configs.hopper_config(128, False, 16384), **config_changes(spec))
        return lambda: fmha.attention(q, k, v, variant="hopper", config=cfg)

    phases = [("fmha", lambda: fmha.attention(q, k, v), attention_flops)]
    phases += [(f"fmha[{spec}]", changed(spec), attention_flops) for spec in args.hopper]
    phases += [("cudnn", cudnn, attention_flops), ("matmul", lambda: a @ b, 2 * 8192 ** 3),
               ("fmha again", lambda: fmha.attention(q, k, v), attention_flops)]
    for name, fn, flops in phases[:-1]:
        ms = cold_call_ms(fn)
        print(f"{name:<18} one call after 3 s idle: {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s")
    samples, stop = [], threading.Event()
    sampler = threading.Thread(target=sample, args=(args.gpu, samples, stop), daemon=True)
    sampler.start()
    time.sleep(1.0)
    spans = []
    for name, fn, flops in phases:
        start, end, calls = run_for(fn, args.seconds)
        spans.append((name, start, end, flops * calls / (end - start) / 1e12))
        time.sleep(1.0)
    stop.set()
    print(f"{'phase':<18} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6} {'limit W':>8} {'C':>4}  reasons (bitmask: count)")
    for name, start, end, rate in spans:
        inside = [f for t, f in samples if start + 0.5 <= t <= end]  # past the first half second
        if not inside:
            print(f"{name:<18} {rate:8.0f}  (no samples)")
            continue
        clock, power, limit, temp = (statistics.median(float(f[i]) for f in inside) for i in range(4))
        reasons = ", ".join(f"{r}: {n}" for r, n in Counter(f[4] for f in inside).most_common(3))
        print(f"{name:<18} {rate:8.0f} {clock:7.0f} {power:6.0f} {limit:8.0f} {temp:4.0f}  {reasons}")


if __name__ == "__main__":
    main()
