"""PNG plots from a ledger: TFLOP/s against sequence length, ratio to the best peer, roofline."""
from __future__ import annotations

from pathlib import Path

from . import ledger


def _num(r, k):
    try:
        return float(r[k])
    except (KeyError, TypeError, ValueError):
        return None


def latest_grid_run(rows: list[dict]) -> str:
    """The newest run_id holding benchmark rows measured on a GPU (not only ceilings or sweep rows)."""
    runs = [r["run_id"] for r in rows if not r["provider"].startswith("ceiling:")
            and not r["note"].startswith("sweep") and r["ms"] and not r["gpu"].startswith("cpu")]
    if not runs:
        raise ValueError("the ledger holds no benchmark rows measured on a GPU")
    return max(runs)


def panel(r) -> tuple[int, int, int]:
    """The panel a result goes in: (head_dim, causal, seqlen_q), seqlen_q 0 where it equals seqlen_k
    (the default grid: one line per provider over the length); a grid with seqlen_q fixed apart from
    the keys (decoding: 1, 4 and 16 query rows) gets one panel per seqlen_q, over the keys."""
    sq, sk = int(r["seqlen_q"]), int(r["seqlen_k"])
    return int(r["head_dim"]), int(r["causal"]), 0 if sq == sk else sq


def colors(rows: list[dict]) -> dict[str, str]:
    """One color a provider, the same in every panel and plot of a run (matplotlib's cycle in the providers' sorted
    order), so a provider missing from one panel (a peer that failed or refused the shape) shifts no other line's."""
    return {p: f"C{i % 10}" for i, p in enumerate(sorted({r["provider"] for r in rows}))}


def plot(ledger_path, out_dir, run_id: str | None = None) -> list[Path]:
    """Write the plots of one run (default: the latest) under ``out_dir``; returns the paths."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ledger.read(ledger_path)
    run_id = run_id or latest_grid_run(rows)
    if run_id not in {r["run_id"] for r in rows}:
        raise ValueError(f"--run {run_id}: no such run in {ledger_path} (the latest GPU run is "
                         f"{latest_grid_run(rows)})")
    rows = [r for r in rows if r["run_id"] == run_id]
    ok = [r for r in rows if r["ms"] and not r["provider"].startswith("ceiling:")
          and not r["note"].startswith("sweep")]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    gpu = rows[0]["gpu"] if rows else ""
    panels = sorted({panel(r) for r in ok})
    color = colors(ok)
    for dtype in sorted({r["dtype"] for r in ok}):
        sel = [r for r in ok if r["dtype"] == dtype]
        for kind, ylabel in (("tflops", "TFLOP/s"), ("ratio_best_peer", "best peer ms / provider ms")):
            fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 4), squeeze=False)
            shown = {}  # every provider drawn in any panel, for the one legend
            for ax, (d, c, q) in zip(axes[0], panels):
                mine = [r for r in sel if panel(r) == (d, c, q)]
                provs = sorted({r["provider"] for r in mine})
                if kind == "ratio_best_peer":
                    provs = [p for p in provs if p.startswith("fmha:")]
                for p in provs:
                    pts = sorted((int(r["seqlen_k"]), _num(r, kind)) for r in mine if r["provider"] == p
                                 and _num(r, kind))
                    if pts:
                        shown[p] = ax.plot(*zip(*pts), marker="o", label=p, color=color[p],
                                           lw=2.5 if p == "fmha:auto" else 1.2)[0]
                if kind == "ratio_best_peer":
                    ax.axhline(1.0, color="k", lw=0.8, ls="--")
                ax.set_xscale("log", base=2)
                ax.set_title(f"D={d} {'causal' if c else 'non-causal'}" + (f", seqlen_q={q}" if q else ""))
                ax.set_xlabel("keys (seqlen_k)" if q else "sequence length")
                ax.set_ylabel(ylabel)
                ax.grid(alpha=0.3)
            axes[0][0].legend([shown[p] for p in sorted(shown)], sorted(shown), fontsize=7)
            fig.suptitle(f"{gpu} {dtype} run {run_id}")
            fig.tight_layout()
            path = out_dir / f"{kind}_{dtype}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            paths.append(path)

    ceil = {r["provider"]: r for r in rows if r["provider"].startswith("ceiling:")}
    peak = _num(ceil.get("ceiling:matmul", {}), "tflops")
    bw = _num(ceil.get("ceiling:copy", {}), "tbps")
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for p in sorted({r["provider"] for r in ok}):
        pts = [(_num(r, "tflops") / _num(r, "tbps"), _num(r, "tflops")) for r in ok
               if r["provider"] == p and _num(r, "tbps")]
        if pts:
            ax.scatter(*zip(*pts), s=14, label=p, color=color[p])
    if peak and bw:
        import numpy as np
        x = np.logspace(0, 4.5, 100)
        ax.plot(x, np.minimum(peak, bw * x), "k--", lw=1, label=f"roofline ({peak:.0f} TF/s, {bw:.1f} TB/s)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP per byte, Q K V read + O written once)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"roofline, {gpu}, run {run_id}")
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    path = out_dir / "roofline.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return paths + [path]
