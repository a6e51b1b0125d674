"""Real model code with ``attn_implementation="fmha"`` against ``"sdpa"``: transformers' Llama, Qwen2,
Gemma 2 and Mistral built from configs (their real widths and head counts, a few layers, random
weights, bf16), eager.

    PYTHONPATH=src python3 bench/model_speed.py [--models llama qwen2 gemma2 mistral] [--layers 4]
        [--seqlens 1024 4096 16384] [--batches 1 8] [--new-tokens 32] [--left-pad 256] [--packed 8]
        [--first-generate] [--reps 3]
        [--compiled [--fresh-cache]] [--profile] [--ledger bench/ledger.csv]

Per model, batch and prompt length, for each implementation: the prefill forward's time, the time inside attention
(CUDA events around every attention call of that forward, summed), and the time per token of greedy ``generate()``
after that prompt (the two implementations' runs alternating, ``--reps`` rounds: the median of each, and the spread
of the rounds' own ratios, printed and in the decode row's note); fmha's rows say which variants ran, whether its
greedy tokens equal SDPA's, and where a row's part from SDPA's, whether SDPA's model rates both tokens there within
a bf16 step (:func:`fmha.verify.greedy_partings`: random weights give near-ties; a row parting off a tie is marked
``!`` and listed). ``--left-pad N``: generate()'s prompts, the first half of the rows, left-padded by N tokens
(``features`` ``padding=leftN``). ``--packed N``: at batch 1, also a training step's forward and backward over N
sequences packed in the prompt's length by position_ids (padding-free: SDPA gets transformers' block-diagonal mask).
``--first-generate``: every timed generate() as a program's first (fmha's recipes forgotten before each: each cache
length a new kind; without it the lengths recur from the runs before and every fmha call replays). Rows go to the
ledger (``provider`` ``transformers:<impl>``, ``features`` ``part=forward|attention|decode`` (``decode
first-generate``), ``ratio_best_peer`` against SDPA's row). The decode cells also report each attention call's host
time inside the timed generate() runs (entry to return, no synchronization), the first layer's calls (a new cache
length at each token) apart from the other layers' (``features`` ``part=host-call layer=first|rest``, ``ms`` per
call). ``--compiled``: generate() alone with a static cache, whose decoding steps transformers compiles
(``torch.compile(mode="reduce-overhead")``), with dynamo's counts of graphs, graph breaks and recompilations while
timed, inductor's of graphs run without their CUDA graph, and the CUDA graphs recorded while timed
(:func:`compiled_decode`; ``features`` ``part=decode compiled=...``); ``--profile`` prints each implementation's
GPU kernels over one such generate(), and without ``--compiled`` the GPU kernels and the operators' host time of one
prefill forward and cProfile's view of one eager generate() each (where the host's time goes, :func:`_host_profile`).
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import statistics
import sys
import time
from functools import partial
from pathlib import Path

import torch

sys.path.append(str(Path(__file__).resolve().parents[1] / "src"))  # after PYTHONPATH: another tree can be timed

import fmha.plan  # noqa: E402
import fmha.replay  # noqa: E402
import fmha.integrations.transformers as fmha_hf  # noqa: E402
from fmha import verify  # noqa: E402
from fmha.bench import ledger  # noqa: E402

VOCAB = 32000  # real embedding tables would only add one large GEMM


def model_configs(layers: int) -> dict:
    """Each family at a real size's widths (Llama-3.2-1B, Qwen2-7B, Gemma-2-9B, Mistral-7B)."""
    import transformers as tf
    common = dict(vocab_size=VOCAB, num_hidden_layers=layers, max_position_embeddings=32768)
    return {
        "llama": (tf.LlamaForCausalLM, tf.LlamaConfig(hidden_size=2048, intermediate_size=8192,
                                                      num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                                                      rope_theta=500000.0, **common)),
        "qwen2": (tf.Qwen2ForCausalLM, tf.Qwen2Config(hidden_size=3584, intermediate_size=18944,
                                                      num_attention_heads=28, num_key_value_heads=4, **common)),
        "gemma2": (tf.Gemma2ForCausalLM, tf.Gemma2Config(hidden_size=3584, intermediate_size=14336,
                                                         num_attention_heads=16, num_key_value_heads=8, head_dim=256,
                                                         sliding_window=4096, attn_logit_softcapping=50.0,
                                                         query_pre_attn_scalar=256, **common)),
        "mistral": (tf.MistralForCausalLM, tf.MistralConfig(hidden_size=4096, intermediate_size=14336,
                                                            num_attention_heads=32, num_key_value_heads=8,
                                                            head_dim=128, sliding_window=4096, **common)),
    }


RAN: set[str] = set()  # the variants fmha's plans chose since last cleared


def _record_plans() -> None:
    plan = fmha.plan.plan

    def recorded(*a, **kw):
        p = plan(*a, **kw)
        RAN.add(p.variant)
        return p
    fmha.plan.plan = recorded


class Timed:
    """An attention implementation wrapped in CUDA events (while ``on``); while ``host`` is a list, each call's host
    time (seconds, from entry to return, no synchronization) is appended to it."""

    def __init__(self, fn):
        self.fn, self.on, self.events, self.host = fn, False, [], None

    def __call__(self, module, query, key, value, attention_mask, **kw):
        if self.host is not None:
            start = time.perf_counter()
            out = self.fn(module, query, key, value, attention_mask, **kw)
            self.host.append(time.perf_counter() - start)
            return out
        if not self.on:
            return self.fn(module, query, key, value, attention_mask, **kw)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = self.fn(module, query, key, value, attention_mask, **kw)
        end.record()
        self.events.append((start, end))
        return out

    def take_ms(self) -> float:
        torch.cuda.synchronize()
        ms = sum(s.elapsed_time(e) for s, e in self.events)
        self.events = []
        return ms


def register() -> dict[str, Timed]:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    fmha_hf.register()
    _record_plans()
    timed = {"fmha": Timed(fmha_hf.attention_forward), "sdpa": Timed(sdpa_attention_forward)}
    masks = {"fmha": fmha_hf.mask, "sdpa": sdpa_mask}  # each implementation's own mask function
    for name, t in timed.items():
        AttentionInterface.register(f"timed-{name}", t)
        AttentionMaskInterface.register(f"timed-{name}", masks[name])
    return timed


def _ms(fn) -> float:
    """``fn()``'s time in milliseconds, between two CUDA events after a synchronization; the garbage collector run
    before and held off during it (a pass over torch.compile's objects, tens of milliseconds, would land at random in
    one implementation's runs or the other's)."""
    gc.collect()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    gc.disable()
    try:
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
    finally:
        gc.enable()
    return s.elapsed_time(e)


def measure(models: dict, timers: dict, ids, reps: int = 5) -> dict:
    """Per model: the prefill forward's time (the median of ``reps``, the models' runs alternating: a short
    prompt's forward is host-bound, and the host's speed drifts) and the time inside attention during one
    forward."""
    out = {impl: {"forward": []} for impl in models}
    with torch.no_grad():
        for model in models.values():
            model(ids, use_cache=False)
        for _ in range(reps):
            for impl, model in models.items():
                out[impl]["forward"].append(_ms(partial(model, ids, use_cache=False)))
        for impl, model in models.items():
            out[impl]["forward"] = statistics.median(out[impl]["forward"])
            timers[impl].on = True
            model(ids, use_cache=False)
            timers[impl].on = False
            out[impl]["attention"] = timers[impl].take_ms()
    return out


def prompt_mask(ids, pad: int = 0):
    """The attention mask a tokenizer hands over with ``ids``: all ones (without it generate() takes random tokens
    equal to the pad id for padding: Gemma 2's is 0), or with the first half of the rows (one at batch 1)
    left-padded by ``pad`` tokens, as a batch of prompts of unequal lengths is."""
    mask = torch.ones_like(ids)
    mask[:max(1, ids.shape[0] // 2), :pad] = 0
    return mask


def decode(models: dict, ids, new_tokens: int, reps: int = 3, first: bool = False, mask=None, timers=None,
           layers: int = 0, profile: bool = False) -> dict:
    """Per model: the time per token of greedy generate() after ``ids`` (``1 + new_tokens`` tokens less one
    token's time, over ``new_tokens``) and the tokens it made.  The models' runs alternate, so a drift of the
    host's speed (eager decoding is host-bound) reaches each alike.  Each cache length recurs from the runs
    before, so fmha replays every call; ``first``: fmha's recipes are forgotten before each timed run (its
    compiled kernels kept), so each length is a kind it has not met, as in a program's first generate()
    (:mod:`fmha.replay`).  ``mask``: the prompt's attention mask (:func:`prompt_mask`'s all ones by default).
    With ``timers`` (the :class:`Timed` wrappers) and the model's ``layers``: each attention call's host time in the
    timed generate() runs, past the prompt's, in microseconds, the median of the first layer's calls (a new cache length
    at each token: for fmha a new kind where ``first``) and of the other layers' (``host_first``, ``host_rest``), and
    every layer's calls summed over a token, the mean (``host_token``: what the per-token figure holds of them).
    ``profile``: then one more generate() per implementation under cProfile (:func:`_host_profile`; for fmha a
    program's first where ``first``)."""
    mask = prompt_mask(ids) if mask is None else mask

    def gen(model, n):
        return model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False)
    times = {impl: ([], []) for impl in models}
    host = {impl: ([], []) for impl in models}  # the first layer's calls, the others'
    out = {}
    with torch.no_grad():
        for impl, model in models.items():
            out[impl] = {"tokens": gen(model, 1 + new_tokens)[:, ids.shape[1]:]}
            gen(model, 1)
        for _ in range(reps):
            for impl, model in models.items():
                for at, n in enumerate((1, 1 + new_tokens)):
                    if first and impl == "fmha":
                        fmha.replay.clear(compiled=False)
                    if timers is not None and at:
                        timers[impl].host = []
                    times[impl][at].append(_ms(partial(gen, model, n)))
                    if timers is not None and at:
                        calls, timers[impl].host = timers[impl].host[layers:], None  # (past the prompt's)
                        host[impl][0].extend(calls[::layers])
                        host[impl][1].extend(c for i, c in enumerate(calls) if i % layers)
    if profile:
        with torch.no_grad():
            for impl, model in models.items():
                if first and impl == "fmha":
                    fmha.replay.clear(compiled=False)
                _host_profile(impl, partial(gen, model, 1 + new_tokens))
    for impl, (one, many) in times.items():
        out[impl]["decode"] = (statistics.median(many) - statistics.median(one)) / new_tokens
        if timers is not None:
            out[impl]["host_first"], out[impl]["host_rest"] = (statistics.median(h) * 1e6 for h in host[impl])
            first_calls, other_calls = host[impl]  # (one first-layer call a token)
            out[impl]["host_token"] = (sum(first_calls) + sum(other_calls)) / len(first_calls) * 1e6
    # each round's own ratio, SDPA's time per token over fmha's: how far the host's drift moves one figure
    per_token = {impl: [(m - o) / new_tokens for o, m in zip(*times[impl])] for impl in times}
    if "fmha" in per_token and "sdpa" in per_token:
        rounds = [s / f for f, s in zip(per_token["fmha"], per_token["sdpa"])]
        out["fmha"]["rounds"] = (min(rounds), max(rounds))
    return out


def compiled_decode(models: dict, ids, new_tokens: int, reps: int = 3, profile: bool = False,
                    fresh_cache: bool = False) -> dict:
    """Per model: the time per token of greedy generate() with a static cache, whose decoding steps transformers
    compiles itself (``torch.compile``, ``mode="reduce-overhead"``: CUDA graphs; the prefill stays eager), timed as
    :func:`decode` times it after two untimed runs (the compilation, the graphs' recording).  The cache: one
    ``StaticCache`` per model, reset before each generate(), as a server keeps one; ``fresh_cache``: a new one in
    each generate() (``cache_implementation="static"``, transformers' way), whose tensors, static inputs of the
    step's CUDA graph, record that graph again wherever the allocator places them elsewhere than the last.  With
    dynamo's counts: graphs compiled in all, graph breaks, graphs compiled during the timed runs (a recompilation per
    token shows there), graphs inductor ran without their CUDA graph (``TORCH_LOGS=cudagraphs`` says why), and the
    CUDA graphs recorded during the timed runs with the host time their recordings took (inside the time per
    token).  ``profile``: then one more generate() under torch's profiler, its GPU kernels' times printed, the
    costliest first (each decoding step's, the graph replayed, among them)."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from transformers import StaticCache

    def gen(model, cache, n):
        if cache is None:
            return model.generate(ids, attention_mask=prompt_mask(ids), max_new_tokens=n, min_new_tokens=n,
                                  do_sample=False, cache_implementation="static")
        cache.reset()
        return model.generate(ids, attention_mask=prompt_mask(ids), max_new_tokens=n, min_new_tokens=n,
                              do_sample=False, past_key_values=cache)
    out = {}
    for impl, model in models.items():
        torch._dynamo.reset()
        counters.clear()
        cache = None if fresh_cache else StaticCache(config=model.config, max_cache_len=ids.shape[1] + 1 + new_tokens)
        try:
            with torch.no_grad():
                for _ in range(2):
                    tokens = gen(model, cache, 1 + new_tokens)[:, ids.shape[1]:]
                    gen(model, cache, 1)
                before = counters["stats"]["unique_graphs"]
                one, many = [], []
                with _recordings() as recorded:
                    for _ in range(reps):
                        for at, n in enumerate((1, 1 + new_tokens)):
                            (one, many)[at].append(_ms(partial(gen, model, cache, n)))
                if profile:
                    _profile(impl, partial(gen, model, cache, 1 + new_tokens))
            out[impl] = {"decode": (statistics.median(many) - statistics.median(one)) / new_tokens,
                         "tokens": tokens, "graphs": counters["stats"]["unique_graphs"],
                         "breaks": sum(counters["graph_break"].values()),
                         "recompiled": counters["stats"]["unique_graphs"] - before,
                         "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
                         "recorded": recorded}
        finally:
            torch._dynamo.reset()
    return out


@contextlib.contextmanager
def _recordings():
    """Within: ``[count, seconds]`` of the CUDA graphs inductor's CUDA graph trees record, and the host time their
    recordings take."""
    from torch._inductor import cudagraph_trees
    manager = cudagraph_trees.CUDAGraphTreeManager
    record, seen = manager.record_function, [0, 0.0]

    def counted(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return record(self, *args, **kwargs)
        finally:
            seen[0] += 1
            seen[1] += time.perf_counter() - start
    manager.record_function = counted
    try:
        yield seen
    finally:
        manager.record_function = record


def _profile(impl: str, fn, what: str = "one generate()", host: bool = False) -> None:
    """Print the GPU kernels of one run of ``fn`` under torch's profiler, by total time, the costliest first; with
    ``host``, also the operators by their own host time (what an eager, host-bound run spends where)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if host else [])) as prof:
        fn()
        torch.cuda.synchronize()
    table = prof.key_averages()
    print(f"{impl}: the GPU kernels of {what}")
    print(table.table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70))
    if host:
        print(f"{impl}: the operators of {what} by their own host time")
        print(table.table(sort_by="self_cpu_time_total", row_limit=20, max_name_column_width=70))


def _host_profile(impl: str, fn, rows: int = 25) -> None:
    """Print cProfile's busiest functions (their own time) over one run of ``fn``, and the attention implementation's
    own calls by their inclusive time: where an eager generate()'s host time goes."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    fn()
    torch.cuda.synchronize()
    prof.disable()
    stats = pstats.Stats(prof)
    print(f"{impl}: the host's time in one generate(), {stats.total_calls} Python calls, {stats.total_tt * 1e3:.1f} ms "
          "under the profiler")
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats("fmha|sdpa_attention|masking_utils", rows)


def packed_step(models: dict, tokens: int, sequences: int, reps: int = 5) -> dict:
    """Per model: the time of one training step's forward and backward (no optimizer) over one row of ``tokens``
    tokens packed from ``sequences`` sequences of random lengths, told apart by position_ids alone
    (transformers' padding-free format), the models' runs alternating."""
    g = torch.Generator().manual_seed(tokens + sequences)
    cuts = sorted(torch.randperm(tokens - 1, generator=g)[:sequences - 1].add(1).tolist())
    lens = [b - a for a, b in zip([0, *cuts], [*cuts, tokens])]
    pos = torch.tensor([[p for n in lens for p in range(n)]], device="cuda")
    ids = torch.randint(0, VOCAB, (1, tokens), device="cuda", generator=torch.Generator("cuda").manual_seed(tokens))

    def step(model):
        model.zero_grad(set_to_none=True)
        model(ids, position_ids=pos, labels=ids, use_cache=False).loss.backward()
    for model in models.values():
        model.train()
        step(model)
    times = {impl: [] for impl in models}
    for _ in range(reps):
        for impl, model in models.items():
            times[impl].append(_ms(partial(step, model)))
    for model in models.values():
        model.eval().zero_grad(set_to_none=True)
    return {impl: statistics.median(t) for impl, t in times.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=["llama", "qwen2", "gemma2", "mistral"])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seqlens", nargs="+", type=int, default=[1024, 4096, 16384])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    p.add_argument("--max-tokens", type=int, default=32768, help="skip batch*seqlen above this")
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--packed", type=int, default=0,
                   help="also a padding-free training step per seqlen: one row of that many packed sequences")
    p.add_argument("--first-generate", action="store_true",
                   help="time each generate() as a program's first: fmha's recipes forgotten before each timed run")
    p.add_argument("--left-pad", type=int, default=0,
                   help="generate(): the first half of the rows left-padded by this many tokens")
    p.add_argument("--compiled", action="store_true",
                   help="time generate() only, with a static cache (transformers compiles its decoding steps in "
                        "torch.compile's reduce-overhead mode: CUDA graphs), counting graphs, breaks, recompilations")
    p.add_argument("--fresh-cache", action="store_true",
                   help="--compiled: a new static cache in each generate() (transformers' cache_implementation="
                        "\"static\"), not one reset between calls")
    p.add_argument("--profile", action="store_true", help="print each implementation's GPU kernels (--compiled) or "
                   "those and the operators' host time in one prefill forward, and where the host's time goes in one "
                   "eager generate() (cProfile)")
    p.add_argument("--reps", type=int, default=3,
                   help="rounds of generate() per implementation, alternating (the forward takes two more)")
    p.add_argument("--ledger", default=None)
    args = p.parse_args()
    timed = register()
    env = ledger.environment("cuda")
    configs = model_configs(args.layers)
    print(f"{'model':8} {'B':>2} {'S':>6} | {'fwd fmha/sdpa ms':>17} {'x':>5} | {'attn fmha/sdpa ms':>17} {'x':>5} | "
          f"{'token fmha/sdpa ms':>18} {'x':>5} | same tokens | fmha ran")
    for name in args.models:
        cls, cfg = configs[name]
        torch.manual_seed(0)
        models = {}
        with torch.device("cuda"):  # initialised where they run
            for impl in timed:
                models[impl] = cls._from_config(copy.deepcopy(cfg), attn_implementation=f"timed-{impl}",
                                                torch_dtype=torch.bfloat16).eval()
        models["fmha"].load_state_dict(models["sdpa"].state_dict())
        heads, kvh = cfg.num_attention_heads, cfg.num_key_value_heads
        d = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        for b in args.batches:
            for s in args.seqlens:
                if b * s > args.max_tokens:
                    continue
                ids = torch.randint(0, VOCAB, (b, s), device="cuda", generator=torch.Generator("cuda").manual_seed(s))
                if args.compiled:
                    res = compiled_decode(models, ids, args.new_tokens, reps=args.reps, profile=args.profile,
                                          fresh_cache=args.fresh_cache)
                    rows = _compiled_rows(name, args.layers, b, s, heads, kvh, d, env, res, args.new_tokens,
                                          args.fresh_cache,
                                          *_agreement(res, ids, models["sdpa"]))
                    ledger.append(args.ledger, rows)
                    continue
                RAN.clear()
                res = measure(models, timed, ids, reps=args.reps + 2)
                if args.profile:
                    with torch.no_grad():
                        for impl, model in models.items():
                            _profile(impl, partial(model, ids, use_cache=False), "one prefill forward", host=True)
                mask = prompt_mask(ids, args.left_pad)
                for impl, r in decode(models, ids, args.new_tokens, reps=args.reps, first=args.first_generate,
                                      mask=mask, timers=timed, layers=args.layers, profile=args.profile).items():
                    res[impl].update(r)
                same, parting, off = _agreement(res, ids, models["sdpa"], mask)
                ran = "+".join(sorted(RAN)) or "-"
                ratio = {part: res["sdpa"][part] / res["fmha"][part] for part in ("forward", "attention", "decode")}
                print(f"{name:8} {b:>2} {s:>6} | {res['fmha']['forward']:8.2f}/{res['sdpa']['forward']:<8.2f} "
                      f"{ratio['forward']:5.2f} | {res['fmha']['attention']:8.2f}/{res['sdpa']['attention']:<8.2f} "
                      f"{ratio['attention']:5.2f} | {res['fmha']['decode']:8.2f}/{res['sdpa']['decode']:<9.2f} "
                      f"{ratio['decode']:5.2f} ({_rounds(res['fmha'])}) | "
                      f"{same:>3}/{args.new_tokens + 1:<3}{'!' if off else ' '}    | {ran}",
                      flush=True)
                host = {part: res["sdpa"][part] / res["fmha"][part] for part in ("host_first", "host_rest")}
                print(f"{'':18}host us a call in generate(), fmha/sdpa: first layer {res['fmha']['host_first']:.1f}/"
                      f"{res['sdpa']['host_first']:.1f} ({host['host_first']:.2f}x), other layers "
                      f"{res['fmha']['host_rest']:.1f}/{res['sdpa']['host_rest']:.1f} ({host['host_rest']:.2f}x); "
                      f"every call of a token {res['fmha']['host_token']:.1f}/{res['sdpa']['host_token']:.1f}",
                      flush=True)
                rows = []
                first = (" first-generate" if args.first_generate else "") + (
                    f" padding=left{args.left_pad}" if args.left_pad else "")
                what = {"fmha": f"{name} {args.layers} layers ({ran})", "sdpa": f"{name} {args.layers} layers"}
                for impl, r in res.items():
                    for part in ("forward", "attention", "decode"):
                        rows.append(dict(env, provider=f"transformers:{impl}", dtype="bfloat16", batch=b, heads=heads,
                                         kv_heads=kvh, seqlen_q=s if part != "decode" else 1, seqlen_k=s,
                                         head_dim=d, causal=1, ms=r[part],
                                         features=f"part={part}" + (first if part == "decode" else ""),
                                         config=what[impl],
                                         ratio_best_peer=ratio[part] if impl == "fmha" else 1.0,
                                         note=(f"greedy tokens equal sdpa's: first {same} of {args.new_tokens + 1}"
                                               f"{parting}; {args.reps} rounds, each {_rounds(r)}"
                                               if impl == "fmha" and part == "decode" else "ok")))
                    for part, layer in (("host_first", "first"), ("host_rest", "rest")):
                        rows.append(dict(env, provider=f"transformers:{impl}", dtype="bfloat16", batch=b, heads=heads,
                                         kv_heads=kvh, seqlen_q=1, seqlen_k=s, head_dim=d, causal=1,
                                         ms=r[part] / 1e3, features=f"part=host-call layer={layer}" + first,
                                         config=what[impl], ratio_best_peer=host[part] if impl == "fmha" else 1.0,
                                         note="host time of one attention call in generate(), the median"))
                if args.packed and b == 1:
                    t = packed_step(models, s, args.packed)
                    print(f"{name:8} packed {args.packed} sequences in {s} tokens, training step fmha/sdpa ms: "
                          f"{t['fmha']:.2f}/{t['sdpa']:.2f} ({t['sdpa'] / t['fmha']:.2f}x)", flush=True)
                    for impl, ms in t.items():
                        rows.append(dict(env, provider=f"transformers:{impl}", dtype="bfloat16", batch=1, heads=heads,
                                         kv_heads=kvh, seqlen_q=s, seqlen_k=s, head_dim=d, causal=1, ms=ms,
                                         features=f"part=packed-train sequences={args.packed}", config=what[impl],
                                         ratio_best_peer=t["sdpa"] / ms if impl == "fmha" else 1.0, note="ok"))
                ledger.append(args.ledger, rows)
                torch.cuda.empty_cache()
        del models
        torch.cuda.empty_cache()


def _rounds(r: dict) -> str:
    """The spread of the rounds' own per-token ratios (:func:`decode`)."""
    lo, hi = r["rounds"]
    return f"{lo:.2f}-{hi:.2f}x"


def _agreement(res: dict, ids, sdpa_model, mask=None) -> tuple[int, str, list]:
    """How far fmha's greedy tokens (``res[impl]["tokens"]`` after the prompt ``ids``, ``mask`` its attention
    mask) equal SDPA's in every row, the note on where rows part (:func:`fmha.verify.greedy_partings`: SDPA's model
    rates both tokens within a bf16 step, or not), and the rows that part off such a tie ``(row, token, gap,
    step)``."""
    same = int((res["fmha"]["tokens"] == res["sdpa"]["tokens"]).all(dim=0).cumprod(0).sum())
    full = {impl: torch.cat([ids, res[impl]["tokens"]], 1) for impl in ("fmha", "sdpa")}
    parts = verify.greedy_partings(full["fmha"], full["sdpa"], sdpa_model, mask)
    off = [(row, at - ids.shape[1], gap, step) for row, at, gap, step in parts if gap > step]
    parting = ("" if not parts else "; where a row parts, SDPA's model rates both tokens within a "
               "bf16 step" if not off else "; rows parting off a bf16 tie (row, token, gap, step): "
               + " ".join(f"({r}, {t}, {g:.3g}, {st:.3g})" for r, t, g, st in off))
    return same, parting, off


def _compiled_rows(name, layers, b, s, heads, kvh, d, env, res, new_tokens, fresh_cache, same, parting, off) -> list:
    """Print :func:`compiled_decode`'s figures for one cell; its ledger rows."""
    ratio = res["sdpa"]["decode"] / res["fmha"]["decode"]
    counts = {impl: f"graphs {r['graphs']}, breaks {r['breaks']}, compiled while timed {r['recompiled']}, "
                    f"CUDA graphs skipped {r['cudagraph_skips']}, recorded while timed {r['recorded'][0]} "
                    f"({1e3 * r['recorded'][1]:.1f} ms)" for impl, r in res.items()}
    print(f"{name:8} {b:>2} {s:>6} | compiled, static cache, per token fmha/sdpa ms {res['fmha']['decode']:.2f}/"
          f"{res['sdpa']['decode']:.2f} ({ratio:.2f}x) | same tokens {same}/{new_tokens + 1}{'!' if off else ''} | "
          f"fmha: {counts['fmha']}; sdpa: {counts['sdpa']}", flush=True)
    return [dict(env, provider=f"transformers:{impl}", dtype="bfloat16", batch=b, heads=heads, kv_heads=kvh,
                 seqlen_q=1, seqlen_k=s, head_dim=d, causal=1, ms=r["decode"],
                 features="part=decode compiled=reduce-overhead cache=static" + ("" if fresh_cache else "-reused"),
                 config=f"{name} {layers} layers",
                 ratio_best_peer=ratio if impl == "fmha" else 1.0,
                 note=counts[impl] + (f"; greedy tokens equal sdpa's: first {same} of {new_tokens + 1}{parting}"
                                      if impl == "fmha" else ""))
            for impl, r in res.items()]


if __name__ == "__main__":
    main()
