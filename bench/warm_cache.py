"""Compile the kernels a bench run will launch, many processes at once, so the timed run meets a warm Triton cache.

    PYTHONPATH=src python3 bench/warm_cache.py --jobs 12 \\
        "default|causal=1|fmha:auto;fmha:hopper[stale=1]" "head-dims|head_dim=96|fmha:auto"

Each argument is ``grid|where|providers``: a grid of ``fmha bench``, its ``--where`` filter (empty: every cell) and
the providers separated by ``;``; ``grid|where|providers|float8_e4m3fn``: the calls ``bench/fp8_speed.py --prefill``
makes, q, k and v in float8 with their factors (``fmha:auto``; ``fmha:hopper`` and ``fmha:hopper[field=value,...]``:
the Gluon kernel's float8 row of the cell, changed so).  Every (cell, provider) runs once, untimed and unchecked, in
a pool of ``--jobs`` processes (each compiles what its call needs into ``TRITON_CACHE_DIR``, which ``fmha bench``
then reads): on a cold cache a bench run otherwise compiles its Gluon kernels one after the other, 20-40 s each.
Prints one line a call: ``ok`` or ``FAIL`` with the error.
"""
from __future__ import annotations

import argparse
import multiprocessing
from concurrent.futures import ProcessPoolExecutor


def _cells(grid: str, where: str | None):
    from fmha.bench import grids
    return grids.where(grids.GRIDS[grid](), where)


def _float8(q, k, v, cell, name: str):
    """``name``'s float8 call of ``cell`` (as ``bench/fp8_speed.py --prefill`` makes it): q, k, v quantized."""
    import dataclasses

    import fmha
    from fmha import configs
    from fmha.bench import runner
    from fmha.bench.providers import config_changes
    (q8, qs), (k8, ks), (v8, vs) = (runner.quantized(t) for t in (q, k, v))
    kw = dict(causal=cell.causal, q_descale=qs, k_descale=ks, v_descale=vs)
    if name != "fmha:auto":
        variant, _, spec = name.partition("[")
        if variant != "fmha:hopper":
            raise ValueError(f"float8 warms fmha:auto and fmha:hopper[...], not {name}")
        cfg = configs.hopper_config(cell.head_dim, cell.causal, cell.seqlen_k, fp8=True)
        kw.update(variant="hopper", config=dataclasses.replace(cfg, **config_changes(spec[:-1]) if spec else {}))
    return lambda: fmha.attention(q8, k8, v8, **kw)


def _one(job: tuple) -> str:
    grid, where, name, index, dtype = job
    import torch
    from fmha.bench import providers, runner
    cell = _cells(grid, where)[index]
    runner._reference = lambda *args: None  # the inputs only: no reference to compute
    try:
        q, k, v, _, _ = runner.cell_inputs(cell, torch.bfloat16, "cuda")
        if dtype == "float8_e4m3fn":
            _float8(q, k, v, cell, name)()
        else:
            provider = providers.select(providers.providers("cuda"), [name])[0]
            with provider.scope():
                provider.make(q, k, v, cell)()
        torch.cuda.synchronize()
        return f"ok {grid} {cell} {name}"
    except Exception as e:  # a provider that refuses a cell is the bench's to report
        return f"FAIL {grid} {cell} {name}: {type(e).__name__}: {' '.join(str(e).split())[:200]}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("specs", nargs="+", help="grid|where|provider;provider...[|float8_e4m3fn]")
    p.add_argument("--jobs", type=int, default=8)
    args = p.parse_args()
    jobs = []
    for spec in args.specs:
        grid, where, names, *dtype = spec.split("|")
        dtype = dtype[0] if dtype else "bfloat16"
        n = len(_cells(grid, where or None))
        jobs += [(grid, where or None, name, i, dtype) for name in names.split(";") for i in range(n)]
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for line in pool.map(_one, jobs):
            print(line, flush=True)


if __name__ == "__main__":
    main()
