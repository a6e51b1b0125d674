"""Kernel configurations: data, one table per variant, the measurement beside each entry.

A :class:`KernelConfig` fixes the tile shape and the launch parameters.  The
``singlewave`` and ``pipelined`` entries are the seed's identity (16x16 tiles,
one warp) on every target.  The ``tiled`` table is keyed by architecture and
head dimension; the interpreter entry is small so CPU tests stay quick.  There
is no autotuning on the default path: ``fmha sweep`` explores, this table decides.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from .kernels.hopper.resources import SMEM_LIMIT, SPLIT_QK_DIM, padded


@dataclass(frozen=True)
class KernelConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int = 1
    maxnreg: int = 0  # registers per consumer thread (hopper's setmaxnreg); 0: the variant's default
    persistent: int = -1  # hopper: 1 one program per SM, 0 one per work item, -1 the variant's default (1)
    split_per_sm: int = 0  # key-split launches: programs per SM the split aims for; 0: the default (4)
    pingpong: int = 0  # hopper: 1 the consumer warpgroups take turns issuing their matrix products
    # hopper: work items (causal pairs too, where a head has an even number of blocks) numbered across this many
    # heads at once; 0: head-major (1)
    head_group: int = 0
    tma: int = 0  # tiled: 1 K/V read by TMA (3-D descriptors; sm_90, contiguous K/V, not varlen or paged)
    q_regs: int = 0  # hopper: 1 each consumer warpgroup holds its Q in registers (Q K^T reads only K from smem)
    fence: int = 0  # hopper: 1 the softmax is fenced above the wait for P V (ptxas moves that wait up otherwise)
    split_tail: int = 0  # hopper, non-causal: 1 a partly filled last round's items run in pieces, merged by LSE
    balance: int = 0  # hopper, causal persistent: 1 the last round or two of pairs dealt longest item first
    occupancy: int = 0  # hopper: programs resident on each SM (the persistent grid, the registers split for it); 0: 1
    lazy: int = 0  # hopper: 1 a row's pivot moves only when its max grows by more than 2**8; O rescaled only then
    cluster: int = 0  # hopper, dense non-causal: 1 programs are 2-CTA clusters reading each K/V tile once (multicast)
    stale: int = 0  # hopper: 1 no row max past the first tile (the pivot stands until a tile's row sum passes 2**15)
    split_qk: int = 0  # hopper, q/k head dim 192: 1 Q and K held as a 128- and a 64-column tile (no padding)
    wide: int = 0  # hopper: 1 P V over a padded V's whole tile (0: over its own columns, ``narrow_pass``)
    qk_chunks: int = 0  # tiled: Q K^T as one batched product over this many column chunks, summed (0: one product)
    o_via_q: int = 0  # hopper: 1 where O has no shared-memory stage of its own, it goes out through Q's tile (TMA)
    p_smem: int = 0  # hopper: 1 P reaches P V through a shared tile of its warpgroup (FA3's "P not RS"), not registers

    def as_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        """``block_m=128 block_n=128 num_warps=4 num_stages=2 q_regs=1``: the tile and launch, then every
        field that differs from its default."""
        defaults = KernelConfig(self.block_m, self.block_n, self.num_warps)
        changed = [f"{k}={v}" for k, v in asdict(self).items()
                   if k in ("block_m", "block_n", "num_warps", "num_stages") or v != getattr(defaults, k)]
        return " ".join(changed)


SEED = KernelConfig(block_m=16, block_n=16, num_warps=1, num_stages=1)

# (arch, max head_dim) -> config, first match wins.  arch: "interpreter", "sm90", "sm80" (any other
# CUDA), "hip".  Why each row: docs/PERF.md, "The tables".
TILED = [
    ("interpreter", 256, KernelConfig(32, 32, 4, 1)),  # small tiles: fewer masked lanes on tiny tests
    ("sm90", 64, KernelConfig(128, 64, 4, 3)),         # the fastest of the probe's shapes, non-causal and causal
    ("sm90", 128, KernelConfig(128, 128, 8, 3)),
    ("sm90", 256, KernelConfig(64, 32, 4, 2)),         # D=256: the accumulator alone is 64 KB of registers
    ("sm80", 64, KernelConfig(128, 64, 4, 3)),
    ("sm80", 128, KernelConfig(128, 64, 8, 2)),
    ("sm80", 256, KernelConfig(64, 32, 4, 2)),
    # no AMD chip to time: the largest tiles that build for gfx1151 (RDNA) and gfx942 (CDNA) with the fewest spills
    ("hip", 64, KernelConfig(64, 32, 4, 1)),           # no spills on either
    ("hip", 128, KernelConfig(64, 16, 8, 1)),          # no spills on either (32x16 in 2 warps: 21 on gfx1151)
    # 192-256: Q K^T as one product over 16 column chunks, a warp a chunk (Q held whole, 236-245 VGPRs of gfx11's 256,
    # spilled 62-116 registers beside a mask, a bias or a paged cache's pointers; chunked: 143-164, none spilled)
    ("hip", 256, KernelConfig(32, 16, 16, 1, qk_chunks=16)),  # none on gfx1151, gfx1100 or gfx942, in any of those
]
# AMD with a window, softcap, ALiBi or an attn_mask: tiles whose builds with all of them at once (and the LSE) spill
# none on gfx1151 or gfx942, where the rows above spilled 3-30 registers at 64 (gfx942; 23 on gfx1151 beside a mask),
# 2 at 128 (gfx1151) and 10 at 256 (gfx942) beside a mask
TILED_HIP_MODIFIED = [
    (64, KernelConfig(64, 16, 4, 1)),
    (128, KernelConfig(32, 16, 8, 1)),
    (256, KernelConfig(32, 16, 8, 1, qk_chunks=8)),
]

# The sm80 rows' GPUs (every CUDA GPU but sm_90, :func:`fmha.device.arch_of`) reading an attn_mask: the rows above
# spilled 100-118 registers beside a boolean mask in the sm_80 builds at head_dim 64 and 128 (114-143 at 256) and 11-56
# beside a bias; these spill none, boolean or bias, causal or not, beside a window, softcap and ALiBi too
# (tests/test_targets.py).  Read from sm_80 builds, not timed.
TILED_SM80_MASKED = [
    (64, KernelConfig(64, 64, 8, 2)),
    (128, KernelConfig(64, 32, 8, 2)),
    (256, KernelConfig(32, 32, 8, 2)),
]


# The Gluon sm_90 kernel: block_m = 64 x consumer warpgroups (64, 128 or 192), num_stages = ring depth.
# (head_dim, causal, longest seqlen_k) -> config, first match wins; each row the fastest beside its
# neighbours in one run on the H200 (docs/PERF.md, "The tables", has each measurement and its run).
O_VIA_Q_KEYS = 4096  # the longest seqlen_k whose 256-wide rows send O out through Q's tile (below)

HOPPER = [
    (64, False, 512, KernelConfig(128, 128, 4, 2, q_regs=1)),  # 192 rows pad short sequences; no stale here
    (64, False, 1024, KernelConfig(128, 128, 4, 2, q_regs=1, stale=1)),  # the standing pivot from 1k keys
    (64, False, None, KernelConfig(192, 128, 4, 2, pingpong=1, stale=1)),  # three warpgroups take turns
    (64, True, 512, KernelConfig(64, 64, 4, 2, q_regs=1, balance=1, occupancy=3)),  # 3 short programs an SM
    (64, True, 4096, KernelConfig(128, 128, 4, 2, q_regs=1, balance=1)),  # the last rounds dealt by LPT
    # 192 rows once items are long; the standing pivot on the tiles every row sees whole (+1.8-2.4% at 8k-16k)
    (64, True, 16384, KernelConfig(192, 128, 4, 2, balance=1, stale=1)),
    (64, True, None, KernelConfig(192, 128, 4, 2)),
    (128, False, 512, KernelConfig(128, 128, 4, 2, pingpong=1, head_group=2, q_regs=1, fence=1, stale=1)),
    # up to 16k keys: 2-CTA clusters read each K/V tile once for both (multicast)
    (128, False, 16384, KernelConfig(128, 128, 4, 2, head_group=2, q_regs=1, fence=1, cluster=1, stale=1)),
    (128, False, None, KernelConfig(128, 128, 4, 3, q_regs=1, fence=1, stale=1)),  # a head's K/V past L2: 3 stages
    (128, True, 512, KernelConfig(64, 64, 4, 2, q_regs=1, occupancy=2, stale=1)),  # 2 short programs an SM
    (128, True, 2048, KernelConfig(128, 128, 4, 2, q_regs=1)),
    (128, True, 16384, KernelConfig(128, 128, 4, 2, q_regs=1, stale=1)),  # the standing pivot from 4k: +1.7-4.1%
    (128, True, None, KernelConfig(128, 128, 4, 3, q_regs=1)),
    # 256-wide tiles (head_dim 192 and 256): O's 64 x 256 accumulator takes 128 registers a thread,
    # so 64-key tiles and Q in shared memory (Q and the rings fill it: O has no stage of its own); non-causal, the
    # standing pivot spares the 128 registers' rescale and the two warpgroups take turns: +2-3% from 4k keys;
    # causal, up to 4k keys the lazy pivot (+3.3-5.9% beside the row without it in one run, plain calls: with
    # modifiers :func:`hopper_config` drops it), past them the standing one (+2.8% at 16k against the lazy one).
    # Up to 4k keys O goes out by TMA through each warpgroup's Q tile (``o_via_q``): +10-17% at 1k keys, +1-5% at 4k;
    # at 16k, where an item's end weighs least, 1% slower than O stored from registers without causal, even causal
    # (docs/PERF.md)
    (256, False, O_VIA_Q_KEYS, KernelConfig(128, 64, 4, 2, pingpong=1, stale=1, o_via_q=1)),
    (256, False, None, KernelConfig(128, 64, 4, 2, pingpong=1, stale=1)),
    (256, True, O_VIA_Q_KEYS, KernelConfig(128, 64, 4, 2, lazy=1, o_via_q=1)),
    (256, True, None, KernelConfig(128, 64, 4, 2, stale=1)),  # (one spilled register, outside the key loop)
]


# DeepSeek's q/k 192 with a V of at most 128 columns: Q and K unpadded (a 128- and a 64-column tile) leave room
# for 128-key tiles in two stages (213 KB); 1.00-1.09x the 256 row in one run, causal; O, which has no stage of its
# own, out through Q's 128-column tile on plain calls: +6% at 1k keys, +1-1.5% at 4k-16k (docs/PERF.md)
HOPPER_SPLIT_QK = KernelConfig(128, 128, 4, 2, split_qk=1, o_via_q=1)


# head_dim 80 and 96 without causal past 2k keys, whole 64-key tiles, no modifiers: 192 x 64 tiles in 3 stages (three
# consumer warpgroups, which 64-key tiles keep at 160 registers beside the padded 128-column P V; Q K^T over the head
# dim's own columns): at 96 +4-7% at 4k-16k keys against the 128 rows' clusters (two runs), -8% at 1k; at 80 +6% at
# 4k and 16k, -5% at 1k, causal 3-4% slower (docs/PERF.md, "Every head dim")
HOPPER_NARROW_LONG = KernelConfig(192, 64, 4, 3, fence=1, stale=1)
NARROW_LONG_DIMS = (80, 96)
NARROW_LONG_KEYS = 2048


# head_dim 96 causal deals its last rounds by LPT (``balance``) where it was timed so, past 512 keys and up to 16k
# (the 128-row, 2-stage row): +1.7-2.9% (docs/PERF.md, "Every head dim")
LPT_96_KEYS = (512, 16384)


# a causal window alone at head_dim 128: work items numbered block by block across (up to) this many heads, so the
# blocks whose band is whole (the longest) go first and the short ones at each head's start fill the last round;
# +2-10% at 4k tokens (docs/PERF.md, "Beyond the default grid")
WINDOW_HEAD_GROUP = 1024


# float8 q, k, v on the Gluon kernel (head_dim 64, 96 and 128): 128-key tiles of one-byte elements, V^T's too (64-key
# tiles, two warpgroups or three in turns, tied at best and lost up to 20%); Q in shared memory, no clusters, no
# standing pivot (``hopper.fp8_reason``); rows as ``HOPPER``'s: (head_dim, causal, longest seqlen_k or None, config).
# At 64 the lazy pivot without causal (+1-8%), and past 1k keys (2k causal) three warpgroups of 64 rows taking turns,
# bf16's form there: +7-15% over the 128 rows from 2k keys, far slower short; a third stage within +-3% (docs/PERF.md,
# "Float8 on the Gluon kernel")
HOPPER_FP8 = [
    (64, False, 1024, KernelConfig(128, 128, 4, 2, lazy=1)),
    (64, False, None, KernelConfig(192, 128, 4, 2, pingpong=1, lazy=1)),
    (64, True, 2048, KernelConfig(128, 128, 4, 2)),
    (64, True, None, KernelConfig(192, 128, 4, 2, pingpong=1)),
    (128, False, None, KernelConfig(128, 128, 4, 2, fence=1)),
    (128, True, None, KernelConfig(128, 128, 4, 2)),
]


def _too_wide(cfg: KernelConfig, modifiers: bool, per_sequence: bool, seqlen_k: int) -> bool:
    """192 rows where three consumer warpgroups at 160 registers spill (:func:`hopper_config`): beside the
    modifiers, lengths per sequence or a ragged last key tile; those calls take 128."""
    return cfg.block_m == 192 and bool(modifiers or per_sequence or seqlen_k % cfg.block_n)


def hopper_config(head_dim: int, causal: bool, seqlen_k: int, modifiers: bool = False,
                  per_sequence: bool = False, seqlen_q: int = 0, fp8: bool = False,
                  head_dim_v: int = 0, window_only: bool = False) -> KernelConfig:
    """The ``hopper`` entry for this shape (a head dim takes the rows of its tile width,
    ``hopper.padded``: 32 (in 32-wide tiles) and 64 the 64 rows, 96 and 128 the 128 rows, 192 and 256 the 256 rows; with
    ``per_sequence`` lengths, varlen or seqused_k, ``seqlen_k`` is the longest).  With a window,
    softcap or ALiBi, or key lengths off the key tile (per sequence: any), 192 rows become 128:
    three consumer warpgroups at 160 registers spill on the extra live values (up to 117
    registers with the modifiers, 48 stores with the ragged key mask, sm_90 build), two at 240
    do not.  With the modifiers at D=128, Q stays in shared memory (in registers, 23 spilled
    registers with window, softcap and ALiBi, causal; 134 with a window, non-causal), except under a causal
    window alone (``window_only``: 0-4 spilled registers, 2-7% faster at 4k tokens); so it does for a
    causal head dim padded to its tile (96), whose Q K^T then skips the zero columns
    (``hopper.qk_slices``: 1-3% faster at D=96, docs/PERF.md), with D=128's pivot (the standing one from 4k keys:
    in the exact one 80 and 96 ran 2.4-3.6% faster at 1k) and the last rounds dealt by LPT (``balance``:
    2-3% faster there); with them or lengths per sequence, no clusters (``hopper.supports``), nor for a V in a
    narrower tile than q/k's (80/40), nor where ``seqlen_q`` (0: not known) makes an odd number of query blocks
    (FlashAttention-3's rule): a cluster runs two blocks, and the partner of a last lone block would compute rows
    that do not exist (a 2x loss where a head has one block).  ``fp8``: float8
    q, k and v take the ``HOPPER_FP8`` row of their head dim and keys (none: the 16-bit rows, which
    ``hopper.fp8_reason`` then refuses), 192 rows becoming 128 as above.  ``head_dim_v`` (0: q/k's): q/k 192
    with V's 128 or fewer takes ``HOPPER_SPLIT_QK``; 80 and 96 without causal past ``NARROW_LONG_KEYS`` keys, dense
    and in whole key tiles, ``HOPPER_NARROW_LONG``.  O out through Q's tile (``o_via_q``: the 256 rows up to
    ``O_VIA_Q_KEYS`` where V is as wide as q/k, and ``HOPPER_SPLIT_QK``) only on plain 16-bit calls."""
    if head_dim == SPLIT_QK_DIM and 0 < head_dim_v <= 128 and not fp8:
        return replace(HOPPER_SPLIT_QK, o_via_q=0) if modifiers or per_sequence else HOPPER_SPLIT_QK
    if (head_dim in NARROW_LONG_DIMS and head_dim_v in (0, head_dim)
            and not (causal or fp8 or modifiers or per_sequence)
            and seqlen_k > NARROW_LONG_KEYS and seqlen_k % HOPPER_NARROW_LONG.block_n == 0):
        return HOPPER_NARROW_LONG
    d = padded(head_dim, 64)
    for key_d, key_causal, longest, cfg in HOPPER_FP8 if fp8 else ():
        if key_d == d and key_causal == bool(causal) and (longest is None or seqlen_k <= longest):
            return replace(cfg, block_m=128, pingpong=0) if _too_wide(cfg, modifiers, per_sequence, seqlen_k) else cfg
    for key_d, key_causal, longest, cfg in HOPPER:
        if key_d == d and key_causal == bool(causal) and (longest is None or seqlen_k <= longest):
            if causal and head_dim != padded(head_dim):  # Q K^T over its own columns; 96 the LPT rounds
                lpt = d == 128 and LPT_96_KEYS[0] < seqlen_k <= LPT_96_KEYS[1]
                cfg = replace(cfg, q_regs=0, balance=int(cfg.balance or lpt))
            elif modifiers and d == 128 and not (window_only and causal):
                cfg = replace(cfg, q_regs=0)
            elif window_only and causal and d == 128:  # full bands first, across the heads
                cfg = replace(cfg, head_group=WINDOW_HEAD_GROUP)
            if modifiers:  # the lazy pivot was timed without them; beside a window at 256 it spills (sm_90 build);
                # causal, the standing pivot beside a window, softcap and ALiBi spilled 167-312 registers (D=64-256)
                cfg = replace(cfg, lazy=0, stale=0 if causal else cfg.stale)
            if modifiers or per_sequence or -(-seqlen_q // cfg.block_m) % 2 or padded(head_dim_v or head_dim, 64) != d:
                cfg = replace(cfg, cluster=0)
            if modifiers or per_sequence or fp8 or padded(head_dim_v or head_dim, 64) != d:  # timed on plain calls
                cfg = replace(cfg, o_via_q=0)  # (packed sequences at 256 spill 6 registers with it, sm_90 build)
            return replace(cfg, block_m=128) if _too_wide(cfg, modifiers, per_sequence, seqlen_k) else cfg
    raise AssertionError("the HOPPER table ends with an open row for every (head_dim, causal)")


def decode_config(rows: int, seqlen_k: int, head_dim: int = 128, arch: str = "sm90",
                  modifiers: bool = False) -> KernelConfig:
    """Decoding (keys split over programs): a block just big enough for the program's query
    rows (seqlen_q, times the GQA group when packed), 16 to 64; memory-bound, so mma.sync
    tiles suffice, and K/V read by TMA (``tma=1``; the caller drops it where the call cannot take
    it).  One query block: as many splits as fill each SM once (``split_per_sm=1``), twice in 64-key tiles to
    head_dim 64 (half a tile's bytes in flight: 1.09-1.14x at batch 8, 1k-4k keys, on an H100); from 8k keys
    128-key tiles in 3 stages (192 KB in flight), shorter caches 64-key tiles; past head_dim 128 the
    64-key tiles keep 3 stages (4 would need 256 KB).  MLA's absorbed form: its ``arch``'s :func:`mla_config`;
    AMD: :func:`amd_decode_config` (``modifiers``: a window, softcap, ALiBi or an attn_mask).
    Measurements: docs/PERF.md, "Decoding"."""
    block_m = min(64, max(16, 1 << (rows - 1).bit_length()))
    if head_dim > 256:  # MLA's absorbed form: a 512-wide accumulator
        mla = mla_config(arch)
        return replace(mla, block_m=min(block_m, mla.block_m), split_per_sm=1)
    if arch == "hip":
        return amd_decode_config(block_m, head_dim, modifiers)
    if block_m > 16:
        return KernelConfig(block_m, 64, 4, 3, tma=1)
    if seqlen_k >= 8192 and head_dim <= 128:
        return KernelConfig(16, 128, 4, 3, split_per_sm=1, tma=1)
    return KernelConfig(16, 64, 4, 3, split_per_sm=2 if head_dim <= 64 else 1, tma=1)


def amd_decode_config(block_m: int, head_dim: int, modifiers: bool = False) -> KernelConfig:
    """Decoding on AMD, with no chip to time: one stage (the NVIDIA rows' three stages of 64-128 keys ask for
    96-128 KB of LDS at head_dim 128-256, past the 64 KB a workgroup gets) and the largest key tiles that build
    without spills for gfx1151 (RDNA) and gfx942 (CDNA); past head_dim 128 16-key tiles, 16 rows in 8 warps or 32 in
    16 (at 256 none spill on either chip; 32 rows in 8 warps spilled 2 registers on gfx1151, 64 rows 4), so more rows
    take more blocks of 32, and Q K^T over 16 column chunks, as :data:`TILED`'s row there (Q held whole, gfx1151
    spilled 62-69 registers reading a paged cache, 88-115 beside a mask; chunked, none).  With ``modifiers`` (the
    registers of every modifier and a mask at once, in builds with all of them) 32-key tiles for 16 rows to head_dim
    64 (the 64-key ones spilled 5-41 registers on gfx1151), at most 32 rows a block to 128 and 16 past it (64 rows at
    128 spilled 2 on gfx1151, 32 at 256 3 on gfx942)."""
    one_block = dict(split_per_sm=1) if block_m == 16 else {}
    if head_dim <= 64:
        return KernelConfig(block_m, 64 if block_m == 16 and not modifiers else 32, 8, 1, **one_block)
    if modifiers:
        block_m = min(block_m, 32 if head_dim <= 128 else 16)
        one_block = dict(split_per_sm=1) if block_m == 16 else {}
    if head_dim <= 128:
        return KernelConfig(block_m, 16, 4 if block_m == 16 else 8, 1, **one_block)
    return KernelConfig(min(block_m, 32), 16, 8 if block_m == 16 else 16, 1, qk_chunks=16, **one_block)


# float8 K/V (dequantized on load): the 16-bit copies of the float8 tiles beside 128-key tiles spill 16-18
# registers at head_dim 96-128 (sm_90 build), 64-key tiles in 8 warps none from 32 to 128; the rest as TILED
TILED_FP8 = [
    ("sm90", 128, KernelConfig(128, 64, 8, 3)),
]

# ``tiled`` with attention dropout (sm_90 at 64 and 128: the H200, bf16, `fmha bench --grid dropout`, three candidates
# a head dim in one run, docs/PERF.md; the rest not timed): the draws' Philox words and the kept pairs beside the
# accumulator spilled 102-113 registers in sm_90's 128 x 64 four-warp tiles at 64, 173-187 in 128 x 128 at 128 and
# 88 in 64 x 32 at 256; on sm_80 189 in 128 x 64 at 128 and 158 in 64 x 32 at 256.  These spill none (sm_80 at 256:
# 3 registers)
TILED_DROPOUT = [
    ("sm90", 64, KernelConfig(64, 64, 4, 3)),
    ("sm90", 128, KernelConfig(128, 64, 8, 3)),
    ("sm90", 256, KernelConfig(64, 32, 8, 2)),
    ("sm80", 64, KernelConfig(64, 64, 4, 3)),
    ("sm80", 128, KernelConfig(64, 64, 8, 2)),
    ("sm80", 256, KernelConfig(64, 32, 8, 2)),
]


# MLA's absorbed form (q/k 576 = 512 + 64, V 512), by arch, not yet timed on a GPU.  NVIDIA: a [32, 512] float32
# accumulator and 512-wide K tiles of 32 keys over 8 warps (64 registers a thread for the accumulator; no
# spills on sm_90).  AMD: Q K^T as one batched product over 16 chunks of the latent's columns, a chunk a warp
# (``qk_chunks``), in 16-row blocks of 16-key tiles: no spills on gfx942, gfx1100 or gfx1151 (113, 212, 212 VGPRs).
# With Q's 576 columns held whole by every warp, RDNA spilled at every shape (699 registers at 32 rows, 8 warps,
# which gfx942 built without spills); its column chunks read again at each key tile spilled more (889-2077)
MLA = {"hip": KernelConfig(16, 16, 16, 2, qk_chunks=16)}
MLA_DEFAULT = KernelConfig(32, 32, 8, 2)


def mla_config(arch: str) -> KernelConfig:
    """The absorbed form's ``tiled`` config on ``arch``."""
    return MLA.get(arch, MLA_DEFAULT)


def tiled_config(arch: str, head_dim: int, fp8: bool = False, modifiers: bool = False,
                 masked: bool = False, dropout: bool = False) -> KernelConfig:
    """The ``tiled`` entry for ``arch`` at ``head_dim`` (padded to a power of two); ``fp8``: float8 K/V's;
    ``modifiers``: a window, softcap, ALiBi or an attn_mask (AMD: :data:`TILED_HIP_MODIFIED`); ``masked``: an
    attn_mask (sm80: :data:`TILED_SM80_MASKED`); ``dropout``: attention dropout (:data:`TILED_DROPOUT`)."""
    if head_dim > 256:
        return mla_config(arch)
    for key, max_d, cfg in TILED_DROPOUT if dropout and not masked else ():
        if key == arch and head_dim <= max_d:
            return cfg
    for max_d, cfg in TILED_HIP_MODIFIED if arch == "hip" and modifiers else ():
        if head_dim <= max_d:
            return cfg
    for max_d, cfg in TILED_SM80_MASKED if arch == "sm80" and masked and not fp8 else ():
        if head_dim <= max_d:
            return cfg
    for key, max_d, cfg in TILED_FP8 if fp8 else ():
        if key == arch and head_dim <= max_d:
            return cfg
    for key, max_d, cfg in TILED:
        if key == arch and head_dim <= max_d:
            return cfg
    for key, max_d, cfg in TILED:  # an arch not in the table takes the sm80 rows
        if key == "sm80" and head_dim <= max_d:
            return cfg
    raise ValueError(f"no tiled config for arch={arch!r}, head_dim={head_dim}")


def fit_shared(cfg: KernelConfig, block_d: int, block_dv: int, attn_mask: bool | str, limit: int = SMEM_LIMIT,
               major: int = 9, dropout: bool = False) -> KernelConfig:
    """A ``tiled`` config in as many stages as fit ``limit`` bytes of shared memory on a GPU of compute capability
    ``major``, counted as :func:`tiled_smem` counts them.  On sm_90 beside an attn_mask: 128 x 128 tiles at head_dim
    128 take two stages (three asked for 256 KB), a split's 64 x 64 at 256 two (240 KB); on an A100 (163 KB) a split's
    64 x 64 at 256 two (168 KB in three); on sm_86 / sm_89 (99 KB) a decode's 128-key tiles at 128 two (136 KB)."""
    while cfg.num_stages > 1 and tiled_smem(cfg, block_d, block_dv, attn_mask, major, dropout) > limit:
        cfg = replace(cfg, num_stages=cfg.num_stages - 1)
    return cfg


def tiled_smem(cfg: KernelConfig, block_d: int, block_dv: int, attn_mask: bool | str, major: int = 9,
               dropout: bool = False) -> int:
    """Shared memory ``tiled`` may take, 16-bit tiles ``block_d`` (q/k) and ``block_dv`` (V) wide, as Triton's builds
    took it: on sm_90 ``num_stages`` K/V tiles and Q's (224 KB at 128 x 128, D=128, three stages) and beside an
    attn_mask (True: boolean; ``"bias"``: an additive float one) up to 4 bytes a score more (256 KB there), a bias's
    float32 tiles in ``num_stages - 1`` of the pipeline's stages (352 KB there; 240 KB at D=64, where a boolean mask
    took 176); on sm_80 ``num_stages - 1`` K/V tiles (one stage: K's tile once, for its layout) and Q's, and a
    scratch of up to 8 KB that the mask's up to 4 bytes a score share (168 KB at 64 x 64, D=256, three stages; 72 KB
    in one); with attention dropout two bytes a score more, a margin: draws made in another layout than the scores'
    crossed shared memory there (240 KB at 128 x 128, D=128, three stages, on sm_90: a byte a score), and the draws
    made where the scores lie (:func:`fmha.kernels.dropout.kept`) take none in the sm_90, sm_80, gfx942 and gfx1151
    builds; the margin stays until a GPU run shows the stages it would give back; and 1 KB for barriers."""
    if major >= 9:
        kv = cfg.num_stages * (block_d + block_dv)
    else:
        kv = (cfg.num_stages - 1) * (block_d + block_dv) or block_d
    scores = cfg.block_m * cfg.block_n * 4 if attn_mask else 0
    if attn_mask == "bias" and major >= 9:
        scores *= max(cfg.num_stages - 1, 1)
    scores += 2 * cfg.block_m * cfg.block_n if dropout else 0
    scratch = scores if major >= 9 else max(8192, scores)
    return kv * cfg.block_n * 2 + cfg.block_m * block_d * 2 + scratch + 1024


def default_config(variant: str, arch: str, head_dim: int, causal: bool = False, seqlen_k: int = 0,
                   modifiers: bool = False, per_sequence: bool = False, seqlen_q: int = 0,
                   fp8: bool = False, head_dim_v: int = 0, window_only: bool = False,
                   masked: bool = False, dropout: bool = False) -> KernelConfig:
    if variant in ("singlewave", "pipelined"):
        return SEED
    if variant == "tiled":
        return tiled_config(arch, head_dim, fp8, modifiers, masked, dropout)
    if variant == "hopper":
        return hopper_config(head_dim, causal, seqlen_k, modifiers, per_sequence, seqlen_q, fp8, head_dim_v,
                             window_only)
    raise ValueError(f"no config table for variant {variant!r}")
