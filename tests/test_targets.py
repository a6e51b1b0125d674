"""Ahead-of-time builds with no GPU: the instructions and resources the report claims."""
import collections
import json
import os
import re
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import triton
import triton.language as tl
from conftest import ON_GPU

from fmha import backward, configs, targets


@pytest.fixture(scope="module")
def builds():
    cache = {}

    def get(variant, target, head_dim=64, dtype="float16", causal=True):
        key = (variant, target, head_dim, dtype, causal)
        if key not in cache:
            b = targets.build(variant, target, head_dim, dtype, causal)
            cache[key] = (b, targets.report(b))
        return cache[key]
    return get


@pytest.mark.parametrize("dtype,instr", [("float16", "v_wmma_f32_16x16x16_f16"),
                                         ("bfloat16", "v_wmma_f32_16x16x16_bf16")])
@pytest.mark.parametrize("variant", ["singlewave", "pipelined"])
@pytest.mark.parametrize("head_dim", [32, 64, 80, 96, 128])
def test_seed_kernels_on_gfx1151_use_wmma_wave32_without_spills(builds, variant, head_dim, dtype, instr):
    """The seed's kernels keep m, l and the accumulator in registers for the whole key loop: no
    spills, no scratch (at D=96 and 128 the accumulator and V come in two halves of the head dimension;
    pipelined's scores wait for the next tile's Q K^T, so its K operand dies before the softmax, and with the
    causal mask, or singlewave's column masks at 96, the second half's P V waits for the first's).  Phi-2's 80 runs in
    the 128-column tile 96 runs in."""
    b, r = builds(variant, "gfx1151", head_dim, dtype)
    tile = 1 << (head_dim - 1).bit_length()  # the columns a tile holds (96: 128, the last 32 read as zeros)
    assert set(r.matrix_instructions) == {instr}
    # tile/16 WMMAs for Q K^T and tile/16 for P V per key tile, at least once each in the loop
    assert r.matrix_instructions[instr] >= tile // 8
    assert r.wave_size == 32 and b.metadata["warp_size"] == 32 and b.config["num_warps"] == 1
    assert r.spilled_registers == 0 and r.scratch_bytes == 0
    # one 16 x 16 key tile an iteration: tile/8 WMMAs (Q K^T and P V), the K and V tiles read once
    # (2 x 16 keys x tile x 2 bytes), 16 FLOP per byte read, nothing from scratch
    t = r.loop_tile
    assert t["wmma"] == tile // 8 and t["global_bytes"] == 2 * 16 * tile * 2 and t["scratch"] == 0
    assert t["flop_per_byte"] == 16.0


def test_tiled_reads_an_attn_mask_as_each_target_launches_it():
    """The builds read an attn_mask as a launch does (:func:`fmha.kernels.mask_unit`): its keys next to each other
    on sm_90 (on an H100 the stride read at run time ran a boolean mask's forward 3.2-3.9x slower), the stride at
    run time on sm_80 (whose build would spill 4876 registers at head_dim 128) and on AMD (none spilled so)."""
    import torch

    from fmha.kernels import mask_unit, tiled
    unit = {t: targets._mask_build(True, tiled.tiled_kernel, targets.TARGETS[t])[0]["MASK_UNIT"]
            for t in ("sm_90", "sm_80", "gfx1151", "gfx942")}
    assert unit == {"sm_90": True, "sm_80": False, "gfx1151": False, "gfx942": False}
    assert not mask_unit(torch.ones(1, 1, 4, 4, dtype=torch.bool), torch.ones(1, 1, 4, 8))  # no GPU: no launch
    assert not mask_unit(None, torch.ones(1))


@pytest.mark.parametrize("target", ["gfx1151", "gfx1100", "gfx942"])
@pytest.mark.parametrize("head_dim", [64, 96, 128])
def test_singlewave_with_every_modifier_builds_for_amd_without_spills(target, head_dim):
    """The seed's kernel with a window, softcap, ALiBi and the LSE at once: beside a modifier its second half's P V
    waits for the first's, as beside the causal mask (at 128 it spilled 16 registers on gfx1151 and gfx1100 without
    the wait)."""
    for causal in (False, True):
        r = targets.report(targets.build("singlewave", target, head_dim, "bfloat16", causal, modifiers=True))
        assert r.spilled_registers == 0 and r.scratch_bytes == 0, (causal, r.spilled_registers)


@pytest.mark.parametrize("target", ["gfx1151", "gfx1100"])
@pytest.mark.parametrize("head_dim,modifiers", [(96, ("window",)), (96, ("softcap",)), (96, ("alibi",)),
                                                (128, ("window",)), (128, ("softcap",)), (128, ("alibi",)),
                                                (96, ("window", "softcap", "alibi", "lse")),
                                                (128, ("window", "softcap", "alibi", "lse"))])
def test_pipelined_with_a_modifier_builds_for_rdna_without_spills(target, head_dim, modifiers):
    """The seed's pipelined kernel beside a window, softcap or ALiBi: its second half's P V waits for the first's, as
    beside the causal mask (without the wait, non-causal, 8 registers spilled in each of these on gfx1151, 16 with a
    window alone at 128), and Q K^T comes as two products over the head dimension's halves, each with its own half of
    K (with K whole, a window alone at 128 and all of them at once spill 8)."""
    for causal in (False, True):
        r = targets.report(targets.build("pipelined", target, head_dim, "float16", causal, modifiers=modifiers))
        assert r.spilled_registers == 0 and r.scratch_bytes == 0, (causal, r.spilled_registers)


def test_nvidia_and_cdna_builds(builds):
    _, sm90 = builds("tiled", "sm_90", 128, "bfloat16")
    assert any(k.startswith("wgmma.mma_async") for k in sm90.matrix_instructions)
    _, sm80 = builds("tiled", "sm_80", 128, "float16")
    assert any(k.startswith("mma.sync") for k in sm80.matrix_instructions)
    assert not any(k.startswith("wgmma") for k in sm80.matrix_instructions)
    _, cdna = builds("singlewave", "gfx942", 64, "float16")
    assert any(k.startswith("v_mfma") for k in cdna.matrix_instructions) and cdna.wave_size == 64


def test_hopper_builds_for_sm90_with_wgmma_and_tma():
    # causal: the persistent pairs' schedule, the table's 128 rows at 4k keys
    b = targets.build("hopper", "sm_90", 128, "bfloat16", True, configs.hopper_config(128, True, 4096), seqlen_k=4096)
    r = targets.report(b)
    ptx = b.asm["ptx"]
    assert any(k.startswith("wgmma.mma_async") for k in r.matrix_instructions)
    assert "cp.async.bulk.tensor.3d.shared::cluster.global" in ptx  # TMA loads of Q
    assert "cp.async.bulk.tensor.4d.shared::cluster.global" in ptx  # and of K, V: boxes of a (b, h) past seqlen_k are 0
    assert "cp.async.bulk.tensor.3d.global.shared::cta" in ptx      # the TMA store of O
    assert r.spilled_registers == 0 and r.scratch_bytes == 0
    # a seqlen_k off the key tile (the table's config for it): the ragged key mask, still no spills
    ragged = targets.build("hopper", "sm_90", 128, "bfloat16", True, configs.hopper_config(128, True, 1000),
                           seqlen_k=1000)
    assert ragged.asm["ptx"] != ptx and targets.report(ragged).spilled_registers == 0
    # 3 K/V stages at D=128: O leaves from registers (no room to stage it), still no spills
    deep = targets.build("hopper", "sm_90", 128, "bfloat16", False, configs.KernelConfig(128, 128, 4, 3))
    deep_r = targets.report(deep)
    assert "cp.async.bulk.tensor.3d.global.shared::cta" not in deep.asm["ptx"]
    assert deep_r.spilled_registers == 0 and deep_r.shared_bytes <= 232448
    # ping-pong: every consumer warpgroup waits for its turn before each of its 3 issue points
    turns, alone = (targets.build("hopper", "sm_90", 128, "bfloat16", True,
                                  configs.KernelConfig(128, 128, 4, 2, pingpong=p)) for p in (1, 0))
    assert turns.asm["ptx"].count("mbarrier.try_wait") == alone.asm["ptx"].count("mbarrier.try_wait") + 2 * 3


def _sass(cubin: bytes, tmp_path) -> str:
    """SASS through the nvdisasm that comes with triton's wheel."""
    import triton.backends.nvidia
    exe = os.path.join(os.path.dirname(triton.backends.nvidia.__file__), "bin", "nvdisasm")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    return subprocess.run([exe, "-c", str(path)], capture_output=True, text=True, check=True).stdout


def _exps_under_pv(sass: str) -> int:
    """The most exponentials between a wait for Q K^T (``DEPBAR.LE gsb0, 0x1``: P V still in
    flight) and the next wait of any kind: the softmax that overlaps the product."""
    most, count = 0, None
    for line in sass.splitlines():
        if "WARPGROUP.DEPBAR" in line:
            most = max(most, count or 0)
            count = 0 if "gsb0, 0x1" in line else None
        elif count is not None and "MUFU.EX2" in line:
            count += 1
    return most


@pytest.mark.parametrize("head_dim,causal", [(128, False), (64, True)])
def test_hopper_fence_and_q_in_registers(tmp_path, head_dim, causal):
    """``fence=1``: a key tile's 64 exponentials per thread (128 keys x 64 rows over 128 threads)
    lie between the wait for Q K^T and the wait for P V, so they overlap P V; without it ptxas
    moves the second wait above them.  ``q_regs=1``: Q K^T takes Q from registers."""
    sass = {}
    for fence, q_regs in ((0, 0), (1, 1)):
        cfg = configs.KernelConfig(128, 128, 4, 2, fence=fence, q_regs=q_regs)
        b = targets.build("hopper", "sm_90", head_dim, "bfloat16", causal, cfg, seqlen_k=4096)
        assert targets.report(b).spilled_registers == 0
        sass[fence] = _sass(b.asm["cubin"], tmp_path)
    assert _exps_under_pv(sass[1]) >= 64 > _exps_under_pv(sass[0])
    q_from_regs = re.compile(r"HGMMA\.64x128x16\.F32\.BF16 R\d+, R\d+, gdesc\[UR\d+\](?!\.tnspB)")
    assert q_from_regs.search(sass[1]) and not q_from_regs.search(sass[0])


@pytest.mark.parametrize("head_dim,causal", [(128, False), (64, True)])
def test_hopper_table_keeps_wgmma_asynchronous(head_dim, causal):
    """The table's Gluon forward at 16k keys: ptxas keeps its wgmma products asynchronous (it serializes them
    all where a product's accumulator registers are read while it may be in flight: ``ptxas_usage``)."""
    b = targets.build("hopper", "sm_90", head_dim, "bfloat16", causal, configs.hopper_config(head_dim, causal, 16384),
                      seqlen_k=16384)
    assert not targets.ptxas_usage(b.asm["ptx"], 90)["serialized"]


def test_hopper_builds_balanced_causal():
    """``balance``: the table's D=64 causal rows (128 rows with Q in registers, 192 rows) build for
    sm_90 without spills but the 192 rows' standing pivot's (:data:`HOPPER_ROWS_SPILLING`), and their programs read
    the host-built list (global loads the pairs' arithmetic alone does not make)."""
    from dataclasses import replace

    for sk in (4096, 16384):
        cfg = configs.hopper_config(64, True, sk)
        assert cfg.balance
        b = targets.build("hopper", "sm_90", 64, "bfloat16", True, cfg, seqlen_k=sk)
        assert targets.report(b).spilled_registers == HOPPER_ROWS_SPILLING.get(("bfloat16", 64, True, sk), 0)
    plain = targets.build("hopper", "sm_90", 64, "bfloat16", True, replace(cfg, balance=0), seqlen_k=sk)
    assert b.asm["ptx"].count("ld.global") > plain.asm["ptx"].count("ld.global")
    # pairs numbered across head groups (PAIRED 2): their own numbering, no more spills than the row's; head-major
    # pairs unchanged
    grouped = targets.build("hopper", "sm_90", 64, "bfloat16", True, replace(cfg, head_group=8), seqlen_k=sk)
    assert targets.report(grouped).spilled_registers == targets.report(b).spilled_registers
    assert grouped.asm["ptx"] != b.asm["ptx"]


def test_hopper_builds_clusters_with_multicast():
    """``cluster``: the sm_90 build launches 2-CTA clusters whose K/V loads are multicast (one column
    half a CTA, 32 KB expected a tile) and whose consumers also release each ring slot in the other
    CTA (``mapa`` + a cluster-scope arrive); no spills; the plain build is untouched by the pass."""
    from dataclasses import replace

    cfg = replace(configs.hopper_config(128, False, 16384), cluster=1)
    b = targets.build("hopper", "sm_90", 128, "bfloat16", False, cfg, seqlen_k=16384)
    ptx = b.asm["ptx"]
    assert b.metadata["num_ctas"] == 2 and targets.report(b).spilled_registers == 0
    loads = re.findall(r"cp\.async\.bulk\.tensor\.4d\S*", ptx)  # K and V (Q and O are 3-D, each CTA its own)
    assert loads and all(op.endswith(".multicast::cluster") for op in loads)
    assert not any(op.endswith(".multicast::cluster") for op in re.findall(r"cp\.async\.bulk\.tensor\.3d\S*", ptx))
    assert "mbarrier.arrive.expect_tx.shared.b64 _, [%r" in ptx and ", 32768;" in ptx
    assert ptx.count("mapa.shared::cluster") >= 4 and "mbarrier.arrive.shared::cluster.b64" in ptx
    assert ptx.count("barrier.cluster.wait") == 6  # each of the three partitions, at its start and its end
    # no warpgroup barrier before the 4 releases and the loop's wait of each of the 2 consumer warpgroups
    assert ptx.count("warpgroup bar.sync dropped") == 2 * 5
    plain = targets.build("hopper", "sm_90", 128, "bfloat16", False, replace(cfg, cluster=0), seqlen_k=16384)
    assert "multicast" not in plain.asm["ptx"] and "mapa" not in plain.asm["ptx"]


def test_hopper_builds_a_standing_pivot():
    """``stale``: past a key tile's first, no row max; one warpgroup vote a tile (a named-barrier
    reduction, ``bar.red``) on whether any row's sum passed 2**15, and a second Q K^T for the rare tile
    that did.  The table's cluster row, its row past 16k keys (3 stages, O from registers), a D=64 causal row
    (128 rows) and D=128 causal build it without spills, one vote per consumer warpgroup (causal, on the key tiles
    every row sees whole: beside the mask's code it spilled 57 registers at D=128); without ``stale`` there is
    none.  (192 rows at D=64, three warpgroups of 160 registers, spill 26 with it.)"""
    from dataclasses import replace

    for d, causal, sk in ((128, False, 16384), (128, False, 131072), (64, True, 4096), (128, True, 16384)):
        cfg = configs.hopper_config(d, causal, sk)
        b = targets.build("hopper", "sm_90", d, "bfloat16", causal, replace(cfg, stale=1), seqlen_k=sk)
        ptx = b.asm["ptx"]
        assert targets.report(b).spilled_registers == 0
        assert ptx.count("bar.red.or.pred") == cfg.block_m // 64
        plain = targets.build("hopper", "sm_90", d, "bfloat16", causal, replace(cfg, stale=0), seqlen_k=sk)
        assert "bar.red" not in plain.asm["ptx"]
        qk = "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
        assert ptx.count(qk) > plain.asm["ptx"].count(qk)  # the recomputed Q K^T


def test_hopper_builds_o_out_through_q():
    """``o_via_q`` at head_dim 256 and 192/128 (the table's rows: Q and two stages of K/V tiles fill shared memory,
    O has no stage of its own): O goes out by TMA from each warpgroup's Q tile (a warpgroup straddling the end still
    stores its rows from registers), each warpgroup's Q loaded apart once its own O has gone out, in the same shared
    memory; without the flag, no TMA store.  With the standing pivot (non-causal beside ping-pong, causal past 4k keys)
    one register spills: a value stored at the kernel's start and read back once, outside the key loop."""
    from dataclasses import replace

    store = "cp.async.bulk.tensor.3d.global.shared::cta"
    for causal in (False, True):
        cfg = configs.hopper_config(256, causal, 16384)
        b, plain = (targets.build("hopper", "sm_90", 256, "bfloat16", causal, replace(cfg, o_via_q=flag),
                                  seqlen_k=16384) for flag in (1, 0))
        r = targets.report(b)
        assert store in b.asm["ptx"] and store not in plain.asm["ptx"]
        assert r.spilled_registers == 1
        assert r.shared_bytes - targets.report(plain).shared_bytes <= 32  # (the warpgroups' Q barriers apart, aligned)
    # DeepSeek's 192/128 (``split_qk``): O through Q's 128-column tile, beside the 64-column one, without spills
    mla = configs.hopper_config(192, True, 4096, head_dim_v=128)
    b, plain = (targets.build("hopper", "sm_90", 192, "bfloat16", True, replace(mla, o_via_q=flag), seqlen_k=4096,
                              head_dim_v=128) for flag in (1, 0))
    assert store in b.asm["ptx"] and store not in plain.asm["ptx"]
    assert targets.report(b).spilled_registers == 0
    assert targets.report(b).shared_bytes - targets.report(plain).shared_bytes <= 32


def test_multicast_pass_reads_what_it_rewrites():
    """The PTX pass changes only marked PTX, rewrites each 4-D TMA load and each marked arrive, and
    refuses what it cannot read."""
    from fmha.kernels.hopper import multicast
    load = ("\t@%p7 cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%r306], "
            "[%rd3, {%r335, %r338, %r339, %r340}], [%r305];")
    arrive = "\t@%p25 mbarrier.arrive.shared::cta.b64 _, [%r1220];"
    assert multicast.rewrite(load + "\n" + arrive) == load + "\n" + arrive
    ptx = "\n".join([multicast.KERNEL_MARK, load, arrive, multicast.BOTH, "\tadd.s32 %r1, %r2, 8;", arrive])
    out = multicast.rewrite(ptx).split("\n")
    assert out[1].endswith("[%r305], %fmha_mc; }") and ".multicast::cluster [%r306]" in out[1]
    assert out[2] == arrive  # not marked: local
    assert ("mapa.shared::cluster.u32 %fmha_ra, %r1220, %fmha_rk; @%p25 mbarrier.arrive.shared::cta.b64 _, [%r1220]; "
            "@%p25 mbarrier.arrive.shared::cluster.b64 _, [%fmha_ra]; }") in out[5]
    sync, wait = "\tbar.sync \t2, 128;", "\tmbarrier.try_wait.parity.shared.b64 complete, [%r9], %r8;"
    ptx = "\n".join([multicast.KERNEL_MARK, load, sync, wait, multicast.UNSYNCED, sync, wait, multicast.BOTH, sync,
                     arrive, sync, arrive])
    out = multicast.rewrite(ptx).split("\n")
    assert [i for i, line in enumerate(out) if line == sync] == [2, 10]  # the unmarked wait's and arrive's stay
    assert "mapa" in out[9] and out[11] == arrive
    with pytest.raises(RuntimeError, match="no arrive|left over"):
        multicast.rewrite("\n".join([multicast.KERNEL_MARK, load, arrive, multicast.BOTH]))
    with pytest.raises(RuntimeError, match="cannot read"):
        multicast.rewrite("\n".join([multicast.KERNEL_MARK, load.replace("[%r305]", "[%r305], %rs1"), arrive]))


def test_multicast_pass_stays_in_beside_another_stages_hook(monkeypatch):
    """A stages hook set after fmha's: ``install`` (which each cluster launch calls) chains it
    inside the pass's hook again, once, and the pass still rewrites the cluster build's PTX."""
    from triton import knobs

    from fmha.kernels.hopper import multicast
    calls = []
    monkeypatch.setattr(knobs.runtime, "add_stages_inspection_hook", lambda *args: calls.append(args[-1]))
    multicast.install()
    hook = knobs.runtime.add_stages_inspection_hook
    multicast.install()
    assert knobs.runtime.add_stages_inspection_hook is hook
    load = ("\tcp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%r1], "
            "[%rd3, {%r2, %r3, %r4, %r7}], [%r5];")
    arrive = "\tmbarrier.arrive.shared::cta.b64 _, [%r6];"
    stages = {"ptx": lambda src, metadata: "\n".join([multicast.KERNEL_MARK, src, multicast.BOTH, arrive])}
    hook(None, stages, None, None, 90)
    assert calls == [90] and ".multicast::cluster [%r1]" in stages["ptx"](load, None)


@pytest.mark.parametrize("occupancy,block_n,launch,consumer", [(2, 128, 128, 232), (3, 64, 80, 136)])
def test_hopper_builds_one_warpgroup_several_programs_per_sm(occupancy, block_n, launch, consumer):
    """64 rows (one consumer warpgroup, Gluon's default partition) with ``occupancy`` programs on an SM:
    the launch register count shares the SM's 64K registers among them (two warpgroups each: the
    consumer and the producer's warp, padded), the consumer takes what the producer gives up, and the
    build has no spills and fits that many programs on the SM."""
    cfg = configs.KernelConfig(64, block_n, 4, 2, q_regs=1, occupancy=occupancy)
    b = targets.build("hopper", "sm_90", 64, "bfloat16", True, cfg, seqlen_k=512)
    r, ptx = targets.report(b), b.asm["ptx"]
    assert re.search(r"\.reqntid 256\b", ptx) and re.search(rf"\.maxnreg {launch}\b", ptx)
    assert re.search(rf"setmaxnreg\.inc\.sync\.aligned\.u32\s+{consumer};", ptx)
    assert 2 * launch - 24 == consumer and occupancy * 256 * launch <= 65536
    assert r.spilled_registers == 0 and r.occupancy["ctas_per_sm"] == occupancy


@pytest.mark.parametrize("head_dim,cfg", [(64, dict(block_m=64, block_n=64, balance=1, occupancy=3)),
                                          (128, dict(block_m=128, block_n=128, fence=1, stale=1)),
                                          (192, dict(block_m=128, block_n=128, split_qk=1))])
def test_hopper_q_in_registers_frees_its_slot_behind_a_proxy_fence(head_dim, cfg):
    """With Q in registers a consumer frees Q's shared slot right after reading it, and the next item's Q lands there
    by TMA.  The reads are the generic proxy's, the TMA write the async proxy's: the build must put
    ``fence.proxy.async`` between the reads and the arrive that frees the slot.  Without it ptxas issued the arrive
    with the reads still in flight (their registers waited on only at the first Q K^T), and on an H100 about 3% of
    thousands of short causal heads came out computed with the next item's Q
    (``tests/test_gpu.py::test_hopper_runs_many_short_items``)."""
    b = targets.build("hopper", "sm_90", head_dim, "bfloat16", True, configs.KernelConfig(**cfg, num_warps=4,
                                                                                         num_stages=2, q_regs=1))
    unfenced = _reads_released_unfenced(b.asm["ptx"])
    assert unfenced == [], unfenced


def _reads_released_unfenced(ptx: str) -> list[str]:
    """Each ``mbarrier.arrive`` of ``ptx`` that follows reads of shared memory into registers (``ldmatrix``,
    ``ld.shared``; not the byte Gluon's partitions read their state from, ``ld.shared.b8``) since the thread's last
    mbarrier wait with no ``fence.proxy.async`` after the last of them."""
    found = []
    for m in re.finditer(r"mbarrier\.arrive[^;]*;", ptx):
        window = ptx[ptx.rfind("mbarrier.try_wait", 0, m.start()):m.start()]
        reads = [r.start() for r in re.finditer(r"ldmatrix|ld\.shared(?!\.b8)", window)]
        if reads and "fence.proxy.async" not in window[reads[-1]:]:
            found.append(m.group(0))
    return found


@pytest.mark.parametrize("lengths,head_dim,causal", [("varlen", 128, True), ("seqused", 64, False),
                                                     ("paged", 128, True)])
def test_hopper_builds_lengths_per_sequence(lengths, head_dim, causal):
    """Packed sequences, per-batch key lengths and a paged cache build for sm_90 without spills;
    the producer zeroes V past a sequence's end with shared-memory stores the dense build does
    not have (and, paged, reads each key tile's page from the block table)."""
    cfg = configs.hopper_config(head_dim, causal, 4096, per_sequence=True)
    assert cfg.block_m == 128  # 192 rows would spill on the ragged mask
    dense = targets.build("hopper", "sm_90", head_dim, "bfloat16", causal, cfg, seqlen_k=1000)
    per_seq = targets.build("hopper", "sm_90", head_dim, "bfloat16", causal, cfg, seqlen_k=1000, lengths=lengths)
    r = targets.report(per_seq)
    assert r.spilled_registers == 0 and r.scratch_bytes == 0
    ptx, dense_ptx = per_seq.asm["ptx"], dense.asm["ptx"]
    assert ptx.count("st.shared") > dense_ptx.count("st.shared")
    assert ptx.count("fence.proxy.async") > dense_ptx.count("fence.proxy.async")
    if lengths == "paged":  # the block table: one more global load, for the first tile and each later one
        seqused = targets.build("hopper", "sm_90", head_dim, "bfloat16", causal, cfg, seqlen_k=1000,
                                lengths="seqused").asm["ptx"]
        assert ptx.count("ld.global") > seqused.count("ld.global")
    with pytest.raises(ValueError, match="unsupported lengths"):
        targets.build("hopper", "sm_90", head_dim, "bfloat16", causal, cfg, lengths="blocked")


def test_amd_report_agrees_with_the_code_object(builds):
    b, r = builds("tiled", "gfx1151", 128)
    meta = targets.hsaco_metadata(b.asm["hsaco"])
    asm = b.asm["amdgcn"]
    assert r.registers["vgpr"] == meta[".vgpr_count"] == int(re.search(r"; NumVgprs: (\d+)", asm).group(1))
    scratch = int(re.search(r"; ScratchSize: (\d+)", asm).group(1))
    assert r.scratch_bytes == meta[".private_segment_fixed_size"] == scratch
    assert r.shared_bytes == b.metadata["shared"]
    assert r.occupancy["waves_per_simd"] <= r.occupancy["llvm_estimate"]
    assert r.occupancy["limited_by_vgprs"] == r.occupancy["llvm_estimate"]  # LLVM's own VGPR-limited figure


def test_nvidia_report_agrees_with_ptxas(builds):
    b, r = builds("tiled", "sm_80", 64)
    usage = targets.ptxas_usage(b.asm["ptx"], 80)
    assert r.registers["per_thread"] == usage["registers"] > 0
    assert r.scratch_bytes == usage["stack_frame"]
    assert r.shared_bytes == b.metadata["shared"] > 0
    occ = r.occupancy
    per_warp = -(-r.registers["per_thread"] * 32 // 256) * 256
    assert occ["limited_by_registers"] == 65536 // (per_warp * b.config["num_warps"])


def test_key_loop_is_found(builds):
    _, r = builds("singlewave", "gfx1151", 64)
    assert any(k.startswith("global_load") or k.startswith("buffer_load") for k in r.loop_memory)
    _, r = builds("tiled", "sm_90", 64)
    assert any(k.startswith("cp.async") or k.startswith("ld.global") for k in r.loop_memory)
    assert any(k.startswith("shfl.sync") for k in r.loop_reductions)


def test_cli_report_and_errors(tmp_path):
    env = dict(os.environ)
    env.pop("TRITON_INTERPRET", None)
    run = lambda *a: subprocess.run([sys.executable, "-m", "fmha", "compile", *a], capture_output=True,  # noqa: E731
                                    text=True, env=env, timeout=600)
    out = run("--target", "gfx1151", "--variant", "singlewave", "--head-dim", "64", "--json", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    rep = json.loads(out.stdout)
    assert list(rep["matrix_instructions"]) == ["v_wmma_f32_16x16x16_f16"]
    names = {p.suffix for p in tmp_path.iterdir()}
    assert {".hsaco", ".amdgcn", ".json"} <= names
    bad = run("--target", "gfx9000", "--variant", "singlewave")
    assert bad.returncode == 2 and "unsupported target 'gfx9000'; valid: gfx1151" in bad.stderr
    bad = run("--target", "sm_90", "--variant", "fastest")
    assert bad.returncode == 2 and "unsupported variant 'fastest'; valid:" in bad.stderr
    out = run("--target", "gfx942", "--backward", "--head-dim", "64", "--dtype", "bfloat16", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    reps = json.loads(out.stdout)
    assert [r["variant"] for r in reps] == ["dkdv_kernel", "dq_kernel"]
    assert all(r["spilled_registers"] == 0 for r in reps)
    bad = run("--target", "gfx942", "--backward", "--variant", "tiled")
    assert bad.returncode == 2 and "--backward builds the backward's Triton kernels" in bad.stderr
    bad = run("--target", "gfx942")
    assert bad.returncode == 2 and "--variant is required" in bad.stderr


@pytest.mark.parametrize("head_dim", [32, 40, 80, 96, 112, 160, 192, 256])
def test_hopper_builds_every_head_dim(head_dim):
    """Head dims off 64 and 128 build for sm_90 without spills, 32 in 32-wide tiles, the others in tiles padded
    to a power of two; with Q in shared memory, Q K^T runs over the head dim's own columns (in two slices, the
    second of 16 columns at least, or over the whole tile where two would cover it).  The wgmma shapes,
    m64nNk16, counted over the build (each product's k-steps, at each of its places in the code).  96's and 112's
    causal rows (LPT-dealt rounds, the standing pivot on the tiles every row sees whole) spill none either."""
    from dataclasses import replace

    from fmha.kernels import hopper
    cfg = replace(configs.hopper_config(head_dim, True, 4096), q_regs=0)
    b = targets.build("hopper", "sm_90", head_dim, "bfloat16", True, cfg, seqlen_k=4096)
    assert targets.report(b).spilled_registers == 0
    hi, lo = hopper.qk_slices(head_dim, cfg)
    assert (hi, lo) == {32: (0, 0), 40: (32, 16), 80: (64, 16), 96: (64, 32), 112: (0, 0), 160: (128, 32),
                        192: (128, 64), 256: (0, 0)}[head_dim]
    assert hopper.qk_slices(head_dim, replace(cfg, cluster=1)) == (0, 0)  # Gluon 3.6 slices no cluster tile
    # a causal padded head dim keeps Q in shared memory; 32 is a tile of its own
    assert configs.hopper_config(head_dim, True, 4096).q_regs == (head_dim == 32)
    n = {int(re.search(r"m64n(\d+)k16", k)[1]): v for k, v in targets.report(b).matrix_instructions.items()}
    if head_dim == 32:  # Q K^T: 2 steps of 128 keys; P V: 8 of 32 columns
        assert set(n) == {128, 32} and n[32] == 4 * n[128]
    if head_dim == 96:  # Q K^T: 6 steps of 128 keys (4 of them over the first 64 columns); P V: 8 of V's 96 columns
        assert set(n) == {128, 96}
    if head_dim == 192:  # 64-key tiles; Q K^T: 12 steps of 64 keys, P V: 4 of V's 192 columns
        assert set(n) == {192, 64} and n[64] == 3 * n[192]
    if head_dim in (40, 80, 112):  # Q K^T over 128 keys; P V over V's own columns
        assert set(n) == {128, head_dim}


@pytest.mark.parametrize("head_dim", [80, 96])
def test_hopper_builds_80_and_96_in_192_by_64_tiles(head_dim):
    """Head_dim 80's and 96's long non-causal row (three consumer warpgroups at 160 registers, 64-key tiles, 3 stages)
    builds for sm_90 without spills: Q K^T over the head dim's own columns in 64-key products, P V over V's own
    columns (:mod:`fmha.kernels.hopper.narrow_pass`)."""
    cfg = configs.hopper_config(head_dim, False, 8192)
    assert cfg == configs.HOPPER_NARROW_LONG
    b = targets.build("hopper", "sm_90", head_dim, "bfloat16", False, cfg, seqlen_k=8192)
    assert targets.report(b).spilled_registers == 0
    n = {int(re.search(r"m64n(\d+)k16", k)[1]) for k in targets.report(b).matrix_instructions}
    assert n == {64, head_dim}


def test_hopper_sends_p_through_shared_memory():
    """``p_smem``: each consumer warpgroup writes P into its shared tile and P V reads its A operand from there (a
    descriptor, where P from registers is four registers a k-step), over V's own 96 columns: 96 in 192 x 128 tiles,
    FlashAttention-3's tiles there (P in registers spilled 175 registers there, in shared memory 2); without the
    flag the build reads P from registers."""
    from dataclasses import replace
    wide = re.compile(r"wgmma\.mma_async\.sync\.aligned\.m64n96k16\.f32\.bf16\.bf16 \{[^}]*\}, (\S+)")
    cfg = configs.KernelConfig(192, 128, 4, 2, fence=1, stale=1, p_smem=1)
    for flag, a_operand in ((1, r"%rd\d+,"), (0, r"\{")):
        b = targets.build("hopper", "sm_90", 96, "bfloat16", False, replace(cfg, p_smem=flag), seqlen_k=8192)
        operands = wide.findall(b.asm["ptx"])
        assert operands and all(re.match(a_operand, a) for a in operands), operands[:2]
        if flag:
            r = targets.report(b)
            assert r.spilled_registers <= 2 and r.shared_bytes <= 232448


def test_hopper_float8_takes_256_key_tiles_with_p_in_shared_memory():
    """float8 at head_dim 128 in 128 x 256 tiles (FlashAttention-3 runs 128 x 224): with P in shared memory
    (``p_smem``) the build spills nothing (P in registers beside S's 128 registers a thread: 475); Q K^T as
    ``m64n256k32``, P V as ``m64n128k32`` reading P by descriptor."""
    cfg = configs.KernelConfig(128, 256, 4, 2, fence=1, p_smem=1)
    b = targets.build("hopper", "sm_90", 128, "float8_e4m3fn", False, cfg, seqlen_k=16384)
    r = targets.report(b)
    assert r.spilled_registers == 0 and r.shared_bytes <= 232448
    assert {re.search(r"m64n(\d+)k32", k)[1] for k in r.matrix_instructions} == {"256", "128"}
    pv = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n128k32\.f32\.e4m3\.e4m3 \{[^}]*\}, (\S+)", b.asm["ptx"])
    assert pv and all(re.match(r"%rd\d+,", a) for a in pv)


def test_hopper_holds_q_and_k_of_192_unpadded():
    """``split_qk``: q/k head dim 192 held as a 128- and a 64-column tile, filled by 64-column TMA boxes, instead of
    a 256-column tile a quarter zeros: the same products (Q K^T in 12 steps of 64 keys, P V in 4 over V's 192
    columns), no spills, and shared memory as ``resources.smem_bytes`` counts it (its barriers aside), smaller than
    the padded tiles' by their zero columns, or O staged beside them where it now fits."""
    from dataclasses import replace

    from fmha.kernels.hopper import resources
    padded = configs.hopper_config(192, True, 4096)
    split = replace(padded, split_qk=1)
    b, p = (targets.build("hopper", "sm_90", 192, "bfloat16", True, c, seqlen_k=4096) for c in (split, padded))
    assert targets.report(b).spilled_registers == 0
    n = {int(re.search(r"m64n(\d+)k16", k)[1]): v for k, v in targets.report(b).matrix_instructions.items()}
    assert set(n) == {192, 64} and n[64] == 3 * n[192]
    for build, cfg in ((b, split), (p, padded)):
        assert 0 <= build.metadata["shared"] - resources.smem_bytes(192, cfg) < 1024
    zeros = 2 * 64 * (padded.block_m + padded.num_stages * padded.block_n)  # the padded tiles' zero columns
    staged = 2 * padded.block_m * 256 if resources.o_staged(192, split) else 0
    assert resources.smem_bytes(192, split) == resources.smem_bytes(192, padded) - zeros + staged
    # DeepSeek's 192/128 in 128-key tiles, two stages (the table's row): what the padded tiles cannot hold
    mla = configs.hopper_config(192, True, 4096, head_dim_v=128)
    assert (mla.block_m, mla.block_n, mla.num_stages, mla.split_qk) == (split.block_m, 128, split.num_stages, 1)
    assert resources.smem_bytes(192, replace(mla, split_qk=0), 128) > resources.SMEM_LIMIT
    b = targets.build("hopper", "sm_90", 192, "bfloat16", True, mla, seqlen_k=4096, head_dim_v=128)
    assert targets.report(b).spilled_registers == 0
    assert 0 <= b.metadata["shared"] - resources.smem_bytes(192, mla, 128) < 1024
    # with ``q_regs`` both of Q's tiles sit in registers: every product takes its A operand from there (P V's
    # always do, Q K^T's then too), still without spills
    in_regs = [targets.build("hopper", "sm_90", 192, "bfloat16", True, c, seqlen_k=4096, head_dim_v=128)
               for c in (mla, replace(mla, q_regs=1))]
    a_from_regs = [[bool(re.search(r"\},\s*\{", line)) for line in x.asm["ptx"].splitlines()
                    if "wgmma.mma_async" in line] for x in in_regs]
    assert not all(a_from_regs[0]) and any(a_from_regs[0]) and all(a_from_regs[1])
    assert targets.report(in_regs[1]).spilled_registers == 0


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp8_builds_for_sm90_on_tiled(head_dim):
    """``fmha compile --dtype float8_e4m3fn``: the tiled kernel reads float8 q/k/v, converts them to 16 bits
    for the matrix unit and writes bfloat16, with its float8 table entry: no spills.  Besides ``hopper``
    (below), nothing else builds it."""
    b = targets.build("tiled", "sm_90", head_dim, "float8_e4m3fn", True)
    r = targets.report(b)
    assert b.config["block_n"] == 64 and r.spilled_registers == 0
    ptx = b.asm["ptx"]
    assert "e4m3x2" in ptx and any(k.startswith("wgmma") for k in r.matrix_instructions)
    for variant, target, says in (("singlewave", "sm_90", "float8 runs on the tiled variant"),
                                  ("tiled", "sm_80", "builds for sm_90"), ("tiled", "gfx942", "builds for sm_90")):
        with pytest.raises(ValueError, match=says):
            targets.build(variant, target, head_dim, "float8_e4m3fn", True)


@pytest.mark.parametrize("head_dim,causal,seqlen_k", [(128, False, 0), (96, True, 0), (64, False, 0),
                                                    (64, False, 4096), (64, True, 4096)])
def test_fp8_builds_for_sm90_on_hopper(head_dim, causal, seqlen_k):
    """``fmha compile --variant hopper --dtype float8_e4m3fn``: both products on wgmma's float8 form (K 32 a
    step: Q K^T over head_dim, P V over the 128-key tile with V^T K-major), P rounded to float8 in registers,
    O written bfloat16 (P V's operand reordered in registers, not exchanged, and packed as it is narrowed); its float8
    table entry (without a length, the one of a key tile; at 64 past 1k keys, 192 rows in turns); no spills."""
    cfg = configs.hopper_config(head_dim, causal, seqlen_k, fp8=True)
    if seqlen_k:
        b = targets.build("hopper", "sm_90", head_dim, "float8_e4m3fn", causal, cfg, seqlen_k=seqlen_k)
    else:
        b = targets.build("hopper", "sm_90", head_dim, "float8_e4m3fn", causal)
    r = targets.report(b)
    assert b.config == cfg.as_dict() and r.spilled_registers == 0
    # Q K^T over 128 keys; P V over V's own head dim (96 in a 128-column tile: :mod:`fmha.kernels.hopper.narrow_pass`)
    width = head_dim
    shapes = {f"wgmma.mma_async.sync.aligned.m64n{n}k32.f32.e4m3.e4m3" for n in (128, width)}
    assert set(r.matrix_instructions) == shapes
    assert "cvt.rn.satfinite.e4m3x2.f32" in b.asm["ptx"]
    usage = targets.ptxas_usage(b.asm["ptx"], 90)
    assert usage["spill_stores"] == 0 and not usage["serialized"], usage
    # P reordered to the float8 A operand's layout in each thread's own registers: no more shuffles than bf16's;
    # and packed four values a register as it is narrowed, carried as float32 across the loop, so no byte of it
    # is moved on its own (a float8 P carried by the loop crossed it one byte a value: 192 byte permutes)
    bf16 = targets.build("hopper", "sm_90", head_dim, "bfloat16", causal, config=cfg)
    for op in ("shfl.sync", "prmt.b32"):
        assert b.asm["ptx"].count(op) <= bf16.asm["ptx"].count(op), op


def test_fp8_on_hopper_refuses_the_head_dims_it_does_not_take():
    """float8 on hopper off its 64- and 128-column tiles (64, 96 and 128): a refusal by name before any build."""
    for d in (32, 80, 192, 256):
        with pytest.raises(ValueError, match=f"float8 on hopper takes head_dim 64, 96 or 128 .*not {d}"):
            targets.build("hopper", "sm_90", d, "float8_e4m3fn", False)
    from fmha.configs import KernelConfig
    for cfg, says in ((KernelConfig(128, 128, 4, 2, q_regs=1), "without clusters, pieces or Q in registers"),
                      (KernelConfig(128, 128, 4, 2, stale=1), "no standing pivot")):  # as the plan refuses them
        with pytest.raises((ValueError, RuntimeError), match=says):
            targets.build("hopper", "sm_90", 128, "float8_e4m3fn", False, cfg)


def test_fp8_tiles_count_one_byte_an_element():
    """The float8 kernel's shared memory as ``resources.smem_bytes`` counts it with one-byte Q, K and V^T tiles
    (O staged in bf16), so deeper rings that fit are taken (counted as 16-bit tiles, 4 stages read 288 KB and
    were refused)."""
    from fmha.configs import KernelConfig
    from fmha.kernels.hopper import resources
    for stages in (2, 4):
        cfg = KernelConfig(128, 128, 4, stages)
        b = targets.build("hopper", "sm_90", 128, "float8_e4m3fn", False, cfg, seqlen_k=4096)
        assert 0 <= b.metadata["shared"] - resources.smem_bytes(128, cfg, None, 1) < 1024
        assert resources.o_staged(128, cfg, None, 1)
        assert resources.smem_bytes(128, cfg, None, 1) + resources.SMEM_SPARE <= resources.SMEM_LIMIT
    assert resources.smem_bytes(128, KernelConfig(128, 128, 4, 4)) + resources.SMEM_SPARE > resources.SMEM_LIMIT


@pytest.mark.parametrize("target,load", [("sm_90", "ld.global.b8"), ("gfx942", "global_load_ubyte")])
def test_backward_kernels_build_with_an_attn_mask(target, load):
    """The portable backward built to read an attn_mask (its keys one byte apart): the mask's bytes loaded in the
    dK/dV kernel, and in none of the build without it."""
    with_mask, without = (targets.build_backward_kernels(target, 64, "bfloat16", True, False, attn_mask=m)
                          for m in (True, False))
    asm = [b.asm.get("ptx") or b.asm["amdgcn"] for b in (*with_mask, *without)]
    assert load in asm[0] and not any(load in a for a in asm[len(with_mask):])


def _built_apart(code: str):
    """What ``code`` prints last as JSON, run in a child process with the interpreter off (builds whose tiles it
    swaps, as the sweeps swap them)."""
    run = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="0"),
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_backward_column_halves_build_for_sm90_in_its_shared_memory():
    """The dK/dV kernel at head_dim 256 as the table takes it on sm_90, its columns in halves (``HALVES``): the build
    takes a half's columns (two 64 x 128 float32 accumulators, not 64 x 256), fits sm_90's shared memory, and spills
    less than the whole rows' build in one stage (64 x 64 in eight warps).  Built in a child process with the
    interpreter off, the whole rows' tiles swapped in there as ``bench/backward_tiles.py`` swaps them."""
    code = ("import json; from fmha import targets, backward\n"
            "out = {}\n"
            "table = backward.tiles\n"
            "for halves in (False, True):\n"
            "    backward.tiles = table if halves else lambda *a, **k: (backward._t(64, 64, 8, 1), None)\n"
            "    b, = targets.build_backward_kernels('sm_90', 256, 'bfloat16', True, False)\n"
            "    r = targets.report(b)\n"
            "    out[int(halves)] = [r.shared_bytes, r.spilled_registers]\n"
            "print(json.dumps(out))")
    got = _built_apart(code)
    from fmha.kernels.hopper.resources import SMEM_LIMIT
    (_, whole_spills), (shared, spills) = got["0"], got["1"]
    assert backward.tiles(256, True, False)[0].get("HALVES")
    assert not backward.tiles(192, True, False, head_dim_v=128)[0].get("HALVES")  # dV 128 wide: whole rows
    assert shared <= SMEM_LIMIT and spills < whole_spills, got


@pytest.mark.parametrize("target,mul_hi", [("sm_90", "mul.hi.u32"), ("sm_80", "mul.hi.u32"),
                                            ("gfx1151", "v_mul_hi_u32"), ("gfx942", "v_mul_hi_u32")])
def test_dropout_builds_draw_philox_only_where_asked(target, mul_hi):
    """Attention dropout's builds (``tiled``'s forward, the portable backward's kernels) compile for the target and
    draw Philox's rounds (their 32-bit high multiplies); the builds without it have none.  With it the forward keeps
    every value in registers, in its dropout tiles (:data:`fmha.configs.TILED_DROPOUT`; in the plain table's, sm_90's
    spilled 173-187 registers at head_dim 128 and sm_80's 189), and so do the backward's kernels on the seed's chip, on
    sm_80 (whose dQ kernel spilled 147 in the plain table's 128 x 64 tiles) and on gfx942 (in the masked rows: its
    dK/dV kernel spilled 22-25 registers at 128 in the plain ones, :data:`fmha.backward.AMD_TILES_MASKED`)."""
    for dropout in (False, True):
        fwd = targets.build("tiled", target, 128, "bfloat16", True, dropout=dropout)
        bwd = targets.build_backward_kernels(target, 128, "bfloat16", False, dropout=dropout)
        for b in (fwd, *bwd):
            assert (mul_hi in (b.asm.get("ptx") or b.asm["amdgcn"])) == dropout, (b.variant, dropout)
            if dropout and (b is fwd or target != "sm_90"):
                assert targets.report(b).spilled_registers == 0, b.variant


@pytest.mark.parametrize("mask,load", [(True, "global_load_u8"), ("bias", "global_load_b32")])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_tiled_reads_an_attn_mask_on_gfx1151_without_spills(mask, load, head_dim):
    """The seed's chip: ``tiled`` (causal) beside a boolean mask (its bytes) or a float32 bias keeps every value in
    registers.  The mask's key stride is read at run time on AMD (``MASK_UNIT`` off): known to be 1, the build
    spilled 264 and 34 registers (and 189-294 on sm_90, which takes it for its speed); the bias spilled none
    either way."""
    b = targets.build("tiled", "gfx1151", head_dim, "bfloat16", True, attn_mask=mask)
    r = targets.report(b)
    assert r.spilled_registers == 0 and r.scratch_bytes == 0
    assert load in b.asm["amdgcn"]


@pytest.mark.parametrize("target", ["gfx1151", "gfx942"])
@pytest.mark.parametrize("head_dim", [192, 256])
def test_tiled_past_head_dim_128_builds_for_amd_without_spills(target, head_dim):
    """``tiled`` past head_dim 128 on AMD (the table's row, and on gfx1151 a decode's 16 and 32 rows), dense, beside
    a boolean mask or a float32 bias and over a paged cache: Q K^T over 16 column chunks keeps every value in
    registers (Q held whole, gfx1151 spilled 62-116 registers in all but the dense build)."""
    decode = (configs.amd_decode_config(16, head_dim), configs.amd_decode_config(32, head_dim))
    for cfg in (configs.tiled_config("hip", head_dim), *(decode if target == "gfx1151" else ())):
        assert cfg.qk_chunks == 16
        for lengths, mask in (("dense", False), ("dense", True), ("dense", "bias"), ("paged", False)):
            r = targets.report(targets.build("tiled", target, head_dim, "bfloat16", True, cfg, lengths=lengths,
                                             attn_mask=mask))
            assert r.spilled_registers == 0 and r.scratch_bytes == 0, (cfg, lengths, mask, r.spilled_registers)


@pytest.mark.parametrize("head_dim,causal,deterministic", [(64, False, False), (128, True, False), (96, False, False),
                                                          (64, True, True), (128, False, True)])
def test_hopper_backward_builds_with_tma_reduce_adds(head_dim, causal, deterministic):
    """The Gluon backward for sm_90: its dQ tiles leave as TMA reduce-adds (the PTX pass), no plain TMA
    store is left, dK/dV/S/dP run on wgmma; at head_dim 64 (128-row tiles) P^T and dS^T go to dV's and dK's
    products from registers, S^T and dP^T start from the statistics, and ptxas spills a few registers (holding
    the statistics through the tile, 752-792 bytes); at 128 the two 64x128 float32 accumulators leave ptxas a
    few registers short (P and dS go through shared memory): bounded spills, ledgered speed; ptxas keeps the
    products asynchronous (a dK product left in flight across tiles made it serialize them all).  Deterministic,
    each add waits for its turn (an acquiring load of the tile's counter) and is counted once complete (a
    releasing add).  Each tile's LSEs and deltas come by TMA with its Q and dO (two-dimensional boxes), so the
    walk loads nothing from global memory itself (loaded there, the statistics cost head_dim 128 5-12%)."""
    from fmha.kernels.hopper import reduce_pass
    ptx = targets.build_hopper_backward(head_dim, "bfloat16", causal, deterministic).asm["ptx"]
    assert len(re.findall(r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global", ptx)) == 2
    assert not re.search(r"\bld\.global\b", ptx), "the walk loads from global memory"
    assert ("ld.acquire.gpu.global" in ptx, "red.release.gpu.global.add" in ptx) == (deterministic, deterministic)
    assert reduce_pass.KERNEL_MARK in ptx
    assert len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.3d\.global\.shared::cta\.add\.tile", ptx)) == 2
    assert not re.search(r"cp\.async\.bulk\.tensor\.\dd\.global\.shared::cta", ptx)
    assert "wgmma.mma_async" in ptx
    usage = targets.ptxas_usage(ptx, 90)
    assert usage["spill_stores"] <= (128 if head_dim == 64 else 512), usage
    assert not usage["serialized"], "ptxas waits for each wgmma before the next"
    # 64-wide tiles: dV's and dK's A operands (P^T, dS^T) from registers (32 wgmma instructions over a 128-row
    # tile, both warpgroups)
    from_regs = len(re.findall(r"wgmma\.mma_async[^;]*\{[^}]*\}, \{%r", ptx))
    assert from_regs == (32 if head_dim == 64 else 0), from_regs


@pytest.mark.parametrize("causal,deterministic,flags", [
    (False, False, {}), (True, False, {}), (True, True, {}), (True, False, dict(window=True, ragged=True)),
    (True, False, dict(varlen=True)), (True, False, dict(head_dim_v=128)), (True, False, dict(softcap=True)),
    (True, True, dict(alibi=True, window=True, ragged=True))])
def test_hopper_backward_builds_past_head_dim_128_in_column_halves(causal, deterministic, flags):
    """At head_dim 256 the Gluon backward takes 64-key blocks, each warpgroup holding dK's and dV's column half over
    every key (two 64 x 128 float32 accumulators, wgmma's m64n128 over the block's P^T and dS^T) beside its 32 keys'
    S and dP (m64n32 over all 256 columns); its dQ half leaves as two 64-column TMA reduce-adds, both warpgroups' four;
    one stage fits sm_90's shared memory; and with the products' descriptors made in the walk, ptxas spills at most
    56 bytes (hoisted out of it, 420-1456).  With V 128 wide, V and dO in 128-wide tiles and two stages of Q and dO.
    Gemma 2's softcap and ALiBi (its slope the one load from global memory a warpgroup makes) fit the same budget."""
    from fmha.kernels.hopper.resources import SMEM_LIMIT
    b = targets.build_hopper_backward(256, "bfloat16", causal, deterministic, **flags)
    ptx = b.asm["ptx"]
    assert len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.3d\.global\.shared::cta\.add\.tile", ptx)) == 4
    assert len(re.findall(r"\bld\.global\b", ptx)) <= (12 if flags.get("varlen") else 2 if flags.get("alibi") else 0)
    shapes = set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", ptx))
    assert shapes == {"m64n32k16", "m64n128k16", "m64n64k16"}, shapes
    stages = 2 if flags.get("head_dim_v") else 1  # (V and dO in 128-wide tiles: two stages fit)
    assert b.metadata["shared"] <= SMEM_LIMIT and b.config["block_n"] == 64 and b.config["num_stages"] == stages
    usage = targets.ptxas_usage(ptx, 90)
    assert usage["spill_stores"] <= 64 and not usage["serialized"], usage


@pytest.mark.parametrize("head_dim_v,products", [(128, {"m64n32k16": 40, "m64n128k16": 4, "m64n64k16": 24}),
                                                  (0, {"m64n32k16": 48, "m64n128k16": 8, "m64n64k16": 20})])
def test_hopper_backward_multiplies_the_columns_that_exist(head_dim_v, products):
    """At head_dim 192 in 256-column tiles (DeepSeek-V3's 192/128, and 192 with V's the same) the products read 192
    columns of Q and K (128 and 64, in two products each) and V's 128 (or 192), not TMA's zeros past them: S's and dP's
    16-deep steps are 12 and 8 (or 12), not 16 each; dK's, dV's and dQ's columns are shared so that each warpgroup
    multiplies as much (dK 128 + 64 columns, dQ's 64-column pieces one + two, three reduce-adds where 256 has four).
    wgmma instructions of both warpgroups, counted by shape, and ptxas's spills."""
    b = targets.build_hopper_backward(192, "bfloat16", True, False, head_dim_v=head_dim_v)
    ptx = b.asm["ptx"]
    found = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", ptx))
    assert found == products, found
    assert len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.3d\.global\.shared::cta\.add\.tile", ptx)) == 3
    assert b.config["num_stages"] == (2 if head_dim_v else 1)  # V 128 wide: V and dO in 128-wide tiles, two stages
    usage = targets.ptxas_usage(ptx, 90)
    assert usage["spill_stores"] <= 64 and not usage["serialized"], usage


@pytest.mark.parametrize("head_dim,head_dim_v,causal,products", [
    (96, 0, True, {"m64n64k16": 32, "m64n96k16": 16, "m64n32k16": 8}),
    (80, 0, False, {"m64n64k16": 28, "m64n80k16": 16, "m64n16k16": 8}),
    (112, 0, True, {"m64n64k16": 36, "m64n112k16": 16, "m64n48k16": 8}),
    (128, 64, True, {"m64n64k16": 48, "m64n128k16": 8}),
    (32, 0, True, {"m64n128k16": 8, "m64n32k16": 48}),
    (48, 0, False, {"m64n128k16": 12, "m64n48k16": 48}),
    (160, 0, True, {"m64n32k16": 40, "m64n128k16": 8, "m64n64k16": 20}),
])
def test_hopper_backward_multiplies_head_dims_off_the_tile(head_dim, head_dim_v, causal, products):
    """A head dim padded to its tile's power of two (96 and 80 in 128, 32 and 48 in 64, 160 in 256) multiplies its
    own columns, not TMA's zeros past them: S's and dP's reductions in 16-column steps of the real ones (96: 64 + 32,
    80: 64 + 16; 32 and 48 in S^T's form, their m64n128 steps 2 and 3 a product where the tile's are 4), dK and dV
    over them in one narrower wgmma (m64n96, m64n80; dV over V's 64 at 128/64), and the second warpgroup's dQ over
    the columns of its half that exist (m64n32 at 96, m64n16 at 80); past 128, S and dP over 128 + 32 at 160.  wgmma
    instructions of both warpgroups, counted by shape; ptxas spills at most 128 bytes, or as much as the tile's own
    head dim."""
    from fmha.kernels.hopper.backward import tile_width
    b = targets.build_hopper_backward(head_dim, "bfloat16", causal, head_dim_v=head_dim_v)
    ptx = b.asm["ptx"]
    found = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k16)", ptx))
    assert found == products, found
    usage = targets.ptxas_usage(ptx, 90)
    tile = targets.build_hopper_backward(tile_width(head_dim), "bfloat16", causal).asm["ptx"]
    assert usage["spill_stores"] <= max(targets.ptxas_usage(tile, 90)["spill_stores"], 128), usage
    assert not usage["serialized"], usage


def test_hopper_backward_can_free_q_and_do_while_dq_runs():
    """``Tiles.early_free`` at head_dim 256: the consumers wait for dV's and dK's products with dQ's first piece still
    in flight (one more ``wgmma.wait_group 1`` a warpgroup) and free Q's and dO's stage there, the P/dS buffer on a
    barrier of its own (one more mbarrier); the build spills no more than without.  The table's choice past head_dim
    128, not at 128 and below.  Built in a child process with the interpreter off and the tiles swapped there, as
    ``bench/backward_kernels.py --providers gluon-early`` swaps them."""
    from fmha.kernels.hopper import backward as hopper
    assert hopper.tiles(256).early_free and hopper.tiles(192).early_free and not hopper.tiles(128).early_free
    code = ("import json, re; from fmha import targets; from fmha.kernels.hopper import backward as hopper\n"
            "table = hopper.tiles\n"
            "out = []\n"
            "for early in (False, True):\n"
            "    hopper.tiles = lambda head, det=False, dv=0, e=early: table(head, det, dv)._replace(early_free=e)\n"
            "    ptx = targets.build_hopper_backward(256, 'bfloat16', True).asm['ptx']\n"
            "    out.append([len(re.findall(r'wgmma\\.wait_group\\.sync\\.aligned\\s+1;', ptx)),\n"
            "                len(re.findall(r'mbarrier\\.init', ptx)), targets.ptxas_usage(ptx, 90)['spill_stores']])\n"
            "print(json.dumps(out))")
    (waits, inits, spills), (waits_early, inits_early, spills_early) = _built_apart(code)
    assert waits_early == waits + 2 and inits_early > inits and spills_early <= spills


def test_the_hopper_backward_deals_key_blocks_as_its_walks_need():
    """Not deterministic: one program an SM (fewer when the blocks are fewer), each walking blocks in turn: even
    walks (dense, without causal) in a fixed deal, uneven ones (causal, packed) from a counter as programs free.
    Deterministic: one program a block (its turns need the blocks to start in order)."""
    from fmha.kernels.hopper.backward import schedule
    assert schedule(2048, 132, causal=False, packed=False, deterministic=False) == (132, False)
    assert schedule(100, 132, causal=False, packed=False, deterministic=False) == (100, False)
    assert schedule(2048, 132, causal=True, packed=False, deterministic=False) == (132, True)
    assert schedule(2048, 132, causal=False, packed=True, deterministic=False) == (132, True)
    for causal, packed in [(False, False), (True, False), (False, True)]:
        assert schedule(2048, 132, causal, packed, deterministic=True) == (2048, False)


def test_hopper_backward_takes_uneven_walks_from_a_counter():
    """The causal build takes its next key block with one relaxed atomic add by the producer's first thread (read by
    its warp), and counts its program out with an acquire-release add; the dense and the deterministic builds take
    none."""
    ptx = targets.build_hopper_backward(64, "bfloat16", causal=True).asm["ptx"]
    assert len(re.findall(r"atom\.relaxed\.gpu\.global\.add\.u32", ptx)) == 1
    assert len(re.findall(r"atom\.acq_rel\.gpu\.global\.add\.u32", ptx)) == 1
    for causal, deterministic in [(False, False), (True, True)]:
        ptx = targets.build_hopper_backward(64, "bfloat16", causal=causal, deterministic=deterministic).asm["ptx"]
        assert not re.search(r"atom\.(relaxed|acq_rel)\.gpu\.global\.add\.u32", ptx)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_hopper_backward_builds_for_a_window_and_a_ragged_key_count(head_dim):
    """The masks of a sliding window's lower edge and of the keys past a seqlen_k off the 128-key block build into
    the same kernel: its dQ tiles still leave as reduce-adds, the walk loads nothing from global memory, and
    ptxas spills no more than the causal build's bound."""
    ptx = targets.build_hopper_backward(head_dim, "bfloat16", causal=True, window=True, ragged=True).asm["ptx"]
    assert len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.3d\.global\.shared::cta\.add\.tile", ptx)) == 2
    assert not re.search(r"\bld\.global\b", ptx), "the walk loads from global memory"
    usage = targets.ptxas_usage(ptx, 90)
    assert usage["spill_stores"] <= (128 if head_dim == 64 else 512), usage
    assert not usage["serialized"], "ptxas waits for each wgmma before the next"



@triton.jit
def _adds_a_quotient(X, n):
    x = tl.arange(0, 16)
    tl.store(X + x, x + tl.cdiv(n, 4))


@pytest.mark.skipif(ON_GPU, reason="guards the interpreter's process")
def test_a_gluon_build_after_an_interpreted_kernel_still_compiles(tmp_path, monkeypatch):
    """An interpreted kernel that calls ``tl.cdiv`` leaves ``triton.language.core``'s builtins patched in its
    process (Triton 3.6); a backward built there with a cold cache (so its front end runs) still compiles: the
    build runs in a process of its own."""
    out = torch.zeros(16, dtype=torch.int32)
    _adds_a_quotient[(1,)](out, 5)
    assert out.tolist() == [i + 2 for i in range(16)]
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    ptx = targets.build_hopper_backward(64, "bfloat16", causal=True, window=True, ragged=True).asm["ptx"]
    assert "wgmma.mma_async" in ptx


def test_reduce_pass_rewrites_only_marked_stores():
    from fmha.kernels.hopper import reduce_pass
    store = "\t@%p3 cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%rd1, {%r1, %r2, %r3}], [%r4];"
    assert reduce_pass.rewrite(store) == store  # no marker: another kernel's PTX
    out = reduce_pass.rewrite("\n".join([reduce_pass.KERNEL_MARK, store]))
    assert out.split("\n")[1] == ("\t@%p3 cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group "
                                  "[%rd1, {%r1, %r2, %r3}], [%r4];")
    with pytest.raises(RuntimeError, match="without a TMA store"):
        reduce_pass.rewrite(reduce_pass.KERNEL_MARK)
    with pytest.raises(RuntimeError, match="cannot read"):
        reduce_pass.rewrite("\n".join([reduce_pass.KERNEL_MARK, store.replace("];", "], %rd9;")]))


def test_narrow_pass_narrows_only_marked_products():
    """Between a pair of marks each wgmma takes the marked width and the first width / 2 accumulator registers
    (four a thread per 8 columns); a wgmma outside the marks, or PTX with none, stays; what it cannot read, or
    cannot narrow, raises."""
    from fmha.kernels.hopper import narrow_pass
    acc = ",".join(f"%r{i}" for i in range(100, 164))
    pv = (f"\t@%p4 wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{{acc}}}, {{%r1,%r2,%r3,%r4}}, %rd7, %p5, "
          "1, 1, 1;")
    begin, end = (narrow_pass.mark(96).split("\n")[0], narrow_pass.mark(0).split("\n")[0])
    assert narrow_pass.rewrite(pv) == pv
    out = narrow_pass.rewrite("\n".join([pv, begin, pv, pv, end, pv])).split("\n")
    assert out[0] == out[5] == pv
    kept = ",".join(f"%r{i}" for i in range(100, 148))
    assert out[2] == out[3] == (f"\t@%p4 wgmma.mma_async.sync.aligned.m64n96k16.f32.bf16.bf16 {{{kept}}}, "
                                "{%r1,%r2,%r3,%r4}, %rd7, %p5, 1, 1, 1;")
    assert [narrow_pass.width(dv, tile) for dv, tile in ((96, 128), (192, 256), (128, 128), (100, 128))] == \
        [96, 192, 0, 104]
    with pytest.raises(RuntimeError, match="left open"):
        narrow_pass.rewrite("\n".join([begin, pv]))
    with pytest.raises(RuntimeError, match="nothing between"):
        narrow_pass.rewrite("\n".join([begin, end]))
    with pytest.raises(RuntimeError, match="to 96"):
        narrow_pass.rewrite("\n".join([begin, pv.replace("m64n128", "m64n64"), end]))
    with pytest.raises(RuntimeError, match="cannot read"):
        narrow_pass.rewrite("\n".join([begin, pv.replace(".sync.aligned", ".sp.sync.aligned"), end]))


def test_mla_absorbed_decode_builds_for_sm90_on_tiled():
    """``fmha compile --variant tiled --head-dim 576``: MLA's absorbed decode (Q K^T in two slices, 512 + 64
    columns; V K's first 512, read once; keys split, GQA rows packed) with its table entry: no spills, on
    mma.sync (32 rows a block are below wgmma's 64).  Only ``tiled`` takes 576."""
    b = targets.build("tiled", "sm_90", 576, "bfloat16", True)
    r = targets.report(b)
    assert (b.config["block_m"], b.config["block_n"], b.config["num_warps"]) == (32, 32, 8)
    assert r.spilled_registers == 0 and any(k.startswith("mma.sync") for k in r.matrix_instructions)  # 32 rows
    with pytest.raises(ValueError, match="head_dim"):
        targets.build("hopper", "sm_90", 576, "bfloat16", True)


@pytest.mark.parametrize("lengths,rows,self_checked", [("paged", 16, True), ("varlen", 16, True),
                                                     ("paged", 64, False)])
def test_tiled_checks_its_own_indices_only_where_its_tiles_stay_off_wgmma(lengths, rows, self_checked, monkeypatch):
    """``tiled`` checking its own cu_seqlens or block table (asserts compiled in) on sm_90: in 16-row tiles
    (mma.sync) it builds as without the checks, no spills; in 64-row tiles the assert's call makes ptxas
    serialize every wgmma, which is why :func:`fmha.forward.self_checked` keeps those tiles, and other GPUs
    (not timed), to the separate check; as it keeps a grid split over launches (each would check its own
    sequences alone)."""
    from fmha import forward
    from fmha.configs import KernelConfig
    from fmha.plan import Plan, problem
    cfg = KernelConfig(rows, 64, 4, 3)
    plain, checked = (targets.build("tiled", "sm_90", 128, "bfloat16", config=cfg, lengths=lengths, checked=c)
                      for c in (False, True))
    usage = {c: targets.ptxas_usage(b.asm["ptx"], 90) for c, b in ((False, plain), (True, checked))}
    assert "__assertfail" in checked.asm["ptx"] and "__assertfail" not in plain.asm["ptx"]
    assert usage[True]["spill_stores"] == usage[False]["spill_stores"] == 0
    assert not usage[False]["serialized"]
    assert usage[True]["serialized"] == (rows >= 64)
    q = SimpleNamespace(is_cuda=True, device=torch.device("cuda", 0))  # (a stand-in: the decision reads no tensor)
    prob = problem(4, 32, 8, 1, 4096, 128, causal=False, scale=None, seqused=True)
    for major in (9, 8, 10):
        monkeypatch.setattr(forward, "device_facts", lambda index: (major, 132))
        assert forward.self_checked(Plan("tiled", cfg, prob), q) == (self_checked and major == 9)
        assert not forward.self_checked(Plan("hopper", cfg, prob), q)
    many = problem(3000, 32, 32, 1, 4096, 128, causal=False, scale=None, seqused=True)  # 96000 (batch, head)s
    assert not forward.self_checked(Plan("tiled", cfg, many), q)
    with pytest.raises(ValueError, match="checks its own cu_seqlens"):
        targets.build("tiled", "sm_90", 128, "bfloat16", lengths="dense", checked=True)


@pytest.mark.parametrize("target", ["gfx942", "gfx1100", "gfx1151"])
def test_mla_absorbed_decode_builds_for_amd_without_spills(target):
    """The absorbed form on AMD: the ``hip`` row (16-key tiles, Q K^T batched over 16 column chunks of the latent,
    ``qk_chunks``) builds for CDNA (gfx942) and RDNA (gfx1100, gfx1151) with no spills, where the same tiles with
    Q's 576 columns held whole by every warp spill on RDNA and the NVIDIA row's 32-key tiles on CDNA; the decode
    config keeps it (a few query rows, the keys split)."""
    from dataclasses import replace
    b = targets.build("tiled", target, 576, "bfloat16", True)
    assert b.config == configs.mla_config("hip").as_dict() and targets.report(b).spilled_registers == 0
    held = replace(configs.mla_config("hip"), qk_chunks=0)
    other = configs.mla_config("sm90") if target == "gfx942" else held
    assert targets.report(targets.build("tiled", target, 576, "bfloat16", True, other)).spilled_registers > 0
    decode = configs.decode_config(16, 8192, 576, "hip")
    assert (decode.block_n, decode.num_warps, decode.split_per_sm, decode.qk_chunks) == (16, 16, 1, 16)
    assert configs.decode_config(16, 8192, 576).block_n == configs.mla_config("sm90").block_n


@pytest.mark.parametrize("target,matrix", [("gfx942", "v_mfma"), ("gfx1151", "v_wmma")])
@pytest.mark.parametrize("head_dim,causal", [(64, False), (64, True), (128, False), (128, True), (256, False),
                                             (256, True)])
def test_backward_kernels_build_for_amd_within_their_registers(target, matrix, head_dim, causal):
    """The portable backward's kernels with the AMD tables' tiles (:data:`fmha.backward.AMD_TILES`) use the
    matrix unit and keep their values in registers on gfx942 (CDNA) and gfx1151 (RDNA), at head_dim 128 and 256 on
    RDNA with S and dP over column chunks (``QK_CHUNKS``; one product a tile spilled 200 registers at 256)."""
    builds = targets.build_backward_kernels(target, head_dim, "bfloat16", causal)
    assert [b.variant for b in builds] in (["dkdv_kernel", "dq_kernel"], ["dkdv_kernel"])
    for b in builds:
        r = targets.report(b)
        assert any(name.startswith(matrix) for name in r.matrix_instructions), (b.variant, r.matrix_instructions)
        assert r.spilled_registers == 0, (b.variant, b.config, r.spilled_registers)


@pytest.mark.parametrize("target", ["gfx942", "gfx1151"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_tiled_with_every_modifier_builds_for_amd_without_spills(target, head_dim):
    """``tiled`` on AMD with a window, softcap, ALiBi and the LSE at once (``modifiers``), in the configs the plan
    takes beside them (:data:`fmha.configs.TILED_HIP_MODIFIED`, and the decode tiles with ``modifiers``): no spills
    with per-sequence lengths or beside a mask (the plain rows spilled 2-30 registers there)."""
    for lengths, mask in (("seqused", False), ("dense", True)):
        b = targets.build("tiled", target, head_dim, "bfloat16", True, lengths=lengths, attn_mask=mask, modifiers=True)
        assert b.config == configs.tiled_config("hip", head_dim, modifiers=True).as_dict()
        assert targets.report(b).spilled_registers == 0, (lengths, mask, targets.report(b).spilled_registers)
    for rows in (16, 64):
        cfg = configs.decode_config(rows, 4096, head_dim, "hip", modifiers=True)
        r = targets.report(targets.build("tiled", target, head_dim, "bfloat16", False, cfg, attn_mask=True,
                                         modifiers=True))
        assert r.spilled_registers == 0, (cfg, r.spilled_registers)


@pytest.mark.parametrize("target", ["gfx942", "gfx1151"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("mask,causal,deterministic", [(True, False, False), (True, True, False), (True, True, True),
                                                       ("bias", True, True)])
def test_backward_kernels_beside_a_mask_build_for_amd_within_their_registers(target, head_dim, mask, causal,
                                                                              deterministic):
    """The portable backward reading an attn_mask (boolean, or a float32 bias) on AMD takes the tiles of
    :data:`fmha.backward.AMD_TILES_MASKED` and keeps its values in registers (the unmasked tiles spilled 10-50
    registers on gfx1151 and 15-40 on gfx942 beside a mask)."""
    builds = targets.build_backward_kernels(target, head_dim, "bfloat16", causal, deterministic, attn_mask=mask)
    for b in builds:
        assert targets.report(b).spilled_registers == 0, (b.variant, b.config, targets.report(b).spilled_registers)


@pytest.mark.parametrize("target", ["gfx1151", "gfx942"])
@pytest.mark.parametrize("head_dim", [96, 128, 192, 256])
def test_tiled_builds_for_amd_without_spills(target, head_dim):
    """``tiled``'s AMD rows (the variant ``auto`` runs there) keep everything in registers on RDNA and CDNA at
    every head dim, causal (the larger build), with the matrix unit: at 192 and 256 on gfx1151 because V is read
    without masked loads (a masked tile's rows clamped and zeroed, a padded head dim's last columns read again):
    67-78 spilled registers with them."""
    b = targets.build("tiled", target, head_dim, "bfloat16", True)
    r = targets.report(b)
    assert r.spilled_registers == 0 and r.scratch_bytes == 0, (b.config, r.spilled_registers)
    assert any(name.startswith(("v_wmma", "v_mfma")) for name in r.matrix_instructions)


@pytest.mark.parametrize("target", ["gfx1151", "gfx942"])
@pytest.mark.parametrize("head_dim", [64, 128, 192, 256])
@pytest.mark.parametrize("rows", [1, 32])
def test_amd_decoding_fits_a_workgroups_lds(target, head_dim, rows):
    """Decoding's AMD configs (:func:`fmha.configs.amd_decode_config`) ask for no more than the 64 KB of LDS a
    workgroup gets (the NVIDIA rows' three stages asked for up to 128 KB) and keep their values in registers on
    both chips, at head_dim 256 too (gfx1151 spilled 92 registers there with 32 rows in 8 warps and V's masked rows
    by a masked load)."""
    cfg = configs.decode_config(rows, 4096, head_dim, "hip")
    r = targets.report(targets.build("tiled", target, head_dim, "bfloat16", False, config=cfg))
    assert r.shared_bytes <= 65536
    assert r.spilled_registers == 0, (cfg, r.spilled_registers)


H200, A100, SM89 = 232448, 166912, 101376  # bytes of shared memory a block may take


@pytest.mark.parametrize("target,limit,head_dim,rows,seqlen_k,mask", [
    ("sm_90", H200, 64, 0, 4096, True), ("sm_90", H200, 128, 0, 4096, True), ("sm_90", H200, 256, 0, 4096, True),
    ("sm_90", H200, 64, 0, 4096, "bias"), ("sm_90", H200, 128, 0, 4096, "bias"), ("sm_90", H200, 256, 64, 4096, "bias"),
    ("sm_90", H200, 128, 1, 4096, True), ("sm_90", H200, 256, 16, 4096, True), ("sm_90", H200, 256, 64, 4096, True),
    ("sm_90", H200, 96, 64, 4096, True), ("sm_80", A100, 256, 64, 4096, False), ("sm_80", A100, 128, 0, 4096, True),
    ("sm_80", SM89, 128, 16, 16384, False), ("sm_80", SM89, 256, 16, 4096, False),
    ("sm_80", SM89, 256, 64, 4096, False)])
def test_tiled_fits_the_shared_memory_of_its_gpu(target, limit, head_dim, rows, seqlen_k, mask):
    """The plan's ``tiled`` configs take as many stages as fit the GPU's shared memory
    (:func:`fmha.configs.fit_shared`), counted by :func:`fmha.configs.tiled_smem`, which holds what Triton's build
    takes: on sm_90 beside an attn_mask (three stages of 128 x 128 tiles at D=128 asked for 256 KB, a split's three of
    64 x 64 at 256 240 KB; a float bias's tiles in two of three stages); on an A100 (163 KB) a split's 64 x 64 tiles
    at 256 (168 KB in three); on sm_86 / sm_89 (99 KB) a decode's 128-key tiles at 128 from 8k keys (136 KB) and its
    64-key ones at 256 (138 KB; 104 KB in two stages for 64 query rows, so one)."""
    from fmha.kernels.hopper.resources import padded
    arch, major = target.replace("_", ""), int(target[3])
    config = (configs.decode_config(rows, seqlen_k, head_dim, arch) if rows
              else configs.tiled_config(arch, head_dim))
    width = padded(head_dim, 16)
    fitted = configs.fit_shared(config, width, width, mask, limit, major)
    took = targets.build("tiled", target, head_dim, "bfloat16", False, fitted, attn_mask=mask).metadata["shared"]
    assert took <= configs.tiled_smem(fitted, width, width, mask, major) <= limit, (fitted, took)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_dropout_tiles_fit_shared_memory_with_the_kept_pairs_counted(head_dim):
    """Attention dropout's kept pairs are counted in ``tiled``'s shared memory (:func:`fmha.configs.tiled_smem`: two
    bytes a score; draws made in another layout than the scores' crossed shared memory, and three stages of 128 x 128
    tiles at D=128 took 240 KB, past the 227 KB an H200 gives a block): the plain table's rows and the dropout rows fit
    as built, within what is counted."""
    from fmha.kernels.hopper.resources import padded
    width = padded(head_dim, 16)
    for config in (configs.tiled_config("sm90", head_dim), configs.tiled_config("sm90", head_dim, dropout=True)):
        fitted = configs.fit_shared(config, width, width, False, H200, 9, dropout=True)
        took = targets.build("tiled", "sm_90", head_dim, "bfloat16", True, fitted, dropout=True).metadata["shared"]
        assert took <= configs.tiled_smem(fitted, width, width, False, 9, dropout=True) <= H200, (fitted, took)
    assert configs.fit_shared(configs.KernelConfig(128, 128, 8, 3), 128, 128, False, H200, dropout=True).num_stages == 2


def test_a_bias_beside_three_stage_tiles_is_counted_as_its_build_takes_it():
    """128 x 128 tiles in three stages at head_dim 64 (a fuzzer's draw, V 32 wide): beside a boolean mask the sm_90
    build takes 176 KB and keeps its three stages; beside a float bias it took 240 KB, past the 227 KB an H100 gives a
    block (Triton's out-of-resources error at the launch), where the count had taken the bias for a boolean mask.
    Counted as the build takes it, the bias's config falls to two stages, which fit."""
    from fmha.configs import KernelConfig
    three = KernelConfig(128, 128, 8, 3)
    for mask, stages in ((True, 3), ("bias", 2)):
        fitted = configs.fit_shared(three, 64, 64, mask)
        assert fitted.num_stages == stages, (mask, fitted)
        took = targets.build("tiled", "sm_90", 64, "bfloat16", True, fitted, head_dim_v=32,
                             attn_mask=mask).metadata["shared"]
        assert took <= configs.tiled_smem(fitted, 64, 64, mask) <= H200, (mask, took)


@pytest.mark.parametrize("variant,head_dim,rows", [("tiled", 128, 0), ("tiled", 256, 64), ("tiled", 256, 16),
                                                   ("pipelined", 256, 0), ("singlewave", 256, 0)])
def test_sm90_builds_fit_shared_memory(variant, head_dim, rows):
    """What the plan runs on sm_90 fits its shared memory (the planner raises nothing; Triton would, at the
    launch): ``tiled``'s prefill row at 128 (224 KB), its decode tiles at 256 (``rows``: a key split's query
    rows; three 64-key stages), the seed's variants at 256 in their own tiles (the decode tiles asked
    ``pipelined`` for 256 KB)."""
    from fmha.kernels.hopper.resources import SMEM_LIMIT
    config = configs.decode_config(rows, 4096, head_dim, "sm90") if rows else None
    b = targets.build(variant, "sm_90", head_dim, "bfloat16", True, config)
    assert b.metadata["shared"] <= SMEM_LIMIT, b.metadata["shared"]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("deterministic", [False, True])
def test_hopper_backward_builds_for_packed_sequences(head_dim, deterministic):
    """Packed sequences build into the same kernel: each partition reads its sequence's bounds from cu_seqlens
    (a few loads a program, none in the walk's products), the producer zeroes what lies past a sequence's end,
    dQ's tiles still leave as reduce-adds, and ptxas's spills stay within a bound (loop-invariant scalars and
    addresses, stored before the walk; the causal block's hidden half, a branch in the walk, added a few)."""
    ptx = targets.build_hopper_backward(head_dim, "bfloat16", causal=True, deterministic=deterministic,
                                        varlen=True).asm["ptx"]
    assert len(re.findall(r"cp\.reduce\.async\.bulk\.tensor\.3d\.global\.shared::cta\.add\.tile", ptx)) == 2
    assert 0 < len(re.findall(r"\bld\.global\b", ptx)) <= 12  # four cu_seqlens entries by each partition
    usage = targets.ptxas_usage(ptx, 90)
    assert usage["spill_stores"] <= (192 if head_dim == 64 else 544), usage
    assert not usage["serialized"], "ptxas waits for each wgmma before the next"


@pytest.mark.parametrize("shared,head_dim,deterministic,mask", [
    (A100, 256, False, False), (A100, 256, True, True), (A100, 128, False, True), (SM89, 256, False, True),
    (SM89, 256, True, False), (SM89, 128, False, True), (SM89, 64, True, True)])
def test_the_backwards_kernels_fit_the_shared_memory_of_their_gpu(shared, head_dim, deterministic, mask):
    """The portable backward's kernels on a GPU with less shared memory than sm_90's take tiles that fit it
    (:data:`fmha.backward.SMALL_SHARED`): the H200's took 168 KB past head_dim 128 (an A100 has 163) and its dQ kernel
    104 KB at 128 beside a mask (sm_86 and sm_89 have 99)."""
    for b in targets.build_backward_kernels("sm_80", head_dim, "bfloat16", True, deterministic, mask, shared=shared):
        assert b.metadata["shared"] <= shared, (b.variant, b.config, b.metadata["shared"])


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("mask,mask_grad", [(False, False), (True, False), ("bias", False), ("bias", True)])
def test_the_backward_builds_for_sm80_without_spills(head_dim, mask, mask_grad):
    """NVIDIA before Hopper takes the portable backward's tiles of :data:`fmha.backward.SM80_TILES` (mma.sync, no
    wgmma): every kernel of it, causal or not, deterministic or not, beside a boolean mask, a bias, a bias's
    gradient or none, keeps its values in registers (the H200's tiles spilled 23-409 registers in the dK/dV kernel
    and up to 506 in the dQ kernel there) and fits the 99 KB of sm_86's and sm_89's blocks."""
    for causal in (False, True):
        for deterministic in (False, True):
            for b in targets.build_backward_kernels("sm_80", head_dim, "bfloat16", causal, deterministic, mask,
                                                    mask_grad=mask_grad):
                r = targets.report(b)
                assert r.spilled_registers == 0, (causal, deterministic, b.variant, b.config, r.spilled_registers)
                assert b.metadata["shared"] <= SM89, (b.variant, b.config, b.metadata["shared"])


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_tiled_beside_a_mask_builds_for_sm80_without_spills(head_dim):
    """``tiled`` reading an attn_mask on NVIDIA before Hopper takes :data:`fmha.configs.TILED_SM80_MASKED` (the sm80
    rows spilled 100-143 registers beside a boolean mask, 11-56 beside a bias): none spilled, boolean or bias,
    causal or not, with a window, softcap and ALiBi beside it too."""
    row = next(cfg for max_d, cfg in configs.TILED_SM80_MASKED if head_dim <= max_d)
    for mask, causal, mods in ((True, False, False), (True, True, True), ("bias", False, False), ("bias", True, True)):
        b = targets.build("tiled", "sm_80", head_dim, "bfloat16", causal, attn_mask=mask, modifiers=mods)
        assert b.config == row.as_dict()
        assert targets.report(b).spilled_registers == 0, (mask, causal, mods)


def test_a_failed_hopper_build_is_told_by_ptxas_own_line():
    """64 rows of 256-key tiles at head_dim 64 run out of registers in ptxas; the launch's refusal quotes ptxas's own
    line from the failed build's message, which goes on with the whole PTX (:func:`fmha.kernels.hopper.ptxas_says`;
    under the interpreter the build runs in a process of its own, whose failure carries the same message)."""
    from triton.runtime.errors import PTXASError
    from fmha.configs import KernelConfig
    from fmha.kernels import hopper
    with pytest.raises((PTXASError, RuntimeError)) as failed:
        targets.build("hopper", "sm_90", 64, "bfloat16", False, KernelConfig(64, 256, 4, 2))
    said = hopper.ptxas_says(failed.value)
    assert said.startswith("ptxas fatal") and "Insufficient registers" in said and "\n" not in said, said


# the table rows that build with spills, as timed: (dtype, head_dim, causal, longest seqlen_k) -> registers spilled
HOPPER_ROWS_SPILLING = {("bfloat16", 64, False, None): 26,  # 192 rows, the standing pivot's re-take (timed fastest so)
                        ("bfloat16", 64, True, 16384): 12,  # 192 rows causal, the same (+1.8-4.7% over the exact pivot)
                        ("bfloat16", 256, True, None): 1,  # the standing pivot, causal: one register, outside the loop
                        ("bfloat16", 256, False, configs.O_VIA_Q_KEYS): 1}  # O out through Q: stored once, at the start


def test_every_hopper_table_row_builds_for_sm90_within_its_registers():
    """Every row of the Gluon kernel's tables (bf16's, float8's, 192/128's unpadded Q and K, 80 and 96's long row)
    builds for sm_90 with no spilled register, but the rows timed fastest with a few (:data:`HOPPER_ROWS_SPILLING`):
    a change to the kernel that makes a row spill shows here, on the CPU, before a GPU times it."""
    rows = [(d, causal, longest, cfg, "bfloat16", 0) for d, causal, longest, cfg in configs.HOPPER]
    rows += [(d, causal, longest, cfg, "float8_e4m3fn", 0) for d, causal, longest, cfg in configs.HOPPER_FP8]
    rows += [(192, True, None, configs.HOPPER_SPLIT_QK, "bfloat16", 128)]
    rows += [(d, False, None, configs.HOPPER_NARROW_LONG, "bfloat16", 0) for d in configs.NARROW_LONG_DIMS]
    for d, causal, longest, cfg, dtype, dv in rows:
        b = targets.build("hopper", "sm_90", d, dtype, causal, cfg, seqlen_k=longest or 16384, head_dim_v=dv)
        spilled = targets.report(b).spilled_registers
        assert spilled == HOPPER_ROWS_SPILLING.get((dtype, d, causal, longest), 0), (dtype, d, str(cfg), spilled)
