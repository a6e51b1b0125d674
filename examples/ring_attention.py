"""Ring attention across processes: `torchrun --nproc-per-node N examples/ring_attention.py [--causal]`.

`--time K` then times K calls and prints tokens per second per GPU (the scaling figure: run it
with N=1 for the one-GPU baseline; `--ledger PATH` appends it to the iteration ledger);
`--no-check` skips the one-device reference (long sequences).

NCCL on GPUs (one per process), gloo on CPUs (set TRITON_INTERPRET=1 there); `--backend gloo`
on GPUs puts several ranks on one GPU (rank r on GPU r % device count). Every
rank builds the same random sequence, keeps its shard, runs fmha.distributed.ring_attention
and compares its output shard with single-device attention on the whole sequence.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

import fmha
from fmha.distributed import ring_attention, zigzag_shard


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--causal", action="store_true")
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None, help="default: nccl on GPUs, else gloo")
    p.add_argument("--time", type=int, default=0, metavar="K", help="time K calls after the check")
    p.add_argument("--no-check", action="store_true", help="skip the one-device reference")
    p.add_argument("--ledger", default=None, help="with --time: append the timing to this ledger (rank 0)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group(args.backend or ("nccl" if cuda else "gloo"))
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, args.heads, args.seqlen, 128, generator=g).to(device, torch.bfloat16)
               for _ in range(3))
    shard = (lambda t: zigzag_shard(t, rank, world)) if args.causal else (lambda t: t.chunk(world, 2)[rank])
    qs, ks, vs = shard(q), shard(k), shard(v)
    out = ring_attention(qs, ks, vs, causal=args.causal)
    if not args.no_check:
        ref = shard(fmha.attention(q, k, v, causal=args.causal))
        err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
        print(f"rank {rank}/{world}: shard {tuple(out.shape)}, relative difference to one device {err:.1e}")
    if args.time:
        dist.barrier()
        sync = torch.cuda.synchronize if cuda else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for _ in range(args.time):
            ring_attention(qs, ks, vs, causal=args.causal)
        sync()
        dist.barrier()
        seconds = (time.perf_counter() - t0) / args.time
        if rank == 0:
            per_rank = args.seqlen / seconds / world
            print(f"{world} rank(s), {args.seqlen} tokens x {args.heads} heads, causal={args.causal}: "
                  f"{seconds * 1e3:.1f} ms a call, {per_rank:.0f} tokens/s per rank")
            if args.ledger:
                record(args, world, seconds, per_rank, dist.get_backend(), "cuda" if cuda else "cpu")
    dist.destroy_process_group()


def record(args, world: int, seconds: float, per_rank: float, backend: str, device: str) -> None:
    from fmha.bench import ledger
    from fmha.bench.flops import attention_flops
    env = ledger.environment(device)
    flops = attention_flops(1, args.heads, args.seqlen, args.seqlen, 128, args.causal)
    ledger.append(args.ledger, [dict(
        env, gpu=f"{world}x {env['gpu']}", provider="fmha:ring_attention",
        config=f"{backend} {world} rank(s){', zigzag causal' if args.causal else ''}", dtype="bfloat16", batch=1,
        heads=args.heads, kv_heads=args.heads, seqlen_q=args.seqlen, seqlen_k=args.seqlen, head_dim=128,
        causal=int(args.causal), ms=seconds * 1e3, tflops=flops / seconds / 1e12,
        note=f"{per_rank:.0f} tokens/s per rank; eager, {args.time} calls")])


if __name__ == "__main__":
    main()
