"""Each CTA's work items on the timeline, from a trace of `bench/trace_tail.patch`: the table's cluster row
against the same with the last round in pieces, at (1, 16, 16384, 128) bf16.

`python bench/plot_trace.py TRACE.npz OUT.png` (TRACE.npz: what `bench/trace_tail.py` writes)
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def main(trace: str, out: str, runs=("table20", "split0"), whole=15) -> None:
    """``whole``: the rounds of whole items before the last (the tail is drawn from the last of them on)."""
    data = np.load(trace)
    left = min(np.nanmin(data[r][:, whole - 1, 0]) for r in runs) - 50
    right = max(np.nanmax(data[r]) for r in runs) + 20
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), sharex=True)
    for ax, run in zip(axes, runs):
        t = data[run]  # [CTA, item, (start, end)] in us from the first start, NaN where none
        for cta in range(t.shape[0]):
            for j in range(t.shape[1]):
                s, e = t[cta, j]
                if np.isnan(s):
                    continue
                ax.barh(cta, e - s, left=s, height=1.0, color="tab:orange" if j >= whole else "tab:blue",
                        edgecolor="none")
        span = np.nanmax(t)
        ax.axvline(span, color="black", lw=0.8)
        name = "the table (whole items)" if run.startswith("table") else "last round in pieces (split_tail)"
        ax.set_title(f"{name}: {span:.0f} us, items {whole + 1}+ in orange")
        ax.set_ylabel("CTA")
        ax.set_xlim(left, right)
    axes[-1].set_xlabel("us from the first item's start (one call, same warm state)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(*sys.argv[1:3])
