"""Float8 against bfloat16, same call otherwise: time (CUDA-graph replays) and the error against the
dequantized inputs.

`PYTHONPATH=src python3 bench/fp8_speed.py`: float8 K/V under a bf16 q (the tiled kernel, dequantized on
load), GQA 32/8, D=128; decoding (1 and 4 query rows against 8k-32k keys) and one causal 4k prefill.  K and V
are quantized per (batch, KV head) to e4m3 with FlashAttention-3's descale factors; the bf16 call gets the
original K/V.  Prints a table (microseconds, the speed ratio, and the max error of the float8 call against
`tiled` on the dequantized K/V).

`PYTHONPATH=src python3 bench/fp8_speed.py --prefill [--head-dims 128] [--seqlens 4096 16384] [--changes pingpong=1 ...]
[--ledger bench/ledger.csv]`: float8 q, k and v (``auto``'s pick, and the
Gluon kernel's float8 wgmma on sm_90 with its table row and each change) against bf16 over the default grid
(B*S = 16k, H*D = 2048, 512-16k tokens, D 64 and 128, causal or not), TFLOP/s of each; and, at 1k tokens,
``auto``'s max error against the float64 attention of the dequantized inputs (bf16's on those inputs rounded
to bf16).  Ledger rows: ``provider`` ``fmha:auto`` (``fmha:hopper[...]`` for the Gluon kernel's), ``dtype`` of
q, ``features`` ``part=fp8-prefill``, ``ratio_best_peer`` bf16's time over this row's.
"""
import argparse
import dataclasses
import sys
from pathlib import Path

import torch
from triton.testing import do_bench_cudagraph

sys.path.append(str(Path(__file__).resolve().parents[1] / "src"))  # after PYTHONPATH: another tree can be timed

import fmha  # noqa: E402
from fmha.bench import flops as bench_flops, grids, ledger  # noqa: E402
from fmha.bench.runner import quantized  # noqa: E402

CASES = [(1, 8192, 1), (8, 8192, 1), (8, 32768, 1), (4, 32768, 4), (1, 4096, 4096)]  # (batch, keys, query rows)


def decode():
    torch.manual_seed(0)
    print("case | bf16 us | float8 us | float8 speed | max error against the dequantized inputs")
    for batch, keys, rows in CASES:
        q = torch.randn(batch, 32, rows, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, 8, keys, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        (k8, ks), (v8, vs) = quantized(k), quantized(v)
        causal = rows > 16
        bf16 = lambda: fmha.attention(q, k, v, causal=causal)  # noqa: E731
        fp8 = lambda: fmha.attention(q, k8, v8, causal=causal, k_descale=ks, v_descale=vs)  # noqa: E731
        dequant = [(t.float() * s[:, :, None, None]).to(torch.bfloat16) for t, s in ((k8, ks), (v8, vs))]
        err = (fp8().float() - fmha.attention(q, *dequant, causal=causal, variant="tiled").float()).abs().max()
        t16, t8 = (do_bench_cudagraph(f, rep=200) * 1e3 for f in (bf16, fp8))
        print(f"B{batch} rows {rows} keys {keys} | {t16:.1f} | {t8:.1f} | {t16 / t8:.2f}x | {err.item():.2e}")


def prefill(ledger_path, changes=(), head_dims=(64, 128), seqlens=None):
    """The default grid in float8 (q, k, v, each with its per-(batch, head) factors) beside bf16: ``auto``'s float8
    call, the Gluon kernel's with its table row (``variant="hopper"``), and that row changed by each of ``changes``
    (``field=value,...``); ``seqlens``: only those cells.  Each cell's rows go to the ledger as it ends, so a run
    cut short keeps what it measured."""
    from fmha import configs
    from fmha.bench.providers import config_changes
    env = ledger.environment("cuda")
    swept_specs = ("", *changes)  # "": the table's row as it is
    print("cell | bf16 TFLOP/s | float8 TFLOP/s | float8 speed | what ran (float8) | max error bf16 / float8"
          + "".join(f" | {c or 'hopper'}" for c in swept_specs))
    for cell in grids.GRIDS["default"]():
        b, h, s, d, causal = cell.batch, cell.heads, cell.seqlen_q, cell.head_dim, cell.causal
        if d not in head_dims or (seqlens and s not in seqlens):
            continue
        torch.manual_seed(s + d)
        rows = []
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        (q8, qs), (k8, ks), (v8, vs) = quantized(q), quantized(k), quantized(v)
        bf16 = lambda: fmha.attention(q, k, v, causal=causal)  # noqa: E731
        fp8 = lambda: fmha.attention(q8, k8, v8, causal=causal, q_descale=qs, k_descale=ks, v_descale=vs)  # noqa: E731
        fl = bench_flops.attention_flops(b, h, s, s, d, causal)
        ms = {name: min(do_bench_cudagraph(f, rep=100) for _ in range(2)) for name, f in (("bf16", bf16), ("fp8", fp8))}
        ran = fmha.api.describe(q8, k8, v8, causal=causal).split(" ")[0]
        errs = ""
        if s == 1024:  # against float64 attention of the dequantized inputs (the bf16 call gets them rounded)
            full = [(t.double() * sc.double()[:, :, None, None]) for t, sc in ((q8, qs), (k8, ks), (v8, vs))]
            ref = torch.nn.functional.scaled_dot_product_attention(*full, is_causal=causal)
            o16 = fmha.attention(*(t.to(torch.bfloat16) for t in full), causal=causal)
            errs = f"{(o16.double() - ref).abs().max().item():.2e} / {(fp8().double() - ref).abs().max().item():.2e}"
        tf = {name: fl / (t * 1e-3) / 1e12 for name, t in ms.items()}
        swept = []
        gluon = any(row[0] == d for row in configs.HOPPER_FP8)  # the Gluon kernel's float8 rows (D=128 here)
        for spec in swept_specs if gluon else ():
            changed = config_changes(spec) if spec else {}
            cfg = dataclasses.replace(configs.hopper_config(d, causal, s, fp8=True), **changed)
            t = min(do_bench_cudagraph(lambda: fmha.attention(q8, k8, v8, causal=causal, q_descale=qs, k_descale=ks,
                                                              v_descale=vs, variant="hopper", config=cfg), rep=100)
                    for _ in range(2))
            swept.append(f"{fl / (t * 1e-3) / 1e12:.0f}")
            name = f"fmha:hopper[{spec}]" if spec else "fmha:hopper"
            rows.append(dict(env, provider=name, config=str(cfg), dtype="float8_e4m3fn", batch=b,
                             heads=h, kv_heads=h, seqlen_q=s, seqlen_k=s, head_dim=d, causal=int(causal), ms=t,
                             tflops=fl / (t * 1e-3) / 1e12, ratio_best_peer=ms["bf16"] / t,
                             note="ok, cuda graph", features="part=fp8-prefill"))
        print(f"B{b} H{h} S{s} D{d} {'causal' if causal else 'full'} | {tf['bf16']:.0f} | {tf['fp8']:.0f} | "
              f"{ms['bf16'] / ms['fp8']:.2f}x | {ran} | {errs}"
              + "".join(f" | {x}" for x in swept or ["-"] * len(swept_specs)), flush=True)
        for name, dtype in (("bf16", "bfloat16"), ("fp8", "float8_e4m3fn")):
            rows.append(dict(env, provider="fmha:auto", config="cuda graph", dtype=dtype, batch=b, heads=h,
                             kv_heads=h, seqlen_q=s, seqlen_k=s, head_dim=d, causal=int(causal), ms=ms[name],
                             tflops=tf[name], ratio_best_peer=ms["bf16"] / ms[name],
                             note=f"ok, ran {ran}" + (f"; max error against float64 bf16/fp8 {errs}" if errs else ""),
                             features="part=fp8-prefill"))
        ledger.append(ledger_path, rows)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prefill", action="store_true", help="float8 q, k, v over the default grid")
    p.add_argument("--changes", nargs="*", default=[], help="--prefill: float8 configs beside")
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--seqlens", nargs="+", type=int, default=None, help="--prefill: only these cells' lengths")
    p.add_argument("--ledger", default=None)
    args = p.parse_args()
    if args.prefill:
        prefill(args.ledger, args.changes, args.head_dims, args.seqlens)
    else:
        decode()
