"""Host time of one eager call, fmha beside SDPA, for each path ``auto`` takes, and where fmha's goes.

    PYTHONPATH=src python3 bench/host_profile.py [--cases decode decode-growing prefill varlen varlen-tiled paged
        backward backward-triton]
        [--calls 40] [--rounds 15] [--copies 1] [--profile decode] [--breakdown paged] [--parts decode-growing]
        [--ledger bench/ledger.csv]

A round enqueues ``--calls`` calls back to back behind a kernel that keeps the GPU busy for longer than the round
takes (``torch.cuda._sleep``), so the figure is what the host spends to enqueue one call and never the GPU's time
(a queue that fills up makes the host wait for the kernels: timing many calls against a running GPU measures the
slower of the two). fmha's and SDPA's rounds alternate; each figure is the median over ``--rounds``, and the ratio
of the two fastest rounds is printed beside the medians' (host noise only adds). ``--copies N`` gives each case N
copies of its inputs, a call taking the next, so the tensors lie somewhere new at each call as a real program's do
(TMA descriptors are encoded again). The GPU time of one call (CUDA events, the median of the same rounds run
unblocked) is printed beside it, to show which side bounds an eager loop. SDPA gets the same q, k, v (the padded
batch for varlen, the gathered cache for paged; ``backward`` and ``backward-triton`` time the gradients of q, k and
v from an output whose forward ran once, on the Gluon backward and on the Triton kernels). ``--profile CASE``
prints cProfile's top entries for that case; ``--breakdown CASE`` times the parts of a replayed call the same way
(the replay key, the allocation of its buffers, each recorded launch alone) beside the whole call. ``--parts CASE``
times the parts of that case's calls as they come, each part's own time summed over ``--calls`` calls with Python's
garbage collector off (for ``decode-growing`` every call is of a new kind: the checks, the plan, the launch path
with its dispatch to the compiled kernels, the recording, or the replay from the family of lengths before it, with
or without the plan), beside the whole call. Ledger rows: ``provider`` ``host:fmha`` / ``host:sdpa``, ``features``
``part=host case=<case> copies=<N> min_us=<the fastest round>``, ``ms`` the host time per call (the median),
``ratio_best_peer`` SDPA's over fmha's.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1] / "src"))  # after PYTHONPATH: another tree can be timed

import fmha  # noqa: E402
from fmha.bench import ledger  # noqa: E402

SDPA = torch.nn.functional.scaled_dot_product_attention


GROWING = 1024  # the cache lengths decode-growing steps through (more than one run of the case makes calls)


def _growing(call, caches):
    """``call`` over the next of ``caches`` at each call (a decode whose cache grows: no two calls alike)."""
    at = iter(range(1 << 30))
    return lambda: call(caches[next(at) % len(caches)])


def _cycling(pairs):
    """One (fmha call, SDPA call) pair over each of ``pairs``' copies of the inputs, taking the next copy at
    each call (the tensors of a real program's calls lie somewhere new each time)."""
    at = [iter(range(1 << 30)) for _ in range(2)]
    return tuple((lambda side=side: pairs[next(at[side]) % len(pairs)][side]()) for side in range(2))


def cases(dt=torch.bfloat16, copies: int = 1) -> dict:
    """name -> (fmha call, SDPA call, (batch, heads, kv_heads, seqlen_q, seqlen_k, D)); with ``copies`` > 1 each
    case's inputs come in that many copies, a call taking the next (pointers move, descriptors are re-encoded)."""
    dev = "cuda"
    rand = lambda *shape: torch.randn(*shape, device=dev, dtype=dt)  # noqa: E731

    def decode():
        q, k, v = rand(1, 32, 1, 64), rand(1, 8, 1024, 64), rand(1, 8, 1024, 64)
        return lambda: fmha.attention(q, k, v), lambda: SDPA(q, k, v, enable_gqa=True)

    def prefill():
        q, k, v = rand(2, 1024, 32, 128), rand(2, 1024, 8, 128), rand(2, 1024, 8, 128)
        return (lambda: fmha.attention(q, k, v, causal=True, layout="bshd"),
                lambda: SDPA(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                             enable_gqa=True))
    lens = [700, 1024, 300, 1000]
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=dev)

    def varlen(variant):
        def make():
            q, k, v = rand(sum(lens), 32, 128), rand(sum(lens), 8, 128), rand(sum(lens), 8, 128)
            qpad, kpad, vpad = rand(len(lens), 32, max(lens), 128), rand(len(lens), 8, max(lens), 128), \
                rand(len(lens), 8, max(lens), 128)
            return (lambda: fmha.attention_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True, variant=variant),
                    lambda: SDPA(qpad, kpad, vpad, is_causal=True, enable_gqa=True))
        return make
    page, pages = 256, 16

    def paged():
        kc, vc = rand(4 * pages, page, 8, 128), rand(4 * pages, page, 8, 128)
        table = torch.arange(4 * pages, device=dev, dtype=torch.int32).view(4, pages)
        seqlens = torch.full((4,), pages * page - 7, device=dev, dtype=torch.int32)
        qd = rand(4, 32, 1, 128)
        kg, vg = (t.view(4, pages * page, 8, 128).transpose(1, 2) for t in (kc, vc))
        return lambda: fmha.attention_paged(qd, kc, vc, table, seqlens), lambda: SDPA(qd, kg, vg, enable_gqa=True)
    def backward(seqlen):
        def make():
            q, k, v = (t.requires_grad_(True) for t in (rand(2, seqlen, 32, 128), rand(2, seqlen, 8, 128),
                                                         rand(2, seqlen, 8, 128)))
            o = fmha.attention(q, k, v, causal=True, layout="bshd")
            ref = SDPA(*(t.transpose(1, 2) for t in (q, k, v)), is_causal=True, enable_gqa=True)
            do = torch.randn_like(o)
            return (lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True),
                    lambda: torch.autograd.grad(ref, (q, k, v), do.transpose(1, 2), retain_graph=True))
        return make
    makers = {"decode": (decode, (1, 32, 8, 1, 1024, 64)), "prefill": (prefill, (2, 32, 8, 1024, 1024, 128)),
              "backward": (backward(1024), (2, 32, 8, 1024, 1024, 128)),  # the Gluon backward from 1k rows
              "backward-triton": (backward(512), (2, 32, 8, 512, 512, 128)),
              "varlen": (varlen("auto"), (len(lens), 32, 8, max(lens), max(lens), 128)),
              "varlen-tiled": (varlen("tiled"), (len(lens), 32, 8, max(lens), max(lens), 128)),  # the cu_seqlens
              "paged": (paged, (4, 32, 8, 1, pages * page, 128))}  # checked on the device
    out = {name: (*_cycling([make() for _ in range(copies)]), shape) for name, (make, shape) in makers.items()}
    # generate()'s decoding: the cache one key longer at every call (a new tensor, as transformers' cache grows)
    q = rand(1, 32, 1, 64)
    caches = [rand(2, 1, 8, 1024 + i, 64) for i in range(GROWING)]
    out["decode-growing"] = (_growing(lambda kv: fmha.attention(q, kv[0], kv[1]), caches),
                             _growing(lambda kv: SDPA(q, kv[0], kv[1], enable_gqa=True), caches),
                             (1, 32, 8, 1, 1024, 64))
    return out


SLEEP_CYCLES_PER_CALL = 400_000  # about 0.25 ms of GPU time a call: longer than any call here takes to enqueue


def host_rounds(fns: dict, calls: int, rounds: int) -> dict:
    """Host microseconds per call of each round, enqueueing ``calls`` calls of each of ``fns`` (name -> call),
    the GPU held busy throughout; the names' rounds alternate.  One call of each first, to compile and record."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            torch.cuda._sleep(SLEEP_CYCLES_PER_CALL * calls)
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    return times


def host_us(fns: dict, calls: int, rounds: int) -> dict:
    """The median of :func:`host_rounds` for each of ``fns``."""
    return {name: statistics.median(t) for name, t in host_rounds(fns, calls, rounds).items()}


def breakdown(fn, calls: int, rounds: int) -> dict:
    """Host microseconds of the parts of ``fn``'s replayed call (:mod:`fmha.replay`), each timed as
    :func:`host_us` times a call: the whole call, its replay key, the recipe's run (allocation and launches),
    the allocation alone (the returned buffers, the workspace) and each recorded launch alone over the same
    buffers."""
    from fmha import replay
    seen, real = [], replay.key  # (every replayed call makes its key first: :func:`fmha.replay.replayed`)

    def key(kind, inputs, *flags):
        k = real(kind, inputs, *flags)
        seen.append((k, inputs))
        return k
    replay.key = key
    try:
        fn()
        fn()
    finally:
        replay.key = real
    k, inputs = seen[-1]
    device = inputs[0].device
    recipe = replay._RECIPES.get(k)
    if recipe is None or recipe is replay.UNRECORDABLE or recipe.fast is None:
        return {"whole call (not on the fast replay path)": host_us({"": fn}, calls, rounds)[""]}
    n, stream = len(inputs), replay._stream(device)
    held = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in recipe.buffers]
    for i, count in recipe.tickets:  # (a split's counters: the stream's, at zero)
        held[i] = replay._tickets(device, stream, count)
    ptrs = [None if t is None else t.data_ptr() for t in (*inputs, *held)]

    def allocate():
        for _, shape, dtype in recipe.returned:
            torch.empty(shape, dtype=dtype, device=device)
        if recipe.scratch_bytes:
            replay._workspace(recipe.scratch_bytes, device, stream)
    parts = {"whole call": fn, "replay.key": lambda: replay.key(k[0], inputs, *k[1 + n:]),
             "recipe.run": lambda: recipe.run(inputs, device), "allocation": allocate}
    for i, step in enumerate(recipe.fast):
        name = getattr(recipe.steps[i][0], "name", f"launch {i}")
        parts[f"launch {i}: {name}"] = lambda step=step: step(ptrs, n, stream)
    return host_us(parts, calls, rounds)


def parts(fn, calls: int) -> dict:
    """Microseconds a call spent in each part of fmha's call path (inclusive: a part's time holds the parts it
    calls), over ``calls`` calls of ``fn`` after one untimed, the garbage collector off."""
    import gc
    from fmha import api, forward, plan, replay
    from fmha import kernels
    from fmha.kernels import combine
    spent: dict = {}
    wrapped = [(api, "check_inputs"), (plan, "problem"), (plan, "plan"), (forward, "output"), (kernels, "launch"),
               (combine, "launch"), (replay, "_dispatch"), (replay.Recipe, "__init__"), (replay, "key"),
               (replay, "replayed"), (replay, "call"), (replay, "_known_length"), (replay, "lengthwise"),
               (replay._Length, "at"), (replay._Family, "learn"), (replay._Family, "reach")]
    real = {(owner, name): getattr(owner, name) for owner, name in wrapped}

    def timed(owner, name):
        inner, label = real[(owner, name)], f"{owner.__name__.removeprefix('fmha.')}.{name}"  # (a module or a class)

        def part(*a, **kw):
            t0 = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0
        return part
    fn()
    torch.cuda.synchronize()
    for owner, name in wrapped:
        setattr(owner, name, timed(owner, name))
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        whole = time.perf_counter() - t0
    finally:
        gc.enable()
        for (owner, name), f in real.items():
            setattr(owner, name, f)
    torch.cuda.synchronize()
    return {"whole call": whole / calls * 1e6, **{k: v / calls * 1e6 for k, v in spent.items()}}


def gpu_us(fn, calls: int, rounds: int) -> float:
    """Median GPU microseconds per call, ``calls`` calls back to back between two CUDA events."""
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls * 1e3)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", default=["decode", "decode-growing", "prefill", "varlen", "varlen-tiled",
                                                  "paged", "backward", "backward-triton"])
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--copies", type=int, default=1,
                   help="each case's inputs in this many copies, each call taking the next (pointers move)")
    p.add_argument("--profile", default=None, help="print cProfile's top entries for this case")
    p.add_argument("--breakdown", nargs="*", default=[], help="time the parts of these cases' replayed calls")
    p.add_argument("--parts", nargs="*", default=[], help="time the parts of the call path of these cases' calls")
    p.add_argument("--ledger", default=None)
    args = p.parse_args()
    env = ledger.environment("cuda")
    table = cases(copies=args.copies)
    rows = []
    print(f"{'case':14} {'fmha us':>8} {'sdpa us':>8} {'fmha/sdpa':>9} {'(min)':>7} | GPU us a call: {'fmha':>7} "
          f"{'sdpa':>7}")
    for name in args.cases:
        ours, theirs, (b, h, kvh, sq, sk, d) = table[name]
        times = host_rounds({"fmha": ours, "sdpa": theirs}, args.calls, args.rounds)
        us = {who: statistics.median(t) for who, t in times.items()}
        low = {who: min(t) for who, t in times.items()}
        gpu = [gpu_us(fn, args.calls, 3) for fn in (ours, theirs)]
        print(f"{name:14} {us['fmha']:8.1f} {us['sdpa']:8.1f} {us['fmha'] / us['sdpa']:9.2f} "
              f"{low['fmha'] / low['sdpa']:7.2f} | {'':14} {gpu[0]:7.1f} {gpu[1]:7.1f}", flush=True)
        for who, t in us.items():
            rows.append(dict(env, provider=f"host:{who}", config="eager, host time per call, GPU held busy",
                             dtype="bfloat16",
                             batch=b, heads=h, kv_heads=kvh, seqlen_q=sq, seqlen_k=sk, head_dim=d, causal="",
                             ms=t / 1e3, ratio_best_peer=us["sdpa"] / t, note="ok",
                             features=f"part=host case={name} copies={args.copies} min_us={low[who]:.1f}"))
    ledger.append(args.ledger, rows)
    for name in args.breakdown:
        print(f"\n{name}: host us a call, by part")
        for part, t in breakdown(table[name][0], args.calls, args.rounds).items():
            print(f"  {part:40} {t:7.1f}")
    for name in args.parts:
        print(f"\n{name}: host us a call in each part of the call path (inclusive), GC off")
        for part, t in parts(table[name][0], args.calls).items():
            print(f"  {part:40} {t:7.1f}")
    if args.profile:
        fn = table[args.profile][0]
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            fn()
        prof.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)


if __name__ == "__main__":
    main()
