"""The GPU time of one backward, kernel by kernel, beside cuDNN's: what each kernel of a forward-with-grad and its
``torch.autograd.grad`` costs (``torch.profiler``), less what the forward alone costs.

    PYTHONPATH=src python3 bench/backward_kernels.py [--head-dims 64 128] [--seqlens 512 1024 2048 4096]
        [--causal 0 1] [--providers triton gluon gluon-block gluon-counter gluon-early gluon:ds_bufs=2 cudnn fa4]
        [--deterministic] [--softcap 50] [--alibi]
        [--kernels] [--head-dim-v 128] [--ledger bench/ledger.csv]

Cells: the default grid's shapes (B*S = 16k, H*D = 2048; bf16, bhsd). Providers: ``triton`` (fmha's backward held to
the Triton kernels), ``gluon`` (every length on the Gluon kernel, its programs dealt as
:func:`fmha.kernels.hopper.backward.schedule` deals them), ``gluon-block`` (one program a key block),
``gluon-counter`` (every walk from the counter), ``gluon-early`` (Q's and dO's stage freed while dQ's products run:
:class:`fmha.kernels.hopper.backward.Tiles`'s ``early_free``), ``gluon:FIELD=VALUE,...`` (the table's tiles with those
fields of :class:`~fmha.kernels.hopper.backward.Tiles` replaced), ``cudnn`` (SDPA's cuDNN backend), ``fa4``
(FlashAttention-4's ``flash_attn.cute``, where it imports: its own bshd layout); ``--deterministic``
times fmha's fixed order; ``--head-dim-v``: V's head dim (DeepSeek-V3's 128 beside q/k's 192); ``--softcap``,
``--alibi``: the scores capped (Gemma 2's 50) or biased (a slope a head), where a provider takes them (cuDNN neither,
FA4 the cap). The backward's time
is what its kernels take on the GPU, so a run reads the kernels' share of a backward apart from its host time and
launch gaps (``fmha bench --pass bwd`` times the whole call). Rows: ``pass`` ``bwd``, ``ms`` the backward's kernels,
TFLOP/s 2.5x the forward's FLOPs over it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1] / "src"))  # after PYTHONPATH: another tree can be timed

import fmha  # noqa: E402
from fmha import backward  # noqa: E402
from fmha.bench import ledger, providers  # noqa: E402
from fmha.bench.flops import attention_flops  # noqa: E402
from fmha.bench.timing import kernel_times  # noqa: E402
from fmha.kernels.hopper import backward as gluon  # noqa: E402

# the rows rules each provider holds the backward to (distinct objects: the backward's replay key holds their ids)
EVERY_LENGTH: dict[str, dict] = {}  # by provider, made at its first use
DEALT = gluon.schedule
TILES = gluon.tiles


def tiles_with(fields: dict):
    """The table's tiles with ``fields`` replaced (the ``gluon:FIELD=VALUE`` providers)."""
    return lambda head, deterministic=False, dv=0: TILES(head, deterministic, dv)._replace(**fields)


def tile_fields(provider: str) -> dict:
    """``gluon:ds_bufs=2,early_free=1`` -> {"ds_bufs": 2, "early_free": True}; {} for any other provider."""
    if provider == "gluon-early":
        return {"early_free": True}
    if not provider.startswith("gluon:"):
        return {}
    fields = {}
    for item in provider.split(":", 1)[1].split(","):
        name, value = item.split("=")
        kind = type(getattr(TILES(128), name))
        fields[name] = kind(int(value))
    return fields


def one_program_a_block(blocks, sms, causal, packed, deterministic):
    return blocks, False


def every_walk_from_the_counter(blocks, sms, causal, packed, deterministic):
    return DEALT(blocks, sms, causal, packed, deterministic) if deterministic else (min(blocks, sms), True)


DEALS = {"gluon-block": one_program_a_block, "gluon-counter": every_walk_from_the_counter}


def attention_of(provider: str, causal: bool, deterministic: bool, mods: dict):
    if provider == "cudnn":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def sdpa(q, k, v):
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return sdpa
    if provider == "fa4":
        from fmha.bench.providers import entry
        fa4 = entry("flash_attn.cute", "flash_attn_func")
        if fa4 is None:
            raise SystemExit("fa4: flash_attn.cute does not import here")

        def flash(q, k, v):
            out = fa4(q, k, v, causal=causal, softcap=mods.get("softcap", 0.0))
            return out[0] if isinstance(out, tuple) else out  # (its output, and the LSE where it returns one)
        return flash
    return lambda q, k, v: fmha.attention(q, k, v, causal=causal, deterministic=deterministic, **mods)


def takes(provider: str, mods: dict) -> bool:
    """Whether ``provider`` takes the scores' modifiers ``mods``."""
    if provider == "cudnn":
        return not mods
    return provider != "fa4" or "alibi_slopes" not in mods


def measure(provider: str, q, k, v, causal: bool, deterministic: bool, reps: int,
            mods: dict) -> tuple[float, dict]:
    """The backward's kernels' time (us) and the forward-and-backward's kernels, one call's."""
    attend = attention_of(provider, causal, deterministic, mods)
    if provider == "fa4":  # FlashAttention's own layout, bshd, made outside the timing
        q, k, v = (t.detach().transpose(1, 2).contiguous().requires_grad_(True) for t in (q, k, v))
    do = torch.randn_like(v)  # (the output is as wide as V)
    rules = backward.GLUON_ROWS, backward.GLUON_ROWS_DETERMINISTIC
    if provider not in ("cudnn", "fa4"):
        gluon_rows = (EVERY_LENGTH.setdefault(provider, dict.fromkeys(backward.GLUON_ROWS, 1))
                      if provider.startswith("gluon") else providers.NO_GLUON_ROWS)
        backward.GLUON_ROWS = backward.GLUON_ROWS_DETERMINISTIC = gluon_rows
    gluon.schedule = DEALS.get(provider, DEALT)
    fields = tile_fields(provider)
    gluon.tiles = tiles_with(fields) if fields else TILES
    try:
        forward = kernel_times(lambda: attend(q, k, v), reps)
        both = kernel_times(lambda: torch.autograd.grad(attend(q, k, v), (q, k, v), do), reps)
    finally:
        backward.GLUON_ROWS, backward.GLUON_ROWS_DETERMINISTIC = rules
        gluon.schedule = DEALT
        gluon.tiles = TILES
    return sum(both.values()) - sum(forward.values()), both


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--head-dims", nargs="+", type=int, default=[64, 128])
    p.add_argument("--seqlens", nargs="+", type=int, default=[512, 1024, 2048, 4096])
    p.add_argument("--causal", nargs="+", type=int, default=[0, 1])
    p.add_argument("--providers", nargs="+", default=["triton", "gluon", "cudnn"],
                   help="triton, gluon, gluon-block, gluon-counter, gluon-early, gluon:FIELD=VALUE,..., cudnn, fa4")
    p.add_argument("--deterministic", action="store_true")
    p.add_argument("--head-dim-v", type=int, default=0, help="V's head dim (0: q/k's)")
    p.add_argument("--softcap", type=float, default=0.0, help="the scores' cap (0: none)")
    p.add_argument("--alibi", action="store_true", help="ALiBi, a slope a head")
    p.add_argument("--kernels", action="store_true", help="print each kernel's time too")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ledger", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("backward_kernels.py times a GPU's kernels: no CUDA GPU here")
    env = ledger.environment("cuda")
    for d in args.head_dims:
        for s in args.seqlens:
            for causal in map(bool, args.causal):
                b, h, dv = 16384 // s, 2048 // d, args.head_dim_v or d
                q, k, v = (torch.randn(b, h, s, width, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                           for width in (d, d, dv))
                flops = 2.5 * attention_flops(b, h, s, s, d, causal, head_dim_v=dv)
                print(f"B{b} H{h} S{s} D{d}{f'/{dv}' if dv != d else ''}{' causal' if causal else ''}")
                mods = {"softcap": args.softcap} if args.softcap else {}
                if args.alibi:
                    mods["alibi_slopes"] = torch.linspace(0.02, 0.5, h, device="cuda")
                features = [f"head_dim_v={dv}"] if dv != d else []
                features += [f"softcap={args.softcap:g}"] * bool(args.softcap) + ["alibi=1"] * args.alibi
                rows = []
                for provider in args.providers:
                    if not takes(provider, mods):
                        print(f"  {provider:14s} takes no {' or '.join(features[-2:])}")
                        continue
                    us, kernels = measure(provider, q, k, v, causal, args.deterministic, args.reps, mods)
                    print(f"  {provider:14s} {us:9.1f} us  {flops / us / 1e6:6.1f} TFLOP/s")
                    if args.kernels:
                        for name, t in kernels.items():
                            print(f"      {t:9.1f}  {name}")
                    peer = {"cudnn": "sdpa:cudnn", "fa4": "flash_attn.cute"}.get(provider)
                    rows.append({**env, "provider": peer or ("fmha:deterministic" if args.deterministic else
                                                            "fmha:auto"),
                                 "config": "library default" if peer else f"backward: {provider}",
                                 "dtype": "bfloat16", "batch": b, "heads": h, "kv_heads": h, "seqlen_q": s,
                                 "seqlen_k": s, "head_dim": d, "causal": int(causal), "ms": us / 1000,
                                 "tflops": flops / us / 1e6, "note": "the backward's kernels' GPU time a call "
                                 "(bench/backward_kernels.py)", "pass": "bwd",
                                 "features": " ".join(features)})
                if args.ledger:  # a cell at a time: a run cut short keeps what it measured
                    ledger.append(args.ledger, rows)


if __name__ == "__main__":
    main()
