"""Sweep the backward's tiles on this GPU: each (dK/dV tiles, dQ tiles) pair of :func:`fmha.backward.tiles`'s
shape, in both dQ modes (atomic, ``deterministic``), timed on the default grid's shapes.

    PYTHONPATH=src python3 bench/backward_tiles.py [--head-dims 64 128 192] [--seqlens 4096 16384]
        [--dtype bfloat16] [--dropout 0.1] [--ledger bench/ledger.csv]

A candidate is ``BLOCK_M x BLOCK_N / warps / stages``, past head_dim 128 also ``/ halves`` (the dK/dV kernel's
columns in two programs a block, :func:`fmha.kernels.backward.dkdv_kernel`'s ``HALVES``); for each head dim the dK/dV
candidates are
timed with the atomic dQ (no dQ kernel) and with the table's dQ tiles, then the dQ candidates with the
table's dK/dV tiles.  The gradients of every candidate are checked against the table's deterministic ones
(the same sums in another tiling: within 2e-2 of the largest gradient).  Rows: ``provider``
``fmha:backward``, ``config`` ``dkdv=.. dq=.. atomic|deterministic``, ``pass`` ``bwd``, TFLOP/s 2.5x
the forward's FLOPs.  The table to edit is :func:`fmha.backward.tiles`.  ``--dropout P``: every call with attention
dropout at P, drawn from one seed (the candidates draw the same pairs; ``features`` ``dropout=P``).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1] / "src"))  # after PYTHONPATH: another tree can be timed

from fmha import backward, forward, replay  # noqa: E402
from fmha.bench import ledger  # noqa: E402
from fmha.bench.flops import attention_flops  # noqa: E402
from fmha.bench.runner import time_ms  # noqa: E402
from fmha.bench.timing import tflops  # noqa: E402

KV_CANDIDATES = {64: [(64, 128, 8, 2), (32, 128, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2), (64, 128, 4, 2),
                      (64, 64, 8, 2), (32, 64, 4, 2)],
                 128: [(64, 128, 8, 2), (32, 128, 4, 2), (64, 64, 4, 2), (32, 64, 4, 3), (64, 128, 8, 1),
                       (64, 64, 8, 2), (64, 32, 4, 2), (64, 32, 8, 2)],
                 256: [(32, 64, 8, 1), (32, 64, 4, 1), (64, 64, 8, 1), (16, 64, 4, 2), (32, 32, 4, 2), (64, 32, 8, 1),
                       (64, 16, 4, 2), (64, 64, 8, 1, True), (64, 64, 8, 2, True), (128, 64, 8, 1, True)]}
Q_CANDIDATES = {64: [(128, 64, 8, 2), (128, 64, 4, 3), (64, 64, 4, 3), (128, 128, 8, 2)],
                128: [(128, 64, 8, 2), (64, 64, 4, 2), (128, 32, 4, 3), (64, 128, 8, 2)],
                256: [(64, 32, 8, 1), (32, 64, 8, 1), (64, 32, 4, 2), (32, 32, 4, 2)]}


def as_dict(t):
    return backward._t(*t[:4], 0, *t[4:])


def as_tuple(tiles):
    """A table's tiles (:func:`fmha.backward._t`) as a candidate."""
    return (tiles["BLOCK_M"], tiles["BLOCK_N"], tiles["num_warps"], tiles["num_stages"],
            *([True] if tiles.get("HALVES") else []))


def name(t):
    return f"{t[0]}x{t[1]}/{t[2]}w/{t[3]}s" + ("/halves" if len(t) > 4 and t[4] else "")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 192])
    ap.add_argument("--seqlens", type=int, nargs="+", default=[4096, 16384])
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--ledger", default=None)
    ap.add_argument("--tokens", type=int, default=16384, help="batch x seqlen of every shape")
    ap.add_argument("--device", default="cuda", help="cpu: a check of the tool under the interpreter")
    ap.add_argument("--dropout", type=float, default=0.0, help="attention dropout's probability in every call")
    args = ap.parse_args(argv)
    dt = getattr(torch, args.dtype)
    dev = args.device
    env = ledger.environment(dev)
    table = backward.tiles
    rows = []
    for d in args.head_dims:
        dv = 128 if d == 192 else d  # MLA's 192/128
        group = 64 if d <= 64 else 128 if d <= 128 else 256
        kv_table, q_table = (as_tuple(c) for c in table(max(d, dv), False, True))
        trials = [(kv, None) for kv in KV_CANDIDATES[group]]
        trials += [(kv, q_table) for kv in KV_CANDIDATES[group]]
        trials += [(kv_table, q) for q in Q_CANDIDATES[group] if q != q_table]
        for causal in (False, True):
            for s in args.seqlens:
                b, h = max(args.tokens // s, 1), 2048 // dv
                g = torch.Generator(device=dev).manual_seed(0)
                q, k = (torch.randn(b, h, s, d, device=dev, dtype=dt, generator=g) for _ in "qk")
                v, do = (torch.randn(b, h, s, dv, device=dev, dtype=dt, generator=g) for _ in "vo")
                kw = dict(causal=causal, scale=None, causal_align="top_left", layout="bhsd")
                if args.dropout:
                    kw["dropout"] = (torch.tensor([1234], dtype=torch.int64, device=dev), args.dropout)
                o, lse = forward.dense(q, k, v, variant="auto", return_lse=True, **kw)
                want = backward.dense(do, q, k, v, o, lse, deterministic=True, **kw)[:3]
                largest = max(float(w.abs().max()) for w in want)
                flops = 2.5 * attention_flops(b, h, s, s, d, causal, head_dim_v=dv)
                for kv, qt in trials:
                    backward.tiles = lambda *_, kv=kv, qt=qt: (as_dict(kv), qt and as_dict(qt))
                    replay.clear(compiled=False)  # (a recorded call would replay the last candidate's kernels)
                    config = f"dkdv={name(kv)} dq={name(qt) if qt else '-'} {'deterministic' if qt else 'atomic'}"
                    try:
                        got = backward.dense(do, q, k, v, o, lse, **kw)[:3]
                        err = max(float((x.float() - y.float()).abs().max()) for x, y in zip(got, want)) / largest
                        ms = time_ms(lambda: backward.dense(do, q, k, v, o, lse, **kw), dev)
                        note = "ok" if err < 2e-2 else f"gradients differ by {err:.3g} of the largest"
                    except Exception as e:  # noqa: BLE001  (a candidate that does not fit is a row too)
                        ms, err, note = float("nan"), float("nan"), f"failed: {type(e).__name__}: {str(e)[:80]}"
                    finally:
                        backward.tiles = table
                        replay.clear(compiled=False)
                    rows.append({**env, "provider": "fmha:backward", "config": config, "dtype": args.dtype,
                                 "batch": b, "heads": h, "kv_heads": h, "seqlen_q": s, "seqlen_k": s, "head_dim": d,
                                 "causal": int(causal), "ms": ms, "tflops": tflops(flops, ms), "error": err,
                                 "note": note, "pass": "bwd",
                                 "features": " ".join(([f"head_dim_v={dv}"] if dv != d else [])
                                                      + ([f"dropout={args.dropout:g}"] if args.dropout else []))})
                    print(f"D{d:<3} {'causal' if causal else 'full':6} S{s:<6} {config:58} "
                          f"{rows[-1]['tflops']:6.0f} TFLOP/s  {note}", flush=True)
        ledger.append(args.ledger, rows)  # a head dim at a time: a run cut short keeps what it measured
        rows = []


if __name__ == "__main__":
    main()
