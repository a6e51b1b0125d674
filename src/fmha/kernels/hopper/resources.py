"""What a program needs of an SM: shared memory (rings, Q, O's stage), registers per thread of the
producer and the consumers (``setmaxnreg``), and the launch options that follow."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


SMEM_LIMIT = 232448  # bytes of shared memory one sm_90 block may use


SMEM_SM = 233472  # bytes of shared memory on one SM, 1 KB of it reserved for each resident block


REGS_SM = 65536  # 32-bit registers on one SM


CONSUMER_REGS = {2: 240, 3: 160}  # setmaxnreg per consumer thread, by warpgroup count (one program per SM)


PRODUCER_REGS = gl.constexpr(24)


SMEM_SPARE = 1024  # bytes left for the mbarriers


SPLIT_QK_DIM = 192  # the q/k head dim ``KernelConfig.split_qk`` holds as a 128- and a 64-column tile


# the least scale (times log2 e) the Gluon kernels take: the forward divides by the scale (ALiBi's slopes and the
# softcap meet the scores before it), the backward's S^T starts at -LSE / scale, finite for any LSE below 2^60
MIN_SCALE = 2.0 ** -60


def padded(head_dim: int, least: int = 32) -> int:
    """The tile width a head dim runs in: a power of two, ``least`` at least (TMA fills the columns past
    head_dim with zeros, and stores none of them)."""
    return max(least, 1 << (head_dim - 1).bit_length())


@gluon.constexpr_function
def tile_layout(width, rank=2, bits=16):
    """The NVMMA shared layout of a ``rank``-dimensional tile (or TMA box) whose rows are ``width`` elements:
    what TMA writes and the wgmma read, swizzled over 128 bytes or the row where it is narrower (a 32-wide
    16-bit tile: 64; TMA splits a wider row into boxes of 128 bytes)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=min(128, width * bits // 8), element_bitwidth=bits, rank=rank)


def _tiles(head_dim: int, head_dim_v: int | None, cfg) -> tuple[int, int]:
    """The columns q/k's and v's tiles hold (``cfg.split_qk``: q/k's own, in a 128- and a 64-column tile)."""
    return head_dim if cfg.split_qk else padded(head_dim), padded(head_dim_v or head_dim)


def _inputs_bytes(head_dim: int, cfg, head_dim_v: int | None, in_bytes: int) -> int:
    """Q's tile and the K/V rings, of ``in_bytes``-byte elements (1: float8 q, k and v; V^T's tiles as V's)."""
    d, dv = _tiles(head_dim, head_dim_v, cfg)
    return in_bytes * (cfg.block_m * d + cfg.num_stages * cfg.block_n * (d + dv))


def _o_bytes(head_dim: int, cfg, head_dim_v: int | None) -> int:
    """O's staging tile (16-bit, float8 inputs' too)."""
    return 2 * cfg.block_m * _tiles(head_dim, head_dim_v, cfg)[1]


def _p_bytes(cfg, in_bytes: int = 2) -> int:
    """P's tiles in shared memory (``cfg.p_smem``: a ``[64, block_n]`` tile for each consumer warpgroup, of V's
    ``in_bytes``-byte elements)."""
    return in_bytes * cfg.block_m * cfg.block_n if cfg.p_smem else 0


def o_staged(head_dim: int, cfg, head_dim_v: int | None = None, in_bytes: int = 2) -> bool:
    """Whether O (16-bit, float8 inputs' too) goes out through shared memory (a TMA store) beside Q, the
    K/V rings and P's tiles; where it does not fit (16-bit D=128 with 3 stages, D=256), each thread stores its
    part of O from registers."""
    return (_inputs_bytes(head_dim, cfg, head_dim_v, in_bytes) + _p_bytes(cfg, in_bytes)
            + _o_bytes(head_dim, cfg, head_dim_v) + SMEM_SPARE <= SMEM_LIMIT)


def o_via_q_reason(head_dim: int, cfg, head_dim_v: int | None = None, in_bytes: int = 2) -> str | None:
    """Why O cannot go out through Q's shared tile (``cfg.o_via_q``), or None: Q's tile (``split_qk``: its
    128-column one) must be O's (16-bit, as wide) and stay in shared memory until the item's last Q K^T, on one
    CTA."""
    d, dv = _tiles(head_dim, head_dim_v, cfg)
    if in_bytes != 2 or dv != (128 if cfg.split_qk else d) or cfg.cluster or cfg.q_regs:
        return ("o_via_q takes 16-bit q whose tile (split_qk: the 128-column one) is V's width, held in shared "
                "memory (no float8, clusters or Q in registers)")
    return None


def p_smem_reason(cfg) -> str | None:
    """Why P cannot reach P V through shared memory (``cfg.p_smem``), or None: on one CTA (no clusters, whose
    programs' shared tiles are laid out across both CTAs)."""
    if cfg.cluster:
        return "p_smem takes programs of one CTA (no clusters)"
    return None


def o_stage(head_dim: int, cfg, head_dim_v: int | None = None, in_bytes: int = 2) -> int:
    """How O goes out: 1 through a shared-memory stage of its own (:func:`o_staged`), 2 through Q's tile once the
    item's last Q K^T has retired (``cfg.o_via_q``, where no stage of its own fits; the next item's Q then loads
    after the store has read it), 0 from registers, each thread its part."""
    if o_staged(head_dim, cfg, head_dim_v, in_bytes):
        return 1
    return 2 if cfg.o_via_q and o_via_q_reason(head_dim, cfg, head_dim_v, in_bytes) is None else 0


def smem_bytes(head_dim: int, cfg, head_dim_v: int | None = None, in_bytes: int = 2) -> int:
    """Shared memory one program allocates: Q, the K/V rings, P's tiles (``cfg.p_smem``) and, staged, O."""
    o = _o_bytes(head_dim, cfg, head_dim_v) if o_staged(head_dim, cfg, head_dim_v, in_bytes) else 0
    return _inputs_bytes(head_dim, cfg, head_dim_v, in_bytes) + _p_bytes(cfg, in_bytes) + o


def sm_bytes(head_dim: int, cfg, head_dim_v: int | None = None, in_bytes: int = 2) -> int:
    """Shared memory ``cfg.occupancy`` programs take on one SM (each with its barriers and the 1 KB
    the SM keeps for every resident block)."""
    return max(cfg.occupancy, 1) * (smem_bytes(head_dim, cfg, head_dim_v, in_bytes) + SMEM_SPARE + 1024)


def launch_regs(cfg) -> int:
    """Registers per thread a program launches with (``maxnreg``; 0: Triton's choice, where the
    consumers' ``CONSUMER_REGS`` and the producer's 24 average out over the warpgroups).  The
    producer's one warp is padded to a warpgroup, and the first consumer warpgroup, Gluon's default
    partition, keeps what the others leave of ``warpgroups * maxnreg``: so with ``occupancy``
    programs on an SM, or one consumer warpgroup, the launch count sets the consumers' share of the
    SM's registers (setmaxnreg takes 24 to 256)."""
    groups = cfg.block_m // 64 + 1
    if cfg.block_m >= 128 and cfg.occupancy <= 1:
        return 0
    fair = REGS_SM // (max(cfg.occupancy, 1) * 128 * groups) // 8 * 8
    return min(fair, (256 * (groups - 1) + int(PRODUCER_REGS)) // groups // 8 * 8)


def consumer_regs(cfg) -> int:
    """setmaxnreg of the consumer warpgroups that are workers (all but the first): the table's
    ``maxnreg``, or an even share of what :func:`launch_regs` leaves beside the producer."""
    if cfg.maxnreg:
        return cfg.maxnreg
    regs = launch_regs(cfg)
    if not regs:
        return CONSUMER_REGS[cfg.block_m // 64]
    wgs = cfg.block_m // 64
    return ((wgs + 1) * regs - int(PRODUCER_REGS)) // wgs // 8 * 8


def launch_options(cfg) -> dict:
    """The compile options beyond ``num_warps`` (``maxnreg`` where :func:`launch_regs` sets one)."""
    regs = launch_regs(cfg)
    options = {"maxnreg": regs} if regs else {}
    if cfg.cluster:
        options["num_ctas"] = 2
    return options
