"""Turn ledger rows into text tables (the CLI prints them)."""
from __future__ import annotations

from collections import OrderedDict

from . import published


def _f(x, fmt):
    try:
        return format(float(x), fmt)
    except (TypeError, ValueError):
        return "-"


def grid_table(rows: list[dict], focus: str = "fmha:auto", timing_means_nothing: bool = False) -> str:
    """One line per (dtype, cell): TFLOP/s per provider, then focus / best SDPA and / best peer."""
    cells: OrderedDict = OrderedDict()
    provs: list[str] = []
    for r in rows:
        key = (r["dtype"], int(r["batch"]), int(r["heads"]), int(r["kv_heads"]), int(r["seqlen_q"]),
               int(r["seqlen_k"]), int(r["head_dim"]), int(r["causal"]), r.get("features") or "")
        cells.setdefault(key, {})[r["provider"]] = r
        if r["provider"] not in provs:
            provs.append(r["provider"])
    short = [p.replace("fmha:", "").replace("sdpa:", "") for p in provs]
    feats = any(key[-1] for key in cells)  # a column for the modifiers when some cell has them
    head = ["dtype", "B", "H/KV", "Sq", "Sk", "D", "causal", *(["features"] if feats else []), *short,
            f"{focus[5:]}/sdpa", f"{focus[5:]}/peer", "err"]
    lines, ratios = [], []
    for key, by in cells.items():
        dt, b, h, kv, sq, sk, d, c, feat = key
        vals = [_f(by[p].get("tflops"), ".0f") if p in by else "-" for p in provs]
        f = by.get(focus, {})
        sdpa = [float(r["ms"]) for p, r in by.items() if p.startswith("sdpa:") and r.get("ms") not in ("", None)]
        ratio_sdpa = (min(sdpa) / float(f["ms"])) if sdpa and f.get("ms") not in ("", None) else None
        if ratio_sdpa is not None:
            ratios.append(ratio_sdpa)
        lines.append([dt, str(b), f"{h}/{kv}", str(sq), str(sk), str(d), "yes" if c else "no",
                      *([feat or "-"] if feats else []), *vals,
                      _f(ratio_sdpa, ".2f"), _f(f.get("ratio_best_peer"), ".2f"), _f(f.get("error"), ".1e")])
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    fmt = lambda row: "  ".join(x.rjust(w) for x, w in zip(row, widths))  # noqa: E731
    out = [fmt(head), fmt(["-" * w for w in widths]), *map(fmt, lines)]
    failures = [r for r in rows if str(r.get("note", "")).startswith("failed")]
    out.append(f"TFLOP/s per provider; {focus}/sdpa = best SDPA backend's ms / {focus}'s ms, "
               f"/peer = the same against every peer (> 1: faster). {len(failures)} provider-cell(s) failed "
               f"(see the ledger's note column).")
    if ratios and not timing_means_nothing:
        out.append(f"{focus} >= 1.0x the best SDPA backend in {sum(r >= 1.0 for r in ratios)} of {len(ratios)} "
                   f"cells (ratios {min(ratios):.2f}-{max(ratios):.2f}).")
    forward = all(r.get("pass", "fwd") in ("fwd", "") for r in rows)  # FA4's published figures are forward
    fa4 = None if timing_means_nothing or not forward else published.fa4_geomean(rows, focus)
    if fa4 is not None:
        within = "" if fa4[2] is None else (f"; each run against its own cuDNN ({focus}/cuDNN here over "
                                            f"FA4/cuDNN there): {fa4[2]:.3f}x")
        out.append(f"{focus} against FlashAttention-4's figures in BENCH.md (another run, {fa4[1]} shapes): "
                   f"geometric mean {fa4[0]:.3f}x{within}.")
    if timing_means_nothing:
        out.append("CPU interpreter run: the times above mean nothing; only the errors do.")
    return "\n".join(out)


def measured(named: dict, one) -> dict:
    """name -> (ms, error) by ``one(name, fn)`` for each named callable, or (None, why): the reason a provider gave
    instead of a callable, or the exception with which a backend refused the call (a bench script's cells)."""
    results = {}
    for name, fn in named.items():
        if isinstance(fn, str):
            results[name] = (None, fn)
            continue
        try:
            results[name] = one(name, fn)
        except Exception as e:  # noqa: BLE001 -- a backend that refuses the call is reported
            results[name] = (None, f"{type(e).__name__}: {' '.join(str(e).split())}"[:100])
    return results


def cell_lines(label: str, results: dict, flops: float, is_peer, width: int = 28) -> list[tuple]:
    """Print one cell's line per provider of :func:`measured`'s ``results`` after ``label``: ms, TFLOP/s, the
    fastest peer's time over its own (``is_peer(name)``), error, or why it was skipped.  Returns ``(name, ms,
    TFLOP/s, ratio, error)`` of those timed, for the ledger's rows."""
    peers = [ms for name, (ms, _) in results.items() if ms is not None and is_peer(name)]
    best = min(peers) if peers else None
    timed = []
    for name, (ms, err) in results.items():
        if ms is None:
            print(f"{label} {name:<{width}} skipped: {err}")
            continue
        ratio = best / ms if best else float("nan")
        print(f"{label} {name:<{width}} {ms:>8.3f} {flops / ms / 1e9:>8.1f} {ratio:>11.3f} {err:>8.1e}", flush=True)
        timed.append((name, ms, flops / ms / 1e9, ratio, err))
    return timed
