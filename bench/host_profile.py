"""Host time of one eager call, fmha beside SDPA, for each path ``auto`` takes, and where fmha's goes.

    PYTHONPATH=src python3 bench/host_profile.py [--cases decode prefill varlen varlen-tiled paged] [--calls 300]
        [--profile decode] [--ledger bench/ledger.csv]

A case times ``--calls`` calls back to back on the launching side (the GPU kept busy behind them, so
the figure is what the host spends to enqueue one call), after a warm-up call; SDPA gets the same
q, k, v (the padded batch for varlen, the gathered cache for paged).  ``--profile CASE`` prints
cProfile's top entries for that case.  Ledger rows: ``provider`` ``host:fmha`` / ``host:sdpa``,
``features`` ``part=host case=<case>``, ``ms`` the host time per call, ``ratio_best_peer`` SDPA's
over fmha's.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import fmha  # noqa: E402
from fmha.bench import ledger  # noqa: E402

SDPA = torch.nn.functional.scaled_dot_product_attention


def cases(dt=torch.bfloat16) -> dict:
    """name -> (shape note, fmha call, SDPA call, (batch, heads, kv_heads, seqlen_q, seqlen_k, D))."""
    dev = "cuda"
    out = {}
    q, k, v = (torch.randn(1, h, s, 64, device=dev, dtype=dt) for h, s in ((32, 1), (8, 1024), (8, 1024)))
    out["decode"] = (lambda: fmha.attention(q, k, v), lambda: SDPA(q, k, v, enable_gqa=True), (1, 32, 8, 1, 1024, 64))
    qp, kp, vp = (torch.randn(2, s, h, 128, device=dev, dtype=dt) for h, s in ((32, 1024), (8, 1024), (8, 1024)))
    out["prefill"] = (lambda: fmha.attention(qp, kp, vp, causal=True, layout="bshd"),
                      lambda: SDPA(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), is_causal=True,
                                   enable_gqa=True), (2, 32, 8, 1024, 1024, 128))
    lens = [700, 1024, 300, 1000]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev)
    qv, kv_, vv = (torch.randn(sum(lens), h, 128, device=dev, dtype=dt) for h in (32, 8, 8))
    qpad, kpad, vpad = (torch.randn(len(lens), h, max(lens), 128, device=dev, dtype=dt) for h in (32, 8, 8))
    out["varlen"] = (lambda: fmha.attention_varlen(qv, kv_, vv, cu, cu, max(lens), max(lens), causal=True),
                     lambda: SDPA(qpad, kpad, vpad, is_causal=True, enable_gqa=True),
                     (len(lens), 32, 8, max(lens), max(lens), 128))
    out["varlen-tiled"] = (lambda: fmha.attention_varlen(qv, kv_, vv, cu, cu, max(lens), max(lens), causal=True,
                                                         variant="tiled"),
                           out["varlen"][1], out["varlen"][2])  # the cu_seqlens checked on the device
    page, pages = 256, 16
    kc, vc = (torch.randn(4 * pages, page, 8, 128, device=dev, dtype=dt) for _ in range(2))
    table = torch.arange(4 * pages, device=dev, dtype=torch.int32).view(4, pages)
    seqlens = torch.full((4,), pages * page - 7, device=dev, dtype=torch.int32)
    qd = torch.randn(4, 32, 1, 128, device=dev, dtype=dt)
    kg, vg = (t.view(4, pages * page, 8, 128).transpose(1, 2) for t in (kc, vc))
    out["paged"] = (lambda: fmha.attention_paged(qd, kc, vc, table, seqlens),
                    lambda: SDPA(qd, kg, vg, enable_gqa=True), (4, 32, 8, 1, pages * page, 128))
    return out


def host_us(fn, calls: int) -> float:
    """Host microseconds per call to enqueue ``calls`` calls (one call first, to compile)."""
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    us = (time.perf_counter() - t0) / calls * 1e6
    torch.cuda.synchronize()
    return us


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=["decode", "prefill", "varlen", "varlen-tiled", "paged"])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--profile", default=None, help="print cProfile's top entries for this case")
    p.add_argument("--ledger", default=None)
    args = p.parse_args()
    env = ledger.environment("cuda")
    table = cases()
    rows = []
    print(f"{'case':8} {'fmha us':>8} {'sdpa us':>8} {'fmha/sdpa':>9}")
    for name in args.cases:
        ours, theirs, (b, h, kvh, sq, sk, d) = table[name]
        us = {"fmha": host_us(ours, args.calls), "sdpa": host_us(theirs, args.calls)}
        print(f"{name:8} {us['fmha']:8.1f} {us['sdpa']:8.1f} {us['fmha'] / us['sdpa']:9.2f}", flush=True)
        for who, t in us.items():
            rows.append(dict(env, provider=f"host:{who}", config="eager, host time per call", dtype="bfloat16",
                             batch=b, heads=h, kv_heads=kvh, seqlen_q=sq, seqlen_k=sk, head_dim=d, causal="",
                             ms=t / 1e3, ratio_best_peer=us["sdpa"] / t, note="ok", features=f"part=host case={name}"))
    ledger.append(args.ledger, rows)
    if args.profile:
        fn = table[args.profile][0]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
