"""What checking a paged cache's indices costs: `fmha.attention_paged` with and without the check.

`PYTHONPATH=src python3 bench/guard_cost.py [--ledger FILE]`: bf16, GQA 32 query heads on 8 KV heads, D=128;
decoding (1 and 4 query rows, batch 8, 8k keys per sequence in pages of 16 and 256 keys) and prefill
(2048 queries against 8k keys in pages of 256).  Each call is timed three ways, alternately, in the same run:
as it runs (`self`: `tiled` in tiles off wgmma checks the indices itself, `fmha.forward.self_checked`; the
others take the separate check), with the separate check (`apart`: `fmha.kernels.guards.check_pages`, one small
program per sequence queued before the attention kernel) and with no check (`off`): the GPU time of CUDA-graph
replays and the wall time of eager calls back to back (host launch cost included).  Rows go to the ledger
with features "paged guard=self|apart|off".
"""
import argparse
import time

import torch

import fmha
from fmha import forward, replay
from fmha.bench import ledger
from fmha.bench.flops import attention_flops
from fmha.bench.timing import graph_median_ms
from fmha.kernels import guards

CASES = [(8, 1, 8192, 16), (8, 4, 8192, 16), (8, 1, 8192, 256), (2, 2048, 8192, 256)]  # batch, Sq, Sk, page


def eager_us(fn, calls: int = 200) -> float:
    """Wall time per call of ``calls`` eager calls back to back, the GPU drained before and after."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ledger", default=str(ledger.DEFAULT_LEDGER))
    args = ap.parse_args()
    env = ledger.environment("cuda")
    heads, kv_heads, d = 32, 8, 128
    check, self_checked = guards.check_pages, forward.self_checked
    rows = []
    print(f"{'B':>3} {'Sq':>5} {'Sk':>6} {'page':>5} {'guard':>6} {'graph us':>9} {'eager us':>9}")
    for b, sq, sk, page in CASES:
        g = torch.Generator().manual_seed(sk + sq)
        q = torch.randn(b, heads, sq, d, generator=g).to("cuda", torch.bfloat16)
        pool = [torch.randn(b * sk // page, page, kv_heads, d, generator=g).to("cuda", torch.bfloat16)
                for _ in range(2)]
        table = torch.randperm(b * sk // page, generator=g).view(b, sk // page).to(torch.int32).to("cuda")
        lens = torch.full((b,), sk, dtype=torch.int32, device="cuda")

        def call():
            return fmha.attention_paged(q, *pool, table, lens, causal=True)
        times = {"self": [], "apart": [], "off": []}
        for _ in range(3):  # alternate, so drift falls on each alike
            for state in times:
                guards.check_pages = (lambda *a: None) if state == "off" else check
                forward.self_checked = self_checked if state == "self" else (lambda p, q: False)
                replay.clear(compiled=False)  # (a recorded call would replay the state it was recorded in)
                times[state].append((graph_median_ms(call) * 1e3, eager_us(call)))
        guards.check_pages, forward.self_checked = check, self_checked
        flops = attention_flops(b, heads, sq, sk, d, True, "bottom_right")
        for state, runs in times.items():
            graph, eager = min(r[0] for r in runs), min(r[1] for r in runs)
            print(f"{b:>3} {sq:>5} {sk:>6} {page:>5} {state:>6} {graph:>9.2f} {eager:>9.2f}", flush=True)
            rows.append(dict(env, provider="fmha:auto", config=f"guard={state}", dtype="bfloat16", batch=b,
                             heads=heads, kv_heads=kv_heads, seqlen_q=sq, seqlen_k=sk, head_dim=d, causal=1,
                             ms=graph / 1e3, tflops=flops / (graph * 1e-6) / 1e12, features=f"paged guard={state}",
                             note=f"pages of {page} keys; cuda graph; eager {eager:.2f} us per call back to back"))
    ledger.append(args.ledger, rows)


if __name__ == "__main__":
    main()
