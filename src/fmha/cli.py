"""Command line: thin wrappers over the API, the targets, the campaign and the fuzzer."""
from __future__ import annotations

import argparse
import json
import math
import sys
import warnings
from pathlib import Path

import numpy as np
import torch

import fmha
from fmha import reference
from fmha.checks import HEAD_DIMS, HOPPER_HEAD_DIMS, MLA_ABSORBED
from fmha.device import interpreting


class UsageError(Exception):
    """A command line that cannot run as given: one line says what was wrong and what is accepted."""


def _demo_cpu(args) -> int:
    b, h, kvh, sq, sk, d = 1, 2, 1, 40, 56, 64
    if args.row is not None and not 0 <= args.row < sq:
        raise UsageError(f"--row {args.row}: the demo's query rows are 0..{sq - 1}")
    print(f"fmha demo: no CUDA GPU, so the seed's `singlewave` kernel runs in Triton's interpreter\n"
          f"problem: batch={b} heads={h} kv_heads={kvh} seqlen_q={sq} seqlen_k={sk} head_dim={d} "
          f"float16, causal (bottom-right)")
    g = torch.Generator().manual_seed(args.seed)
    q = torch.randn(b, h, sq, d, generator=g).half()
    k = torch.randn(b, kvh, sk, d, generator=g).half()
    v = torch.randn(b, kvh, sk, d, generator=g).half()
    with warnings.catch_warnings():  # the interpreter's numpy warns on 1/l for empty rows
        warnings.simplefilter("ignore", RuntimeWarning)
        o = fmha.attention(q, k, v, causal=True, causal_align="bottom_right", variant="singlewave")
    ref = reference.dense_attention(q, k, v, causal=True, causal_align="bottom_right")
    err = np.abs(o.double().numpy() - ref)
    rel = np.linalg.norm(o.double().numpy() - ref) / np.linalg.norm(ref)
    print(f"max |o - o_ref| = {err.max():.2e}   ||o - o_ref|| / ||o_ref|| = {rel:.2e}   "
          f"(float64 reference; float16 rounding is ~5e-4)")

    def trace_of(r):
        return reference.online_attention(q, k, v, causal=True, causal_align="bottom_right",
                                          block_n=16, trace_row=(0, 0, r))[1]

    if args.row is None:  # the row whose running max moves most often: the instructive one
        row = max(range(sq), key=lambda r: (sum(0 < a < 1 for a in trace_of(r).alpha), r))
    else:
        row = args.row
    trace = trace_of(row)
    block0 = row // 16 * 16
    stop = min(sk, block0 + 16 + sk - sq)  # the kernel's causal_stop for this row's 16-row block
    n_run = math.ceil(stop / 16)
    print(f"\nthe recurrence for query row {row} (it sees keys 0..{min(sk, row + sk - sq + 1) - 1}), "
          f"16-key tiles, base-2 domain:")
    print(f"{'tile':>4}  {'keys':>9}  {'m (running max)':>16}  {'alpha = 2^(m_old-m)':>20}  {'l':>12}")
    for t, m, a, l in list(zip(trace.tile, trace.m, trace.alpha, trace.l))[:n_run]:
        print(f"{t:>4}  {f'{16 * t}-{min(16 * t + 15, sk - 1)}':>9}  {m:>16.5f}  {a:>20.6f}  {l:>12.6f}")
    tiles = math.ceil(sk / 16)
    skipped = (f"the causal early exit skipped the other {tiles - n_run}" if n_run < tiles else
               "its block's last row sees the last key, so the causal early exit skips none here")
    print(f"o[{row}] = acc / l.  The program for rows {block0}-{block0 + 15} ran {n_run} of {tiles} key tiles: "
          f"{skipped}.")
    return 0 if rel < 1e-2 else 1


def _demo_gpu(args) -> int:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from fmha.bench.flops import attention_flops
    from fmha.bench.timing import median_ms, tflops
    b, h, s, d = 4, 16, 4096, 128
    dev = torch.cuda.get_device_name()
    print(f"fmha demo on {dev}: batch={b} heads={h} seqlen={s} head_dim={d} bfloat16")
    print(f"{'provider':>22} {'causal':>6} {'ms':>8} {'TFLOP/s':>8} {'rel err':>8}")
    for causal in (False, True):
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(),
                                                               is_causal=causal)
        flops = attention_flops(b, h, s, s, d, causal)
        runs = [(f"fmha:{n}", lambda n=n: fmha.attention(q, k, v, causal=causal, variant=n))
                for n in ["auto", *fmha.variants()]]

        def sdpa():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        runs.append(("torch sdpa", sdpa))
        for name, fn in runs:
            o = fn()
            rel = ((o.float() - ref).norm() / ref.norm()).item()
            ms = median_ms(fn)
            print(f"{name:>22} {str(causal):>6} {ms:8.3f} {tflops(flops, ms):8.1f} {rel:8.1e}")
    return 0


def cmd_demo(args) -> int:
    if interpreting():
        return _demo_cpu(args)
    return _demo_gpu(args)


DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def _bench_device(name: str) -> str:
    if name == "cpu" and not interpreting():
        raise UsageError("--device cpu runs Triton's interpreter: set TRITON_INTERPRET=1 (or run where "
                         "no CUDA GPU is visible, where `python -m fmha` sets it)")
    if name == "cuda" and interpreting():
        raise UsageError("--device cuda needs a CUDA GPU with TRITON_INTERPRET unset")
    return name


# the interpreter runs a 16k-token cell for hours: on the CPU, cells up to this many scores
CPU_SCORES = 1 << 16


def _cells(grid: str, where: str | None, device: str, cells=None):
    """The grid's cells that ``where`` selects, refusing a selection that is empty or, on the CPU,
    too big for the interpreter."""
    from fmha.bench import grids
    cells = grids.GRIDS[grid]() if cells is None else cells
    try:
        chosen = grids.where(cells, where)
    except ValueError as e:
        raise UsageError(f"--where {where!r}: {e}") from None
    if not chosen:
        raise UsageError(f"--where {where!r} selects none of the {len(cells)} cells of grid {grid}; "
                         f"{grids.values(cells)}")
    big = [c for c in chosen if c.batch * c.heads * c.seqlen_q * c.seqlen_k > CPU_SCORES]
    if device == "cpu" and big:
        raise UsageError(f"grid {grid} holds cells too big for the CPU interpreter (e.g. {big[0]}); on the CPU "
                         f"run --grid quick, or select small cells with --where")
    return chosen


def _ledger(path: str | None, device: str):
    """Where rows go: the ``--ledger`` given, else the tracked ledger for GPU runs and nowhere for
    CPU runs (the interpreter's times mean nothing)."""
    from fmha.bench import ledger
    if path is not None:
        return path
    return ledger.DEFAULT_LEDGER if device == "cuda" else None


def _providers(device: str, names):
    from fmha.bench import providers
    try:
        return providers.select(providers.providers(device), names)
    except ValueError as e:
        raise UsageError(str(e)) from None


def cmd_bench(args) -> int:
    from fmha.bench import report, runner
    device = _bench_device(args.device or ("cpu" if interpreting() else "cuda"))
    grid = args.grid or ("quick" if device == "cpu" else "default")
    provs = _providers(device, args.providers)
    cells = _cells(grid, args.where, device)
    dtypes = [DTYPES[d] for d in args.dtype]
    ledger_path = _ledger(args.ledger, device)
    if args.pass_ != "fwd" and any(c.softcap for c in cells):
        raise UsageError(f"--pass {args.pass_} times cells without softcap (its reference is SDPA's, which has none); "
                         f"select them with --where softcap=0")
    print(f"fmha bench: grid={grid} ({len(cells)} cells x {len(dtypes)} dtypes), pass={args.pass_}, device={device}, "
          f"providers={[p.name for p in provs]}, ledger={ledger_path or 'none (CPU times mean nothing)'}",
          flush=True)
    ceil, rows = runner.run_grid(cells, dtypes, provs, device, ledger_path, graphs=args.cuda_graphs,
                                 pass_=args.pass_)
    print(f"ceilings this run: matmul {ceil[0]['tflops']:.0f} TFLOP/s ({ceil[0]['config']}), "
          f"copy {ceil[1]['tbps']:.2f} TB/s")
    print(report.grid_table(rows, timing_means_nothing=device == "cpu"))
    return 0


def cmd_sweep(args) -> int:
    from fmha.bench import sweep
    device = _bench_device(args.device or ("cpu" if interpreting() else "cuda"))
    try:
        space = sweep.parse_space(args.space, args.variant)
    except ValueError as e:
        raise UsageError(f"--space {args.space!r}: {e}") from None
    cells = _cells(args.grid or "sweep", args.where, device,
                   None if args.grid else sweep.DEFAULT_CELLS[device])
    ledger_path = _ledger(args.ledger, device)
    rows = sweep.sweep(args.variant, space, cells, DTYPES[args.dtype], device, ledger_path,
                       graphs=args.cuda_graphs)
    best = {}
    for r in rows:
        key = tuple(r[c] for c in ("batch", "heads", "kv_heads", "seqlen_q", "seqlen_k", "head_dim", "causal"))
        if "tflops" in r and (key not in best or r["tflops"] > best[key]["tflops"]):
            best[key] = r
    failed = sum(1 for r in rows if "failed" in r["note"])
    print(f"{len(rows)} attempts, {failed} failed" + (f" (reasons in {ledger_path})" if ledger_path else ""))
    for (b, h, kv, sq, sk, d, c), r in sorted(best.items()):
        print(f"best B={b} H/KV={h}/{kv} Sq={sq} Sk={sk} D={d} causal={c}: {r['config']} {r['tflops']:.1f} "
              f"TFLOP/s err {r['error']:.1e}")
    return 0


def cmd_plot(args) -> int:
    from fmha.bench import plot
    if not Path(args.ledger).is_file():
        raise UsageError(f"--ledger {args.ledger}: no such file (the tracked ledger is bench/ledger.csv)")
    try:
        paths = plot.plot(args.ledger, args.out, args.run)
    except ValueError as e:
        raise UsageError(str(e)) from None
    for path in paths:
        print(path)
    return 0


def cmd_fuzz(args) -> int:
    from fmha import fuzz
    device = _bench_device(args.device or ("cpu" if interpreting() else "cuda"))
    if args.minutes is None and args.problems is None:
        raise UsageError("say how long: --minutes M or --problems N")
    seconds = None if args.minutes is None else 60 * args.minutes
    counts = fuzz.fuzz(seconds, args.problems, args.seed, device)
    print("fuzz: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 1 if counts.get("failed") else 0


def cmd_model_check(args) -> int:
    from fmha.integrations import model_check
    device = _bench_device(args.device or ("cpu" if interpreting() else "cuda"))
    rows = model_check.run(args.models or model_check.causal_lms(), device, sys.stdout, args.compile)
    counts = {v: sum(r.verdict == v for r in rows) for v in ("ok", "off", "error", "skipped")}
    print("model-check: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    return 1 if counts["off"] or counts["error"] else 0


def _format_report(r) -> str:
    chip_regs = ", ".join(f"{k}={v}" for k, v in r.registers.items())
    occ = ", ".join(f"{k}={v}" for k, v in r.occupancy.items())
    lines = [f"{r.variant} -> {r.target}  (head_dim={r.head_dim}, {r.dtype}, "
             f"{'causal' if r.causal else 'non-causal'}, config {r.config})",
             f"  wave size            {r.wave_size}",
             "  matrix instructions  " + (", ".join(f"{k} x{v}" for k, v in r.matrix_instructions.items()) or "none"),
             f"  registers            {chip_regs}",
             f"  shared memory / LDS  {r.shared_bytes} bytes",
             f"  scratch              {r.scratch_bytes} bytes, spilled registers: "
             f"{'unknown (no ptxas)' if r.spilled_registers is None else r.spilled_registers}",
             f"  occupancy estimate   {occ}",
             "  key loop memory      " + (", ".join(f"{k} x{v}" for k, v in r.loop_memory.items()) or "none"),
             "  key loop reductions  " + (", ".join(f"{k} x{v}" for k, v in r.loop_reductions.items()) or "none")]
    if r.loop_tile:
        t = r.loop_tile
        lines.append(f"  per key tile         {t['rows']} rows x {t['keys']} keys: {t['instructions']} instructions "
                     f"(WMMA {t['wmma']}, other VALU {t['valu']}, SALU {t['salu']}, LDS {t['lds']}, global "
                     f"{t['global']}, scratch {t['scratch']}); {t['flops']} FLOP on {t['global_bytes']} bytes from "
                     f"global memory: {t['flop_per_byte']} FLOP/byte")
    if r.sass_matrix_instructions is not None:
        lines.append("  SASS matrix          " + ", ".join(f"{k} x{v}" for k, v in r.sass_matrix_instructions.items()))
    if r.files:
        lines.append(f"  files                {len(r.files)} under {Path(r.files[0]).parent}")
    return "\n".join(lines)


def cmd_train_demo(args) -> int:
    from fmha import train_demo
    device = args.device or ("cuda" if torch.cuda.is_available() and not interpreting() else "cpu")
    if device == "cpu" and not interpreting():
        raise UsageError("the CPU runs fmha's kernels only through Triton's interpreter: set TRITON_INTERPRET=1")
    steps = args.steps or (60 if device == "cpu" else 300)
    size = args.size or ("tiny" if device == "cpu" else "small")
    out = train_demo.run(steps, size, device, args.seed, args.plot)
    every = max(1, steps // 10)
    print(f"{'step':>5} {'sdpa':>8} {'fmha':>8}")
    for i in list(range(0, steps, every)) + [steps - 1]:
        print(f"{i + 1:>5} {out['sdpa'][i]:8.4f} {out['fmha'][i]:8.4f}")
    print(f"max |loss difference| over {steps} steps: {out['max_diff']:.4g}; first loss {out['sdpa'][0]:.3f}, "
          f"last {out['sdpa'][-1]:.3f} (sdpa) / {out['fmha'][-1]:.3f} (fmha); "
          f"{out['seconds']['sdpa']:.0f} s / {out['seconds']['fmha']:.0f} s"
          + (f"; plot: {args.plot}" if args.plot else ""))
    return 0


def build_row(r, env: dict, note: str = "") -> dict:
    """A build as a ledger row: ``provider`` ``build:<target>``, the config, registers, spills and the key
    loop's per-tile mix in ``note`` (no time: ``ms`` stays empty)."""
    regs = " ".join(f"{k}={v}" for k, v in r.registers.items())
    tile = " ".join(f"{k}={v}" for k, v in r.loop_tile.items() if isinstance(v, int))
    shape = ("block_m", "block_n", "num_warps", "num_stages")
    fields = " ".join(f"{k}={v}" for k, v in r.config.items() if k in shape or v not in (0, -1))
    return {**env, "gpu": f"built for {r.target}", "provider": f"build:{r.target}",
            "config": f"{r.variant} {fields}", "dtype": r.dtype,
            "head_dim": r.head_dim, "causal": int(r.causal),
            "note": "; ".join(x for x in (note, f"{regs} spilled={r.spilled_registers} scratch={r.scratch_bytes}B",
                                          f"tile: {tile}" if tile else "") if x),
            "features": "part=build"}


def cmd_compile(args) -> int:
    from fmha import targets
    names = list(targets.TARGETS) if args.target == "all" else [args.target]
    try:
        for name in names:
            targets._check_choice("target", name, list(targets.TARGETS))
        if args.deterministic and not args.backward:
            raise ValueError("--deterministic names a backward build: give --backward too")
        if args.backward:
            from fmha.kernels.hopper.backward import HEAD_DIMS as GLUON_BACKWARD_DIMS
            gluon = args.variant == "hopper" and args.target == "sm_90" and args.head_dim in GLUON_BACKWARD_DIMS
            if args.variant and not gluon or args.dtype == "float8_e4m3fn" or args.head_dim > 256:
                raise ValueError("--backward builds the backward's Triton kernels (no --variant; head_dim up to 256) "
                                 "or, with --variant hopper --target sm_90, the Gluon kernel (head_dim "
                                 "a multiple of 8 from 32 to 256); "
                                 "float16 or bfloat16")
            if gluon and args.head_dim_v and (args.head_dim_v > args.head_dim
                                              or args.head_dim_v not in GLUON_BACKWARD_DIMS):
                raise ValueError(f"head_dim_v {args.head_dim_v}: the Gluon backward takes V's head dim a multiple of 8 "
                                 f"from 32, no wider than q/k's ({args.head_dim})")
        elif args.variant is None:
            raise ValueError("--variant is required (or --backward)")
        else:
            targets._check_choice("variant", args.variant, targets.variants())
            if args.variant == "hopper":
                targets._check_choice("head_dim", args.head_dim, HOPPER_HEAD_DIMS)
    except ValueError as e:
        raise UsageError(str(e)) from None
    if args.backward and args.variant:
        return _report_builds(args, [targets.build_hopper_backward(args.head_dim, args.dtype, args.causal,
                                                                   args.deterministic, head_dim_v=args.head_dim_v)])
    if args.backward:
        builds = [b for name in names for b in targets.build_backward_kernels(
            name, args.head_dim, args.dtype, args.causal, args.deterministic, head_dim_v=args.head_dim_v)]
        return _report_builds(args, builds)
    if args.target == "all":  # every target this variant builds for
        skipped = [n for n in names if targets.unbuildable(args.variant, n, args.head_dim, args.dtype)]
        names = [n for n in names if n not in skipped]
        if skipped and names:
            print(f"{args.variant} does not build for {', '.join(skipped)}: skipped", file=sys.stderr)
    reasons = [targets.unbuildable(args.variant, n, args.head_dim, args.dtype) for n in names] or \
        [targets.unbuildable(args.variant, "sm_90", args.head_dim, args.dtype)]
    if any(reasons):
        raise UsageError(next(r for r in reasons if r))
    return _report_builds(args, [targets.build(args.variant, name, args.head_dim, args.dtype, args.causal,
                                               head_dim_v=args.head_dim_v)
                                 for name in names])


def _report_builds(args, builds) -> int:
    """Report ``builds`` as ``fmha compile`` was asked: files under ``--out``, ledger rows, JSON or text."""
    from fmha import targets
    reports = []
    for b in builds:
        r = targets.report(b)
        if args.out:
            targets.write(b, r, Path(args.out))
        reports.append(r)
    if args.ledger:
        from fmha.bench import ledger
        ledger.append(args.ledger, [build_row(r, ledger.environment("cpu"), args.note) for r in reports])
    if args.json:
        print(json.dumps([r.as_dict() for r in reports] if len(reports) > 1 else reports[0].as_dict(), indent=2))
    else:
        print("\n\n".join(_format_report(r) for r in reports))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fmha", description=fmha.__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run the seed kernel, check it, trace the recurrence")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--row", type=int, default=None, help="query row to trace (CPU demo)")
    d.set_defaults(fn=cmd_demo)

    c = sub.add_parser("compile", help="build a variant ahead of time for a chip (no GPU needed) and report")
    c.add_argument("--target", required=True, help="gfx1151, gfx1100, gfx942, sm_80, sm_90 or all")
    c.add_argument("--variant", default=None, help="the forward variant to build")
    c.add_argument("--backward", action="store_true",
                   help="build the portable backward's kernels (dK/dV, dQ) with the tiles this target takes; with "
                        "--variant hopper (sm_90), the Gluon backward")
    c.add_argument("--deterministic", action="store_true",
                   help="with --backward: the build that deterministic=True runs (dQ from its own kernel, or the Gluon "
                        "kernel's adds in one fixed order)")
    c.add_argument("--head-dim", type=int, default=128, choices=[*HEAD_DIMS, MLA_ABSORBED[0]],
                   help=f"{MLA_ABSORBED[0]}: MLA's absorbed decode (V {MLA_ABSORBED[1]}), tiled only")
    c.add_argument("--head-dim-v", type=int, default=0, choices=[0, *HEAD_DIMS],
                   help="V's head dim where it differs from q/k's (DeepSeek's 192/128; the Gluon kernels "
                        "take it no larger), forward or --backward")
    c.add_argument("--dtype", choices=["float16", "bfloat16", "float8_e4m3fn"], default="float16")
    c.add_argument("--causal", action="store_true")
    c.add_argument("--out", default=None, help="write binary, assembly and report.json here")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.add_argument("--ledger", default=None, help="append each build as a row (registers, spills, the loop's mix)")
    c.add_argument("--note", default="", help="what this build tries (a lever), in the ledger row")
    c.set_defaults(fn=cmd_compile)

    from fmha.bench import grids, ledger
    b = sub.add_parser("bench", help="time a grid against the peers, append to the ledger, print a table")
    b.add_argument("--grid", choices=list(grids.GRIDS), default=None,
                   help="default on a GPU, quick on the CPU")
    b.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["float16", "bfloat16"])
    b.add_argument("--providers", nargs="+", default=None,
                   help="names as in the table (default: all); also 'fmha:hopper[pingpong=1,...]' or "
                        "'fmha:tiled[tma=1]': each cell's table config for that variant with those fields replaced")
    b.add_argument("--ledger", default=None,
                   help=f"append the rows here (default: {ledger.DEFAULT_LEDGER} on a GPU, nowhere on the CPU)")
    b.add_argument("--device", choices=["cuda", "cpu"], default=None)
    b.add_argument("--cuda-graphs", action="store_true",
                   help="time CUDA-graph replays (GPU time without the host's launch cost; every provider alike)")
    b.add_argument("--where", default=None, help='only the cells with these values, e.g. "head_dim=64 causal=1"')
    b.add_argument("--pass", dest="pass_", choices=["fwd", "bwd", "fwd+bwd"], default="fwd",
                   help="what is timed: the forward, the backward (gradients of q, k, v), or both; TFLOP/s count "
                        "1, 2.5 or 3.5 times the forward's FLOPs")
    b.set_defaults(fn=cmd_bench)

    s = sub.add_parser("sweep", help="walk a variant's config space; every attempt goes to the ledger")
    s.add_argument("--variant", required=True, choices=["singlewave", "pipelined", "tiled", "hopper"])
    s.add_argument("--space", default=None, help='e.g. "block_m=64,128 num_warps=4,8 num_stages=2,3"')
    s.add_argument("--dtype", choices=list(DTYPES), default="bfloat16")
    s.add_argument("--ledger", default=None,
                   help=f"append the rows here (default: {ledger.DEFAULT_LEDGER} on a GPU, nowhere on the CPU)")
    s.add_argument("--device", choices=["cuda", "cpu"], default=None)
    s.add_argument("--grid", choices=list(grids.GRIDS), default=None,
                   help="the cells to sweep (default: 1k and 16k tokens, D 64/128, causal off/on)")
    s.add_argument("--cuda-graphs", action="store_true", help="time CUDA-graph replays")
    s.add_argument("--where", default=None, help='only the cells with these values, e.g. "seqlen_q=1 causal=1"')
    s.set_defaults(fn=cmd_sweep)

    f = sub.add_parser("fuzz", help="random problems with inputs chosen to hurt, every path against float64")
    f.add_argument("--minutes", type=float, default=None)
    f.add_argument("--problems", type=int, default=None)
    f.add_argument("--seed", type=int, default=0)
    f.add_argument("--device", choices=["cuda", "cpu"], default=None)
    f.set_defaults(fn=cmd_fuzz)

    m = sub.add_parser("model-check", help="transformers models with fmha, SDPA and eager from one config and "
                       "weights: fmha's logits against eager's (prefill, padded, cached decoding)")
    m.add_argument("--models", nargs="+", default=None, help="model types (default: every causal LM transformers has)")
    m.add_argument("--device", choices=["cuda", "cpu"], default=None)
    m.add_argument("--compile", default=None, metavar="BACKEND",
                   help="SDPA's and fmha's models under torch.compile with this backend (eager: Dynamo alone)")
    m.set_defaults(fn=cmd_model_check)

    t = sub.add_parser("train-demo", help="train a small LM with fmha and with SDPA from one seed; compare the losses")
    t.add_argument("--steps", type=int, default=None, help="default: 60 on the CPU, 300 on a GPU")
    t.add_argument("--size", choices=["tiny", "small", "real"], default=None,
                   help="default: tiny on the CPU, small on a GPU")
    t.add_argument("--device", choices=["cuda", "cpu"], default=None)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--plot", default=None, help="write the two loss curves to this PNG")
    t.set_defaults(fn=cmd_train_demo)

    pl = sub.add_parser("plot", help="PNG plots of a ledger run")
    pl.add_argument("--ledger", default=str(ledger.DEFAULT_LEDGER))
    pl.add_argument("--out", default="docs/plots")
    pl.add_argument("--run", default=None, help="run_id (default: the latest benchmark run)")
    pl.set_defaults(fn=cmd_plot)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except UsageError as e:
        print(f"python -m fmha {args.cmd}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
