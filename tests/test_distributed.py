"""Ring attention over torch.distributed (gloo) in 2 and 4 processes, against one process: on the
CPU interpreter, or on a GPU that every rank shares (the K/V blocks then travel through host copies)."""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fmha
from conftest import DEVICE, check_against_reference, make_qkv
from fmha.distributed import zigzag_shard, zigzag_unshard

B, H, KVH, D = 1, 2, 1, 32


def _worker(rank, world, tmp, causal, layout, seqlen, uneven, device):
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    from fmha.distributed import ring_attention
    dist.init_process_group("gloo", init_method=f"file://{tmp}/rendezvous", rank=rank, world_size=world)
    try:
        q, k, v = make_qkv(B, H, KVH, seqlen, seqlen, D, torch.bfloat16, layout, device=device, seed=7)
        dim = 2 if layout == "bhsd" else 1
        if causal:
            q, k, v = (zigzag_shard(t, rank, world, layout) for t in (q, k, v))
        else:
            q, k, v = (t.chunk(world, dim)[rank] for t in (q, k, v))
        if uneven and rank == 0:
            q, k, v = (t.narrow(dim, 0, t.shape[dim] - 1) for t in (q, k, v))
        try:
            out = ring_attention(q, k, v, causal=causal, layout=layout)
            torch.save(out.cpu(), f"{tmp}/out_{rank}.pt")
        except ValueError as e:
            torch.save(str(e), f"{tmp}/out_{rank}.pt")
    finally:
        dist.destroy_process_group()


def _run(tmp_path, world, causal, layout="bhsd", seqlen=32, uneven=False):
    mp.spawn(_worker, args=(world, str(tmp_path), causal, layout, seqlen, uneven, DEVICE), nprocs=world, join=True)
    return [torch.load(f"{tmp_path}/out_{r}.pt") for r in range(world)]


@pytest.mark.parametrize("world,causal,layout", [(2, False, "bhsd"), (2, True, "bshd"), (4, True, "bhsd"),
                                                 (4, False, "bshd")])
def test_ring_attention_matches_one_device(tmp_path, world, causal, layout):
    shards = _run(tmp_path, world, causal, layout)
    dim = 2 if layout == "bhsd" else 1
    out = zigzag_unshard(shards, layout) if causal else torch.cat(shards, dim)
    q, k, v = make_qkv(B, H, KVH, 32, 32, D, torch.bfloat16, layout, device=DEVICE, seed=7)
    single = fmha.attention(q, k, v, causal=causal, layout=layout).cpu()
    torch.testing.assert_close(out, single, atol=2e-2, rtol=2e-2)
    check_against_reference(out.to(DEVICE), q, k, v, causal, layout=layout)


def test_uneven_shards_are_rejected(tmp_path):
    msgs = _run(tmp_path, 2, False, uneven=True)
    assert all(isinstance(m, str) and "same shard length on every rank, got [15, 16]" in m for m in msgs)


def test_zigzag_round_trip():
    x = torch.arange(2 * 3 * 24 * 4).reshape(2, 3, 24, 4)
    shards = [zigzag_shard(x, r, 3) for r in range(3)]
    assert torch.equal(zigzag_unshard(shards), x)
    assert torch.equal(shards[0][:, :, :4], x[:, :, :4]) and torch.equal(shards[0][:, :, 4:], x[:, :, 20:])
    with pytest.raises(ValueError, match="divisible by 2 x world size"):
        zigzag_shard(x[:, :, :23], 0, 3)
