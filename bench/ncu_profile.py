"""One call of each kernel under Nsight Compute: fmha against cuDNN at the cells still short of the goals.

`ncu --profile-from-start off ... python3 bench/ncu_profile.py [CELL...]`: the script warms each call up
(so Triton compiles outside the profiled range), then opens the profiler (`cudaProfilerStart`) for one call
of each provider and closes it.  Cells (bf16): `d128nc16k` (B=1, H=16, S=16384, D=128, non-causal: the
670 TFLOP/s goal) and `decode8k` (B=4, 32 query heads on 8 KV heads, 1 query row, 8192 keys, D=128);
`fp8nc16k`: `d128nc16k` with q, k and v quantized to float8 per (batch, head), whose float8 call is profiled
beside the bf16 one (the float8 call's V^T pass too).
`--hopper field=value,...` (each one a run more) also profiles the ``hopper`` kernel on the cell's table
config with those fields changed, e.g. `--hopper split_tail=1` (its merge kernel is profiled with it).
Backward cells (the default grid's shapes, bf16, bhsd): `bwd128c512` (B=32, H=16, S=512, D=128, causal),
`bwd128nc16k` (B=1, H=16, S=16384, D=128) and `bwd64nc16k` (B=1, H=32, S=16384, D=64): the gradients of fmha's
call and of cuDNN's, each forward run once before the profiled range, so the range holds the backward's kernels
alone (fmha's: dQ's zeroing, ``delta``, the main kernel, dQ's cast).
Any forward cell of ``fmha bench``'s grids, beside any of its providers (FlashAttention-4's when installed):
`--grid head-dims --where "head_dim=96 causal=1 seqlen_q=16384" --providers fmha:auto flash_attn.cute`.
"""
import argparse
import dataclasses

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import fmha
from fmha import backward, configs
from fmha.bench import grids, providers
from fmha.bench.providers import config_changes
from fmha.bench.runner import cell_inputs, quantized


BACKWARD = {"bwd128c512": (32, 16, 512, 128, True), "bwd128nc16k": (1, 16, 16384, 128, False),
            "bwd64nc16k": (1, 32, 16384, 64, False)}  # name -> (batch, heads, seqlen, head_dim, causal)


def cell(name):
    def rand(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)
    if name in BACKWARD:
        b, h, s, d, _ = BACKWARD[name]
        return rand(b, h, s, d), rand(b, h, s, d), rand(b, h, s, d)
    if name in ("d128nc16k", "fp8nc16k"):
        return rand(1, 16, 16384, 128), rand(1, 16, 16384, 128), rand(1, 16, 16384, 128)
    if name == "decode8k":
        return rand(4, 32, 1, 128), rand(4, 8, 8192, 128), rand(4, 8, 8192, 128)
    raise SystemExit(f"unknown cell {name!r}")


def cudnn(q, k, v, causal=False):
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=q.shape[1] != k.shape[1])


def backward_of(attend, q, k, v):
    """A call of ``attend``'s backward alone: its forward run once here, each call the gradients of q, k and v."""
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
    o = attend(*leaves)
    do = torch.randn_like(o)
    return lambda: torch.autograd.grad(o, leaves, do, retain_graph=True)


def profile(fns) -> None:
    """One call of each of ``fns`` inside the profiled range, each warmed up (compiled) before it."""
    for fn in fns:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        fn()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()


def in_scope(p, fn):
    def run():
        with p.scope():
            return fn()
    return run


def changed(q, k, v, spec: str):
    """fmha's hopper kernel on the cell's table config with the fields of ``spec`` changed."""
    cfg = dataclasses.replace(configs.hopper_config(q.shape[-1], False, k.shape[2]), **config_changes(spec))
    return lambda: fmha.attention(q, k, v, variant="hopper", config=cfg)


ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("cells", nargs="*", default=["d128nc16k", "decode8k"])
ap.add_argument("--hopper", nargs="*", default=[], help="table-config changes to profile too: field=value,...")
ap.add_argument("--grid", choices=sorted(grids.GRIDS), help="profile this grid's cells (bf16) instead of named ones")
ap.add_argument("--where", help='only the grid\'s cells with these values, e.g. "head_dim=96 causal=1"')
ap.add_argument("--providers", nargs="+", default=["fmha:auto", "sdpa:cudnn"],
                help="with --grid: as fmha bench names them")
args = ap.parse_args()
if args.grid:
    provs = providers.select(providers.providers("cuda"), args.providers)
    for c in grids.where(grids.GRIDS[args.grid](), args.where):
        q, k, v, _, _ = cell_inputs(c, torch.bfloat16, "cuda")
        print(f"{c}: fmha runs {fmha.api.describe(q, k, v, causal=c.causal)}; then {args.providers}", flush=True)
        profile([in_scope(p, p.make(q, k, v, c)) for p in provs])
for name in [] if args.grid else args.cells:
    q, k, v = cell(name)
    if name in BACKWARD:
        causal = BACKWARD[name][4]
        print(f"{name}: fmha's backward runs {backward.describe(q, k, v, causal=causal)}", flush=True)
        fns = [backward_of(lambda a, b, c: fmha.attention(a, b, c, causal=causal), q, k, v),
               backward_of(lambda a, b, c: cudnn(a, b, c, causal), q, k, v)]
    else:
        print(f"{name}: fmha runs {fmha.api.describe(q, k, v)}; then {args.hopper}", flush=True)
        fns = [lambda: fmha.attention(q, k, v), lambda: cudnn(q, k, v)] + [changed(q, k, v, spec)
                                                                           for spec in args.hopper]
    if name == "fp8nc16k":
        (q8, qs), (k8, ks), (v8, vs) = (quantized(t) for t in (q, k, v))
        fns[1] = lambda: fmha.attention(q8, k8, v8, q_descale=qs, k_descale=ks, v_descale=vs)
    profile(fns)
