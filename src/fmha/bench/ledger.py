"""The iteration ledger: one CSV, a fixed schema, rows only ever appended.

Rows of one ``fmha bench`` or ``fmha sweep`` invocation share a ``run_id``; ratios
compare rows of the same run only.  ``pass`` says what was timed: ``fwd``, ``bwd`` or ``fwd+bwd``
(empty in rows from before the column: the forward).  Ceiling rows (``provider`` ``ceiling:matmul``
and ``ceiling:copy``) record what the GPU reached that run.
"""
from __future__ import annotations

import csv
import datetime as _dt
import os
import subprocess
from pathlib import Path

COLUMNS = [
    "timestamp", "run_id", "git_sha", "gpu", "torch", "triton", "provider", "config", "dtype",
    "batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "causal",
    "ms", "tflops", "tbps", "pct_peak", "ratio_best_peer", "error", "note", "features", "pass",
]
DEFAULT_LEDGER = Path("bench/ledger.csv")


def git_sha() -> str:
    """The commit measured: ``FMHA_GIT_SHA`` when set (a copied work tree can carry a stale
    .git), else git's HEAD, ``+dirty`` with uncommitted changes (to anything but the ledger)."""
    if os.environ.get("FMHA_GIT_SHA"):
        return os.environ["FMHA_GIT_SHA"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=10)
        sha = out.stdout.strip()
        if sha:
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ":(top)",
                                    ":(top,exclude)bench/ledger.csv"],  # appended rows change no code
                                   capture_output=True, text=True, timeout=10,
                                   cwd=Path(__file__).resolve().parent).stdout.strip()
            return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def environment(device: str) -> dict:
    """The columns that say where a row was measured; ``FMHA_RUN_TAG`` suffixes the run_id."""
    import torch
    import triton
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu (triton interpreter)"
    now = _dt.datetime.now(_dt.timezone.utc)
    run_id = now.strftime("%Y%m%dT%H%M%S")
    if os.environ.get("FMHA_RUN_TAG"):  # streams started in the same second (one per GPU) keep apart
        run_id += "-" + os.environ["FMHA_RUN_TAG"]
    return {"timestamp": now.isoformat(timespec="seconds"), "run_id": run_id,
            "git_sha": git_sha(), "gpu": gpu, "torch": torch.__version__, "triton": triton.__version__}


def append(path: str | Path | None, rows: list[dict]) -> None:
    """Append ``rows`` (missing columns left empty); the header is written once, and a ledger
    written before a column was added gets the longer header (its rows read the new column empty).
    ``path`` None: a run that records nothing (the CPU interpreter's)."""
    if path is None:
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        _upgrade_header(path)
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="raise")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({c: _fmt(r.get(c, "")) for c in COLUMNS})


def _upgrade_header(path: Path) -> None:
    with path.open(newline="") as f:
        header = next(csv.reader(f))
    if header == COLUMNS:
        return
    if header != COLUMNS[:len(header)]:
        raise ValueError(f"{path}: its columns {header} are not a prefix of the ledger's {COLUMNS}")
    with path.open(newline="") as f:
        text = f.read()
    end = text.index("\n")
    eol = "\r\n" if text[end - 1] == "\r" else "\n"
    path.write_text(",".join(COLUMNS) + eol + text[end + 1:], newline="")


def _fmt(x):
    if isinstance(x, float):
        return f"{x:.6g}"
    return x


def read(path: str | Path) -> list[dict]:
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))
