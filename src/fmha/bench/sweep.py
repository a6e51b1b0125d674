"""Walk a variant's config space; every attempt, failures included, goes to the ledger."""
from __future__ import annotations

import dataclasses
import itertools

import torch

from fmha.configs import KernelConfig

from . import ledger
from .grids import Cell, parse_fields
from .providers import modifiers
from .runner import ceilings, cell_columns, cell_inputs, check_error, progress, time_ms
from .timing import tflops

DEFAULT_SPACE = {
    "singlewave": {"block_m": [16, 32], "block_n": [16, 32], "num_warps": [1, 2], "num_stages": [1, 2]},
    "pipelined": {"block_m": [16, 32], "block_n": [16, 32], "num_warps": [1, 2], "num_stages": [1, 2]},
    "tiled": {"block_m": [64, 128], "block_n": [32, 64, 128], "num_warps": [4, 8], "num_stages": [2, 3, 4]},
    "hopper": {"block_m": [128, 192], "block_n": [64, 128], "num_warps": [4], "num_stages": [2, 3],
               "maxnreg": [0], "persistent": [-1]},
}
DEFAULT_CELLS = {
    "cuda": [Cell(b, 2048 // d, 2048 // d, s, s, d, c) for d in (64, 128) for c in (False, True)
             for b, s in ((16, 1024), (1, 16384))],
    "cpu": [Cell(1, 2, 2, 40, 40, 64, True)],
}


def parse_space(text: str | None, variant: str) -> dict:
    """``"block_m=64,128 num_warps=4,8"`` over the variant's default space (any
    :class:`KernelConfig` field may be named)."""
    space = {k: list(v) for k, v in DEFAULT_SPACE[variant].items()}
    space.update(parse_fields(text, {f.name for f in dataclasses.fields(KernelConfig)}, "config"))
    return space


def configs_of(space: dict) -> list[KernelConfig]:
    keys = list(space)
    return [KernelConfig(**dict(zip(keys, vals))) for vals in itertools.product(*(space[k] for k in keys))]


def sweep(variant: str, space: dict, cells: list[Cell], dtype: torch.dtype, device: str, ledger_path,
          show_progress: bool = True, graphs: bool = False) -> list[dict]:
    import fmha
    env = ledger.environment(device)
    ceil = [dict(env, **r) for r in ceilings(device)]
    peak = ceil[0]["tflops"]
    ledger.append(ledger_path, ceil)
    cfgs = configs_of(space)
    rows, n, i = [], len(cfgs) * len(cells), 0
    for cell in cells:
        q, k, v, ref, flops = cell_inputs(cell, dtype, device)
        kw = modifiers(cell, device)
        for cfg in cfgs:
            if show_progress:
                progress(i, n, f"{variant} {cfg} {cell}")
            i += 1
            row = dict(env, provider=f"fmha:{variant}", config=str(cfg), **cell_columns(cell, dtype))
            try:
                fn = lambda: fmha.attention(q, k, v, causal=cell.causal, variant=variant, config=cfg, **kw)  # noqa: E731
                err = ((fn().float() - ref).norm() / ref.norm()).item()
                check_error(err, cell)
                ms = time_ms(fn, device, graphs)
                row.update(ms=ms, tflops=tflops(flops, ms), pct_peak=100 * tflops(flops, ms) / peak,
                           error=err, note="sweep ok, cuda graph" if graphs else "sweep ok")
            except Exception as e:
                row.update(note=f"sweep failed: {type(e).__name__}: {' '.join(str(e).split())[:160]}")
            ledger.append(ledger_path, [row])
            rows.append(row)
            if device == "cuda":
                torch.cuda.empty_cache()
    if show_progress:
        progress(n, n, "done")
    return rows
