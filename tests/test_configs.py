"""The config tables: every row reachable, every answer one its kernel takes."""
import numpy as np
import pytest
import torch

from fmha import configs, plan
from fmha.kernels import hopper


def test_every_hopper_row_is_reachable():
    """First match wins: a row shadowed by the rows above it would be dead data."""
    for d, causal, longest, cfg in configs.HOPPER:
        assert configs.hopper_config(d, causal, longest if longest is not None else 1 << 20) == cfg


@pytest.mark.parametrize("head_dim, head_dim_v", [(32, 0), (64, 0), (96, 0), (128, 0), (192, 0), (192, 128),
                                                  (192, 64), (256, 0), (40, 0), (80, 0), (80, 40), (112, 0),
                                                  (160, 0), (144, 80), (248, 0)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seqlen_k", [128, 512, 1000, 1024, 4096, 8192, 9000, 16384, 131072])
@pytest.mark.parametrize("modifiers", [False, True])
@pytest.mark.parametrize("per_sequence", [False, True])
def test_hopper_answers_fit_the_kernel(head_dim, head_dim_v, causal, seqlen_k, modifiers, per_sequence):
    cfg = configs.hopper_config(head_dim, causal, seqlen_k, modifiers, per_sequence, head_dim_v=head_dim_v)
    assert cfg.block_m in (64, 128, 192) and cfg.block_n in (64, 128) and not (cfg.pingpong and cfg.block_m == 64)
    assert hopper.smem_bytes(head_dim, cfg, head_dim_v) + hopper.SMEM_SPARE <= hopper.SMEM_LIMIT
    assert hopper.sm_bytes(head_dim, cfg, head_dim_v) <= hopper.SMEM_SM
    # q/k 192 with a narrower V: unpadded Q and K (split_qk), which take Q in shared memory and no clusters
    assert bool(cfg.split_qk) == (head_dim == hopper.SPLIT_QK_DIM and head_dim_v > 0)
    assert not (cfg.split_qk and (cfg.q_regs or cfg.cluster))
    # the programs an SM holds fit its registers: each warpgroup (the producer's padded) at the launch
    # count, or, at Triton's choice, the consumers at theirs and the producer at 24
    groups, launch = cfg.block_m // 64 + 1, hopper.launch_regs(cfg)
    per_program = groups * launch if launch else (groups - 1) * hopper.consumer_regs(cfg) + 24
    assert max(cfg.occupancy, 1) * 128 * per_program <= hopper.REGS_SM
    # three consumer warpgroups spill on the modifiers' values or the key mask (any length per sequence)
    if modifiers or per_sequence or seqlen_k % cfg.block_n:
        assert cfg.block_m <= 128
    assert configs.default_config("hopper", "sm90", head_dim, causal, seqlen_k, modifiers, per_sequence,
                                  head_dim_v=head_dim_v) == cfg
    if cfg.cluster:  # clusters only where the kernel takes them (hopper.supports)
        assert hopper.padded(head_dim) == hopper.padded(head_dim_v or head_dim) == 128
        assert not causal and not modifiers and not per_sequence
        assert (cfg.block_m, cfg.block_n, cfg.pingpong, cfg.occupancy) == (128, 128, 0, 0)
    # a cluster runs two query blocks: none where the rows make an odd number of them
    for seqlen_q, paired in [(1, False), (128, False), (129, True), (300, False), (1000, True), (4096, True)]:
        cfg_q = configs.hopper_config(head_dim, causal, seqlen_k, modifiers, per_sequence, seqlen_q=seqlen_q,
                                      head_dim_v=head_dim_v)
        assert bool(cfg_q.cluster) == (bool(cfg.cluster) and paired)


def test_o_is_staged_where_it_fits():
    """O goes through shared memory beside Q and the K/V rings where they leave room for it; at
    D=128 with 3 stages (Q 32 KB + K/V 192 KB) it does not, and is stored from registers."""
    kc = configs.KernelConfig
    for d, cfg, staged, kb in [(128, kc(128, 128, 4, 2), True, 192), (128, kc(128, 128, 4, 3), False, 224),
                               (64, kc(192, 128, 4, 3), True, 144), (64, kc(128, 128, 4, 4), True, 160)]:
        assert hopper.o_staged(d, cfg) is staged
        assert hopper.smem_bytes(d, cfg) == kb << 10
    # 256-wide tiles (head_dim 192 and 256; DeepSeek's 192 with V's 128): O staged only beside V's narrower ring
    for d, dv, staged, kb in [(256, 256, False, 192), (192, 192, False, 192), (192, 128, True, 192)]:
        cfg = configs.hopper_config(d, False, 4096)
        assert hopper.o_staged(d, cfg, dv) is staged
        assert hopper.smem_bytes(d, cfg, dv) == kb << 10


def test_o_goes_out_through_q_only_where_it_has_no_stage_and_q_is_its_tile():
    """``o_via_q``: O through Q's shared tile (stage 2) where no stage of its own fits and Q is O's tile (16-bit,
    as wide, held in shared memory; ``split_qk``'s 128-column tile beside V's 128, DeepSeek's 192/128); a stage of
    its own (1) wins where it fits; elsewhere the flag is refused by name."""
    from dataclasses import replace
    kc = configs.KernelConfig
    for d, dv, cfg, in_bytes, stage in [(256, 256, kc(128, 64, 4, 2, o_via_q=1), 2, 2),
                                        (256, 256, kc(128, 64, 4, 2), 2, 0),
                                        (128, 128, kc(128, 128, 4, 3, o_via_q=1), 2, 2),
                                        (128, 128, kc(128, 128, 4, 2, o_via_q=1), 2, 1),
                                        (192, 128, kc(128, 64, 4, 2, o_via_q=1), 2, 1),
                                        (192, 128, kc(128, 128, 4, 2, split_qk=1, o_via_q=1), 2, 2),
                                        (192, 128, kc(128, 128, 4, 2, split_qk=1), 2, 0)]:
        assert hopper.o_stage(d, cfg, dv, in_bytes) == stage
    base = kc(128, 128, 4, 3, o_via_q=1)
    assert hopper.o_via_q_reason(128, base) is None
    for cfg, d, dv, in_bytes in [(replace(base, q_regs=1), 128, 128, 2), (replace(base, cluster=1), 128, 128, 2),
                                 (base, 128, 128, 1), (base, 256, 128, 2), (replace(base, split_qk=1), 192, 192, 2),
                                 (replace(base, split_qk=1), 192, 64, 2)]:
        assert "o_via_q takes" in hopper.o_via_q_reason(d, cfg, dv, in_bytes)
        assert hopper.o_stage(d, cfg, dv, in_bytes) != 2


def test_p_in_shared_memory_takes_its_room_before_o():
    """``p_smem``: a ``[64, block_n]`` tile of P (V's element size) for each consumer warpgroup, counted before O's
    stage, which then fits only where room is left (192 x 128 tiles at head_dim 96: Q and two stages of K/V tiles and
    P's three tiles leave none, so O goes out from registers); float8 at head_dim 128 in 256-key tiles; clusters are
    refused by name."""
    kc = configs.KernelConfig
    for d, cfg, in_bytes, kb, stage in [(96, kc(192, 128, 4, 2), 2, 224, 1),
                                        (96, kc(192, 128, 4, 2, p_smem=1), 2, 224, 0),
                                        (128, kc(128, 128, 4, 2), 2, 192, 1),
                                        (128, kc(128, 128, 4, 2, p_smem=1), 2, 224, 1),
                                        (64, kc(192, 128, 4, 2, p_smem=1), 2, 160, 1),
                                        (128, kc(128, 256, 4, 2, p_smem=1), 1, 208, 1)]:
        assert hopper.smem_bytes(d, cfg, None, in_bytes) == kb << 10
        assert hopper.o_stage(d, cfg, None, in_bytes) == stage
    assert hopper.p_smem_reason(kc(192, 128, 4, 2, p_smem=1)) is None
    assert "p_smem takes" in hopper.p_smem_reason(kc(128, 128, 4, 2, p_smem=1, cluster=1))


@pytest.mark.parametrize("rows", [1, 4, 16, 17, 64])
@pytest.mark.parametrize("seqlen_k", [1024, 32768, 131072])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_decode_block_holds_its_rows(rows, seqlen_k, head_dim):
    """The block holds the program's rows, and its K/V ring fits in an sm_90 SM's shared memory."""
    cfg = configs.decode_config(rows, seqlen_k, head_dim)
    assert 16 <= cfg.block_m <= 64 and cfg.block_m >= min(rows, 64)
    ring = cfg.num_stages * 2 * cfg.block_n * head_dim * 2  # K and V tiles, 16-bit
    assert ring + cfg.block_m * head_dim * 2 <= hopper.SMEM_LIMIT


def test_tail_pieces_cut_only_a_partly_filled_last_round():
    """``split_tail``: the items of a last round that leaves programs idle go in pieces when that ends
    the run sooner; whole rounds, or items of a few key tiles, stay whole."""
    for n_tiles, key_tiles in [(2048, 128), (2048, 32), (80, 32), (16384, 1024)]:  # 132 programs
        pieces = hopper.tail_pieces(n_tiles, 132, key_tiles)
        assert 1 < pieces <= 16
        rounds = -(-pieces * (n_tiles % 132) // 132)  # of pieces, after the whole rounds of items
        assert rounds * (key_tiles / pieces + hopper.ITEM_COST) < key_tiles
        assert key_tiles // pieces >= 2
    assert hopper.tail_pieces(264, 132, 128) == 1  # two whole rounds
    assert hopper.tail_pieces(2048, 132, 4) == 1   # a piece's own cost outweighs the idle time
    assert hopper.tail_pieces(131, 132, 2) == 1    # nothing left to cut
    assert hopper.tail_pieces(2048, 132, 128, max_pieces=3) == 3  # 2 pieces of 68 items need 2 rounds


def test_split_pieces_only_where_items_cost_the_same_and_memory_allows():
    """The split runs on persistent, non-causal calls without a window or lengths per sequence, and
    only while its float32 workspace stays within the output's size."""
    from dataclasses import replace
    from fmha.plan import Problem
    cfg = configs.KernelConfig(128, 128, 4, 2, split_tail=1)
    prob = Problem(1, 16, 16, 16384, 16384, 128, False, 0, 1.0)
    out_bytes = 16 * 16384 * 128 * 2
    assert hopper.split_pieces(prob, cfg, 2048, 132, out_bytes) == hopper.tail_pieces(2048, 132, 128) > 1
    for off in (replace(prob, causal=True), replace(prob, window_offset=-100), replace(prob, varlen=True),
                replace(prob, seqused=True)):
        assert hopper.split_pieces(off, cfg, 2048, 132, out_bytes) == 1
    for off_cfg in (replace(cfg, split_tail=0), replace(cfg, persistent=0)):
        assert hopper.split_pieces(prob, off_cfg, 2048, 132, out_bytes) == 1
    # 80 items, all in the last round: pieces of them would need more than the output's bytes
    small = Problem(1, 5, 5, 2048, 4096, 128, False, 0, 1.0)
    assert hopper.split_pieces(small, cfg, 80, 132, 5 * 2048 * 128 * 2) == 1


def test_a_schedule_is_built_only_where_it_may_be_kept():
    """The balanced schedule is kept for the next call of its shape; a call that may keep nothing (``build=False``:
    compiled code's CUDA graphs, a stream being captured) gets None until a call that may keep it has built it."""
    from fmha.kernels.hopper import schedule
    shape = ("cpu", 3, 101, 132, 128, 128, 3 * 128, 0)
    schedule._SCHEDULES.clear()
    assert schedule._schedule(*shape, build=False) is None and not schedule._SCHEDULES
    built = schedule._schedule(*shape)
    assert schedule._schedule(*shape, build=False) is built
    tiles = hopper.block_tiles(np.arange(3) * 128, 3 * 128, 0, 0, 128, 128, True, False)
    assert torch.equal(built, torch.from_numpy(hopper.balanced_tail(3, 101, 132, tiles)))


@pytest.mark.parametrize("n_m, n_bh, programs, head_group", [(4, 1024, 132, 1), (8, 512, 132, 1), (128, 16, 132, 1),
                                                             (86, 32, 132, 1), (5, 7, 132, 1), (3, 101, 132, 1),
                                                             (7, 61, 100, 1), (16, 300, 8, 1), (128, 16, 132, 4),
                                                             (86, 32, 132, 8), (16, 300, 8, 7), (4, 1024, 132, 1024)])
def test_balanced_tail_runs_every_item_once_and_ends_sooner(n_m, n_bh, programs, head_group):
    """``balance``: each program's whole rounds of pairs, then its share of the rest by LPT: every
    item runs exactly once, and the busiest program's key tiles (plus ITEM_COST an item) are no more
    than under pairs alone, and within an item of the mean."""
    # bottom-right, 256 keys more than rows: 2 more tiles per block
    tiles = hopper.block_tiles(np.arange(n_m) * 128, n_m * 128 + 256, 256, 0, 128, 128, True, False)
    assert tiles[0] == 3 and tiles[-1] == n_m + 2
    sched = hopper.balanced_tail(n_m, n_bh, programs, tiles, head_group)
    lead, offsets = int(sched[0]), sched[1:programs + 2]
    lists = sched[programs + 2:]
    assert lead % 2 == 0 and offsets[0] == 0 and offsets[-1] == len(lists)
    n_tiles = n_m * n_bh
    ran, loads = [], []
    for p in range(programs):
        mine = [2 * (p + (k // 2) * programs) + k % 2 for k in range(lead)] + list(lists[offsets[p]:offsets[p + 1]])
        ran += mine
        block = hopper.paired_item(np.array(mine, dtype=np.int64), n_m, n_bh, head_group)[0]
        loads.append(sum(tiles[block] + hopper.ITEM_COST))
    assert sorted(ran) == list(range(n_tiles))
    cost = tiles[hopper.paired_item(np.arange(n_tiles), n_m, n_bh, head_group)[0]] + hopper.ITEM_COST
    pairs = [cost[2 * q::2 * programs].sum() + cost[2 * q + 1::2 * programs].sum() for q in range(programs)]
    assert max(loads) <= max(pairs)
    assert max(loads) <= cost.sum() / programs + cost.max()


@pytest.mark.parametrize("n_m, n_bh, head_group", [(128, 16, 1), (86, 21, 1), (7, 5, 1), (128, 16, 4), (86, 21, 8),
                                                  (2, 9, 4), (64, 3, 1024)])
def test_causal_pairs_cover_every_block_once_and_cost_alike(n_m, n_bh, head_group):
    """PAIRED numbering (``_tile``, mirrored by ``paired_item``): every (block, head) once; each pair of items
    ``2k, 2k + 1`` a block and its complement in one head, so every pair costs ``n_m + 1`` key tiles (head-major
    with an odd ``n_m``, every other head's pairs ``n_m``, and one across each head's end); across ``head_group``
    heads the pairs run pair by pair over the group's heads (the launch takes that with an even ``n_m`` only)."""
    g = np.arange(n_m * n_bh)
    block, bh = hopper.paired_item(g, n_m, n_bh, head_group)
    assert sorted(zip(block.tolist(), bh.tolist())) == [(m, h) for m in range(n_m) for h in range(n_bh)]
    same_head = bh[0::2][:len(bh[1::2])] == bh[1::2]
    both = block[0::2][:len(block[1::2])] + block[1::2]
    if n_m % 2 == 0:
        assert same_head.all() and (both == n_m - 1).all()
    else:  # head-major, a head's pairs shifted by one item after an odd head: n_m - 1 or n_m - 2 blocks apart
        assert head_group == 1 and np.isin(both[same_head], (n_m - 1, n_m - 2)).all()
    if head_group > 1:  # the first pairs go to different heads of the first group
        assert len(set(bh[0:2 * min(head_group, n_bh):2].tolist())) == min(head_group, n_bh)


@pytest.mark.parametrize("per_sequence", [False, True])
def test_hopper_keeps_q_in_registers_under_a_causal_window_alone(per_sequence):
    """At D=128 Q goes to shared memory with a softcap or ALiBi, or a non-causal window (spills in
    registers), and stays in registers under a causal window alone."""
    def q_regs(causal, modifiers, window_only):
        return configs.hopper_config(128, causal, 4096, modifiers, per_sequence, window_only=window_only).q_regs
    assert q_regs(True, False, False) == 1
    assert q_regs(True, True, True) == 1
    assert q_regs(True, True, False) == 0
    assert q_regs(False, True, True) == 0
    assert configs.hopper_config(96, True, 4096, True, per_sequence, window_only=True).q_regs == 0  # padded


def test_hopper_keeps_the_lazy_pivot_to_calls_without_modifiers():
    """The lazy pivot of head_dim 256 causal was timed on plain calls; with a window it spills in the sm_90 build."""
    assert configs.hopper_config(256, True, 4096).lazy == 1
    assert configs.hopper_config(256, True, 4096, True, window_only=True).lazy == 0
    assert configs.hopper_config(256, True, 4096, True).lazy == 0


def test_hopper_numbers_a_causal_window_across_the_heads():
    """A causal window alone at D=128 numbers its items block by block across the heads (the whole bands first);
    every other call at D=128 keeps the row's order."""
    def group(causal, modifiers, window_only, d=128):
        return configs.hopper_config(d, causal, 4096, modifiers, window_only=window_only).head_group
    assert group(True, True, True) == configs.WINDOW_HEAD_GROUP
    assert group(True, True, False) == group(True, False, False) != configs.WINDOW_HEAD_GROUP
    assert group(False, True, True) != configs.WINDOW_HEAD_GROUP
    assert group(True, True, True, d=64) != configs.WINDOW_HEAD_GROUP


@pytest.mark.parametrize("mods,window_only", [(dict(window_offset=-512), True),
                                              (dict(window_offset=-512, softcap=30.0), False),
                                              (dict(softcap=30.0), False), ({}, False)])
def test_plan_asks_the_hopper_table_about_a_window_alone(monkeypatch, mods, window_only):
    """The plan tells the table whether a window is the only modifier (Q then stays in registers when causal)."""
    import dataclasses
    import inspect

    import torch

    from fmha import plan
    asked = {}
    table = configs.hopper_config
    bind = inspect.signature(table).bind
    monkeypatch.setattr(configs, "hopper_config",
                        lambda *a, **kw: asked.update(bind(*a, **kw).arguments) or table(*a, **kw))
    monkeypatch.setattr(plan, "arch_of", lambda device: "sm90")
    q = k = v = torch.zeros(1, 2, 256, 128, dtype=torch.bfloat16)
    prob = dataclasses.replace(plan.problem(*plan.sizes(q, k, "bhsd"), causal=True, scale=None), **mods)
    plan.plan(prob, q, k, v, q, "bhsd", "auto", None, None, 1)
    assert asked.get("window_only", False) is window_only and asked["modifiers"] is bool(mods)


@pytest.mark.parametrize("head_dim", [80, 96])
def test_head_dims_80_and_96_take_their_long_row_only_where_it_was_timed(head_dim):
    """Head_dim 80 and 96 without causal take 192 x 64 tiles in 3 stages past 2k keys on dense calls of whole key
    tiles; shorter, causal, with modifiers, lengths per sequence or a ragged last tile, the 128 rows as before; the
    head dims beside them (72, 88, 104: not timed) the 128 rows."""
    long = configs.HOPPER_NARROW_LONG
    assert configs.hopper_config(head_dim, False, 4096) == long
    assert configs.hopper_config(head_dim, False, 131072) == long
    assert configs.default_config("hopper", "sm90", head_dim, False, 16384) == long
    for kw in (dict(seqlen_k=2048), dict(seqlen_k=4100), dict(causal=True), dict(modifiers=True),
               dict(per_sequence=True), dict(head_dim_v=64), dict(fp8=True), dict(head_dim=head_dim - 8),
               dict(head_dim=head_dim + 8)):
        args = {"head_dim": head_dim, "causal": False, "seqlen_k": 4096, **kw}
        assert configs.hopper_config(**args) != long, kw
    assert configs.hopper_config(128, False, 4096) != long


def test_head_dim_96_causal_takes_the_lpt_tail_alone_of_the_padded_dims():
    """Causal head_dim 96 deals its last rounds by LPT (``balance``, +1.7-2.9% in one run) past 512 keys and up to
    16k, where it was timed, with Q in shared memory and D=128's pivot (the standing one at 512 keys and from 4k to
    16k; at 1k the exact one ran 2.4-3.6% faster at 80 and 96); 192 and 256 causal, where it lost, do not.  Causal
    with a window, softcap or ALiBi, the exact pivot (the standing one spills there)."""
    for sk in (512, 1024, 2048, 4096, 16384, 131072):
        cfg = configs.hopper_config(96, True, sk)
        stale = sk == 512 or 4096 <= sk <= 16384
        assert (cfg.balance, cfg.stale, cfg.q_regs) == (int(512 < sk <= 16384), int(stale), 0), sk
        assert configs.hopper_config(96, True, sk, modifiers=True).stale == 0
        assert configs.hopper_config(128, True, sk).stale == int(stale)
    assert configs.hopper_config(192, True, 4096).balance == 0
    assert configs.hopper_config(192, True, 4096, head_dim_v=128).balance == 0
    assert configs.hopper_config(256, True, 4096).balance == 0


@pytest.mark.parametrize("seqlen,heads,kv_heads,head", [(1024, 16, 16, 128), (16384, 16, 16, 128), (4096, 28, 4, 128),
                                                         (1 << 20, 8, 8, 64), (512, 32, 32, 64)])
def test_causal_backward_heads_go_in_l2_sections(seqlen, heads, kv_heads, head, monkeypatch):
    """The Gluon backward's causal programs take (batch, KV head)s in sections whose Q, dO and float32 dQ fit
    the L2 cache (a power of two of them, one at least); deterministic and non-causal calls one at a time."""
    import dataclasses
    from fmha.kernels.hopper import backward
    l2 = 50 << 20
    monkeypatch.setattr(backward, "l2_bytes", lambda index: l2)
    q = torch.empty(1, heads, seqlen, head, device="meta")
    k = torch.empty(1, kv_heads, seqlen, head, device="meta")
    prob = plan.problem(*plan.sizes(q, k, "bhsd"), causal=True, scale=None)
    n = backward.section(prob, head, 2, 0, deterministic=False)
    one = seqlen * heads // kv_heads * head * (2 * 2 + 4)
    assert n & (n - 1) == 0 and n * one <= max(l2, one) < 2 * n * one, n
    assert backward.section(prob, head, 2, 0, deterministic=True) == 1
    assert backward.section(dataclasses.replace(prob, causal=False), head, 2, 0, deterministic=False) == 1


def test_hopper_sends_o_through_q_on_plain_calls():
    """The 256-wide rows send O out through Q's tile up to ``O_VIA_Q_KEYS`` keys (where it was timed faster), on
    plain 16-bit calls with V as wide as q/k; past that, beside modifiers, packed sequences, float8 or a narrower
    V, O leaves from registers.  DeepSeek's 192/128 (``split_qk``) sends it through Q's 128-column tile at every
    length, on plain calls.  Every pick is one ``hopper`` takes (``o_via_q_reason`` None where it is on)."""
    for d in (160, 192, 256):
        for causal in (False, True):
            assert configs.hopper_config(d, causal, 1024).o_via_q == 1
            assert configs.hopper_config(d, causal, configs.O_VIA_Q_KEYS).o_via_q == 1
            assert configs.hopper_config(d, causal, configs.O_VIA_Q_KEYS + 1).o_via_q == 0
            assert configs.hopper_config(d, causal, 1024, modifiers=True).o_via_q == 0
            assert configs.hopper_config(d, causal, 1024, per_sequence=True).o_via_q == 0
            assert configs.hopper_config(d, causal, 1024, fp8=True).o_via_q == 0
            assert configs.hopper_config(d, causal, 1024, head_dim_v=128).o_via_q == (d == 192)  # 192: split_qk
            assert hopper.o_via_q_reason(d, configs.hopper_config(d, causal, 1024)) is None
    for causal in (False, True):
        for keys in (1024, 16384, 131072):
            mla = configs.hopper_config(192, causal, keys, head_dim_v=128)
            assert mla.split_qk == mla.o_via_q == 1 and hopper.o_via_q_reason(192, mla, 128) is None
        assert configs.hopper_config(192, causal, 1024, modifiers=True, head_dim_v=128).o_via_q == 0
        assert configs.hopper_config(192, causal, 1024, per_sequence=True, head_dim_v=128).o_via_q == 0
    assert configs.hopper_config(128, False, 1024).o_via_q == 0
