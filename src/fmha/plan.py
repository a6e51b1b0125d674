"""Planning one call: the problem, its visible band, the variant and config that run it, GQA packing
and the key split.  Nothing here launches; :mod:`fmha.forward` does."""
from __future__ import annotations

import dataclasses
import math

import torch

from . import configs
from .constants import LOG2E
from .device import arch_of, device_facts, index_of, shared_limit, shared_of


@dataclasses.dataclass(frozen=True)
class Problem:
    """One attention call, checked: sizes, masking and the base-2 scale."""
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool          # the band has an upper edge: key j <= i + causal_offset
    causal_offset: int
    scale_log2: float
    window_offset: int | None = None  # the band's lower edge: key j >= i + window_offset
    align_offset: int = 0             # the diagonal (0, or seqlen_k - seqlen_q bottom-right)
    softcap: float = 0.0
    align_br: bool = False            # bottom-right: per sequence under varlen / seqused_k
    varlen: bool = False              # packed sequences (cu_seqlens); seqlen_q/k are the packed totals
    seqused: bool = False             # per-batch key lengths
    page: int = 0                     # paged K/V: keys per page (0: contiguous K/V)
    pack_gqa: bool = False            # a program's rows: the query heads of one KV head, interleaved
    head_dim_v: int = 0               # V's and O's head dimension when it differs from q/k's (MLA), else 0
    fp8: bool = False                 # float8 K and V (and q), dequantized on load by their descale factors
    attn_mask: bool | str = False     # a mask [batch, heads, seqlen_q, seqlen_k] joins the band: True boolean,
    #                                   "bias" an additive float one (:func:`mask_kind`)
    dropout: bool = False             # attention dropout (:mod:`fmha.kernels.dropout`): dense rows, one launch

    def grid(self, block_m: int, rows: int | None = None) -> tuple[int, int]:
        """(row blocks, batch * heads per program axis) covering ``rows`` queries (default seqlen_q)."""
        rows = self.seqlen_q if rows is None else rows
        if self.pack_gqa:
            return -(-rows * (self.heads // self.kv_heads) // block_m), self.batch * self.kv_heads
        return -(-rows // block_m), self.batch * self.heads

    @property
    def qk_lo(self) -> int:
        """Q K^T's columns past a power of two, taken as a second slice (MLA's absorbed 576 = 512 + 64), else 0."""
        return 64 if self.head_dim == 576 else 0

    @property
    def block_d(self) -> int:
        """q/k's tile width: the head dim's power of two (the first slice's, with :attr:`qk_lo`)."""
        return max(16, 1 << (self.head_dim - self.qk_lo - 1).bit_length())

    @property
    def dv(self) -> int:
        """V's and O's head dimension."""
        return self.head_dim_v or self.head_dim

    @property
    def block_dv(self) -> int:
        """V's tile width (:func:`v_tile`)."""
        return v_tile(self.head_dim, self.dv)


def v_tile(head_dim: int, dv: int) -> int:
    """V's and O's tile width in the Triton kernels: V's head dim's power of two, and at least 64 columns beside a
    q/k head dim of another width.  On sm_90 Triton's wgmma builds of a 16- or 32-column V beside such a K answered
    wrongly or faulted, reading shared memory out of bounds (compute-sanitizer: invalid 1024-byte shared reads):
    V's columns masked (8, 24) beside q/k 24, 40, 56, 72 and 104, and any of them (16, 32 too) beside any q/k in
    tiles of one stage; in 64-column tiles every pair was exact."""
    width = max(16, 1 << (dv - 1).bit_length())
    return max(width, 64) if dv != head_dim else width


def sizes(q, k, layout: str) -> tuple[int, int, int, int, int, int]:
    """``(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim)`` of q and k in ``layout``."""
    if layout == "bhsd":
        return q.shape[0], q.shape[1], k.shape[1], q.shape[2], k.shape[2], q.shape[3]
    return q.shape[0], q.shape[2], k.shape[2], q.shape[1], k.shape[1], q.shape[3]


def band(causal: bool, window, align: int):
    """(upper edge on?, upper offset, lower offset or None) of the visible band around ``i + align``."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return right >= 0, (align + right if right >= 0 else 0), (align - left if left >= 0 else None)


def problem(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, *, causal, scale, window=(-1, -1),
            causal_align="top_left", softcap=0.0, varlen=False, seqused=False, page=0, head_dim_v=0,
            fp8=False, attn_mask=False, dropout=False) -> Problem:
    """The :class:`Problem` of a checked call: the band placed on the diagonal its alignment picks
    (per sequence when ``varlen``), and ``scale`` (default ``1/sqrt(head_dim)``) folded with log2(e)."""
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    align = 0 if causal_align == "top_left" or varlen else seqlen_k - seqlen_q
    upper, causal_offset, window_offset = band(causal, tuple(window), align)
    return Problem(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, upper, causal_offset, scale * LOG2E,
                   window_offset=window_offset, align_offset=align, softcap=float(softcap),
                   align_br=causal_align == "bottom_right", varlen=varlen, seqused=seqused, page=page,
                   head_dim_v=head_dim_v if head_dim_v != head_dim else 0, fp8=fp8, attn_mask=attn_mask,
                   dropout=dropout)


def mask_kind(attn_mask) -> bool | str:
    """:attr:`Problem.attn_mask` for an attn_mask tensor (or None): False, True (boolean) or ``"bias"`` (an additive
    float one, whose tiles take more shared memory: :func:`fmha.configs.tiled_smem`), as the kernels tell them
    (:func:`fmha.kernels.mask_kind`)."""
    from . import kernels
    return {kernels.MASK_NONE.value: False, kernels.MASK_BOOL.value: True,
            kernels.MASK_BIAS.value: "bias"}[kernels.mask_kind(attn_mask)]


def select_variant(arch: str, shape: dict | None = None) -> str:
    """``variant="auto"``: the fastest correct variant measured on ``arch`` for a problem of
    ``shape`` (keys ``head_dim``, ``seqlen_q``, ``seqlen_k``, ``causal``, and ``varlen``: packed
    sequences, the lengths then the longest).  A call the chosen kernel cannot take (see
    ``kernels.unsupported``) falls back to ``tiled``."""
    shape = shape or {}
    if shape.get("seqlen_q", 1 << 30) <= 16:
        return "tiled"  # decoding: the keys split over programs (flash-decoding), GQA rows packed
    if arch == "sm90" and shape.get("varlen") and shape.get("causal") and shape.get("head_dim") == 64:
        return "tiled"  # packed causal D=64: hopper 0.85-1.00x tiled (docs/PERF.md, packed sequences)
    if arch == "sm90":  # float8 prefill too: its wgmma runs 1.7-2.8x the tiled kernel's dequantize-on-load
        return "hopper"  # (docs/PERF.md); what it refuses (16-bit q, head_dim 32 or 192+, softcap, varlen) falls back
    return "tiled"


def _split_len(num_splits: int, arch: str, prob: Problem, cfg, device) -> tuple[int, int]:
    """(the split count asked for, keys per split: a multiple of cfg.block_n), or (0, 0) for no split.  The
    split count never falls as seqlen_k grows, and for one count the keys per split never fall either (a
    decode's family spans the lengths planned alike: :func:`fmha.replay.lengthwise`)."""
    block_n = cfg.block_n
    if num_splits == 0:  # decide: split short queries over long keys until each SM has its share of programs
        if arch == "interpreter" or prob.seqlen_q > 16 or prob.seqlen_k < 4 * block_n:
            return 0, 0
        programs = math.prod(prob.grid(cfg.block_m))
        sms = device_facts(index_of(device))[1]
        tiles = prob.seqlen_k // block_n
        # a memory-bound loop: more programs keep more loads in flight; rounded down, so the programs
        # never spill past per_sm * SMs into a last, nearly empty wave.  A split takes four key tiles or more,
        # unless that leaves SMs without a program: then as many splits as fill each SM once, down to a tile
        # each (batch 1 at 1k keys: 16 splits of one tile ran 1.27-1.31x four splits of four, docs/PERF.md "Decoding")
        per_sm = cfg.split_per_sm or 4
        num_splits = max(min(per_sm * sms // programs, tiles // 4), min(sms // programs, tiles))
    if num_splits <= 1:
        return 0, 0
    return num_splits, -(-(-(-prob.seqlen_k // num_splits)) // block_n) * block_n


def _pack_gqa(prob: Problem, alibi_slopes) -> Problem:
    """Decoding with GQA (seqlen_q <= 16, several query heads per KV head): one program takes
    the whole group's rows, so each K/V tile is read once per group (not with ALiBi, whose
    slope is per head)."""
    if prob.seqlen_q <= 16 and prob.heads > prob.kv_heads and alibi_slopes is None:
        return dataclasses.replace(prob, pack_gqa=True)
    return prob


def _split_plan(num_splits: int, arch: str, prob: Problem, cfg, device, variant: str, fixed: bool = False,
                modifiers: bool = False):
    """(config, split count asked for, keys per split): a split launch of ``tiled`` on a GPU runs the decode
    config (a few query rows: small blocks, the keys spread over programs) unless the caller fixed one.
    The seed's one-warp variants keep their own: the decode table's tiles are ``tiled``'s (``pipelined`` at
    head_dim 192-256 in its 64 x 64 tiles, three stages, asks for 256 KB of shared memory, past the H200's 227)."""
    splits, split_len = _split_len(num_splits, arch, prob, cfg, device)
    if split_len and not fixed and variant == "tiled" and arch != "interpreter":
        rows = prob.seqlen_q * (prob.heads // prob.kv_heads if prob.pack_gqa else 1)
        cfg = configs.decode_config(rows, prob.seqlen_k, prob.head_dim, arch, modifiers)
        splits, split_len = _split_len(num_splits, arch, prob, cfg, device)
    return cfg, splits, split_len


@dataclasses.dataclass(frozen=True)
class Plan:
    variant: str
    config: configs.KernelConfig
    problem: Problem
    split_len: int = 0  # keys per split (flash-decoding), 0: none
    splits: int = 0  # the split count asked for (the launch's may be fewer: the keys per split rounded up)

    def by_length(self) -> tuple:
        """What the plan decided from seqlen_k besides the launches' integers (the variant, the config, the split
        count asked for, the keys per split and the launch's split count): each value holds on one span of
        lengths, for a decode (:func:`fmha.replay.lengthwise`)."""
        launched = -(-self.problem.seqlen_k // self.split_len) if self.split_len else 1
        return self.variant, self.config, self.splits, self.split_len, launched


def plan(prob: Problem, q, k, v, o, layout: str, variant: str, config, alibi_slopes, num_splits: int,
         longest=None, growing: bool = False) -> Plan:
    """What runs a checked call: the variant (``auto`` picks, falling back to ``tiled`` when the pick
    cannot take the call), its config, GQA packing for decoding and the key split (not for packed
    sequences, whose ``longest`` query and key lengths stand for the shape).  ``growing``: K and V are a cache that
    grows into a new tensor at every call (:func:`fmha.replay.growing`), which a split decode reads by pointer, not
    by TMA as the decode table says."""
    from . import kernels
    arch = arch_of(q.device)
    seqlen_q, seqlen_k = longest or (prob.seqlen_q, prob.seqlen_k)
    shape = {"head_dim": prob.head_dim, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "causal": bool(prob.causal),
             "varlen": prob.varlen}
    name = select_variant(arch, shape) if variant == "auto" else variant
    scores_modified = prob.softcap > 0 or alibi_slopes is not None or prob.attn_mask
    modifiers = prob.window_offset is not None or scores_modified
    reason = kernels.unsupported_problem(name, prob)  # before the config: the variant's table may have no row
    if not reason:
        cfg = config or configs.default_config(name, arch, prob.head_dim, prob.causal, seqlen_k, modifiers,
                                               per_sequence=prob.varlen or prob.seqused, seqlen_q=seqlen_q,
                                               fp8=prob.fp8, head_dim_v=prob.head_dim_v,
                                               window_only=prob.window_offset is not None and not scores_modified,
                                               masked=prob.attn_mask, dropout=prob.dropout)
        reason = kernels.unsupported(name, cfg, prob, q, k, v, o, layout, kernels.alibi_kind(alibi_slopes))
    if reason and variant == "auto":
        name = "tiled"
        cfg = configs.default_config(name, arch, prob.head_dim, prob.causal, modifiers=modifiers, fp8=prob.fp8,
                                     masked=prob.attn_mask, dropout=prob.dropout)
    elif reason:
        raise ValueError(f"variant {name!r} cannot take this call: {reason}")
    splits = split_len = 0
    if name != "hopper" and not prob.varlen and not prob.dropout:  # (dropout's pairs: dense rows, one launch)
        prob = _pack_gqa(prob, alibi_slopes)
        cfg, splits, split_len = _split_plan(num_splits, arch, prob, cfg, q.device, name, fixed=config is not None,
                                             modifiers=modifiers)
        # the decode table's TMA, where the call can take it, but not for float8 K/V (decoded 5-20% slower by TMA
        # than by pointer on the H200, bench/fp8_speed.py) nor for a cache that grows into a new tensor at every call
        # (transformers' in generate()): its two descriptors filled a call cost more host time than TMA saves on the
        # GPU (inside generate() on an H100, 8-20 us a call against 0.6-2.2 us of GPU time at head_dim 128, none at
        # 64: docs/PERF.md, "The host side"); a cache that stays fills its descriptors once.  A caller's config keeps
        # its TMA where the call can take it.
        if cfg.tma and (kernels.unsupported(name, cfg, prob, q, k, v, o, layout)
                        or config is None and (prob.fp8 or growing)):
            cfg = dataclasses.replace(cfg, tma=0)
    if name == "tiled" and arch in ("sm90", "sm80"):
        major, limit = _shared(q.device, arch)
        fitted = configs.fit_shared(cfg, prob.block_d, prob.block_dv, prob.attn_mask, limit, major, prob.dropout)
        if config is None:
            cfg = fitted
        elif fitted != cfg:  # the caller's config would die in Triton's compiler or at the launch
            what = "K's and V's tiles a stage, Q's" + (", the mask's scores" if prob.attn_mask else "")
            raise ValueError(f"variant {name!r} cannot take this call: config {cfg} asks for more shared memory than "
                             f"this GPU has ({limit >> 10} KB: {what}); num_stages={fitted.num_stages} fits")
    return Plan(name, cfg, prob, split_len, splits)


def _shared(device: torch.device, arch: str) -> tuple[int, int]:
    """(compute capability major, shared memory a block may take) of ``device``; off a GPU, ``arch``'s own (sm90:
    an H200's, sm80: an A100's)."""
    if device.type == "cuda":
        return device_facts(index_of(device))[0], shared_limit(index_of(device))
    major = 9 if arch == "sm90" else 8
    return major, shared_of(major, 0)


def describe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
             variant: str = "auto", window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
             alibi_slopes: torch.Tensor | None = None, layout: str = "bhsd", dropout_p: float = 0.0) -> str:
    """What :func:`fmha.attention` runs for this call (top-left): variant, config, and
    GQA packing / key split when used.  For benchmark ledgers."""
    prob = problem(*sizes(q, k, layout), causal=causal, scale=None, window=window, softcap=softcap,
                   head_dim_v=v.shape[3], fp8=k.dtype == torch.float8_e4m3fn, dropout=dropout_p > 0)
    p = plan(prob, q, k, v, q, layout, variant, None, alibi_slopes, 0)
    extra = (" packed-gqa" if p.problem.pack_gqa else "") + (f" split {p.split_len}" if p.split_len else "")
    return f"{p.variant} {p.config}{extra}"
