"""Ring attention across processes: `torchrun --nproc-per-node N examples/ring_attention.py [--causal]`.

NCCL on GPUs (one per process), gloo on CPUs (set TRITON_INTERPRET=1 there); `--backend gloo`
on GPUs puts several ranks on one GPU (rank r on GPU r % device count). Every
rank builds the same random sequence, keeps its shard, runs fmha.distributed.ring_attention
and compares its output shard with single-device attention on the whole sequence.
"""
import argparse
import os

import torch
import torch.distributed as dist

import fmha
from fmha.distributed import ring_attention, zigzag_shard


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--causal", action="store_true")
    p.add_argument("--seqlen", type=int, default=4096)
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None, help="default: nccl on GPUs, else gloo")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group(args.backend or ("nccl" if cuda else "gloo"))
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local % torch.cuda.device_count()}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, args.seqlen, 128, generator=g).to(device, torch.bfloat16) for _ in range(3))
    shard = (lambda t: zigzag_shard(t, rank, world)) if args.causal else (lambda t: t.chunk(world, 2)[rank])
    out = ring_attention(shard(q), shard(k), shard(v), causal=args.causal)
    ref = shard(fmha.attention(q, k, v, causal=args.causal))
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"rank {rank}/{world}: shard {tuple(out.shape)}, relative difference to one device {err:.1e}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
