"""The Triton variants and the one launch path they share.

Each variant module exports ``KERNEL``, a ``@triton.jit`` function with the
common signature (pointers, strides in ``b, h, s, d`` order, sizes, constexprs).
Adding a variant: its module, its config table in :mod:`fmha.configs`, one
line in :data:`VARIANTS`.
"""
from __future__ import annotations

import torch

from .. import replay
from ..device import device_facts
from . import pipelined, singlewave, tiled, tma
from .common import MASK_BIAS, MASK_BOOL, MASK_NONE
from .dropout import launch_args as dropout_args

VARIANTS = {  # Triton: every target, and the CPU interpreter
    "singlewave": singlewave.KERNEL,
    "pipelined": pipelined.KERNEL,
    "tiled": tiled.KERNEL,
}
PARAMETERS = {name: frozenset(kernel.arg_names) for name, kernel in VARIANTS.items()}  # (which options each takes)
# Gluon: one GPU generation each, imported on first use (no interpreter)
GLUON_VARIANTS = ("hopper",)
ALL_VARIANTS = (*VARIANTS, *GLUON_VARIANTS)


def strides_bhsd(t: torch.Tensor, layout: str) -> tuple[int, int, int, int]:
    """Strides in (batch, head, seq, dim) order for a tensor in ``layout``."""
    s = t.stride()
    return (s[0], s[1], s[2], s[3]) if layout == "bhsd" else (s[0], s[2], s[1], s[3])


def unsupported_problem(variant: str, prob) -> str | None:
    """Why ``variant`` cannot take ``prob`` whatever its config (the config table may have no row for it), or
    None."""
    if prob.fp8 and variant not in ("tiled", "hopper"):
        return "float8 K/V run on the tiled variant (dequantized on load) or, with float8 q, on hopper"
    if prob.qk_lo and variant != "tiled":
        return "q/k head dim 576 (MLA's absorbed form) runs on the tiled variant"
    if prob.attn_mask and variant != "tiled":
        return "an attn_mask runs on the tiled variant"
    if prob.dropout and variant != "tiled":
        return "attention dropout runs on the tiled variant"
    return None


def alibi_kind(alibi) -> int:
    """The kernels' ``ALIBI`` for slopes ``alibi``: 0 none, 1 one a head (``[heads]``), 2 one a (batch, head)
    (``[batch, heads]``, FlashAttention's other form; the Triton kernels')."""
    return 0 if alibi is None else alibi.dim()


def unsupported(variant: str, cfg, prob, q, k, v, o, layout: str, alibi: int = 0) -> str | None:
    """Why ``variant`` cannot take this call (``alibi``: its :func:`alibi_kind`), or None."""
    why = unsupported_problem(variant, prob)
    if why:
        return why
    if variant == "hopper":
        from . import hopper
        if alibi == 2:
            return "ALiBi slopes per (batch, head) run on the Triton kernels"
        if prob.fp8 and alibi:  # (the descale factors would scale the bias with the scores)
            return "float8 on hopper takes no ALiBi"
        return hopper.supports(prob, cfg, q, k, v, o, layout)
    if prob.head_dim_v and variant != "tiled":
        return "a V head dim other than q/k's is the tiled variant's"
    if cfg.qk_chunks and (cfg.qk_chunks < 0 or cfg.qk_chunks & (cfg.qk_chunks - 1)):
        return f"config qk_chunks={cfg.qk_chunks}: Q K^T's column chunks come in a power of two"
    if cfg.tma:
        if variant != "tiled":
            return "K/V by TMA (config tma=1) is the tiled variant's"
        if prob.varlen or prob.page or prob.block_d != prob.head_dim or prob.head_dim_v:
            return "K/V by TMA take one (batch, head) sequence of a power-of-two head_dim (not varlen or paged)"
        why = tma.kv_reason(k, v, layout)
        if why:
            return why
        if q.is_cuda and device_facts(q.device.index)[0] < 9:
            return "K/V by TMA need an sm_90 GPU or newer"
    return None


def v_from_k(prob, k, v) -> bool:
    """Whether V is K's first columns (MLA's absorbed form passes the latent cache twice, V a slice of it):
    then K's tile serves as V's and V is not read again."""
    return bool(prob.qk_lo) and prob.dv == prob.block_d and v.data_ptr() == k.data_ptr() and v.stride() == k.stride()


def amd_build(q: torch.Tensor) -> bool:
    """Whether a launch over ``q`` builds for an AMD GPU (ROCm's torch, a GPU tensor): the kernels with an ``AMD``
    constexpr then order their loops and loads for its registers."""
    return torch.version.hip is not None and q.is_cuda


def launch(variant: str, cfg, prob, q, k, v, o, lse, layout: str, alibi=None, seqs=(None, None, None),
           grid_m: int | None = None, split_len: int = 0, block_table=None, longest=None, descale=None,
           merge=None, attn_mask=None, checks=None, dropout=None) -> None:
    """Run ``variant`` with ``cfg`` on ``prob``: writes ``o`` (and ``lse`` if not None).
    ``seqs = (cu_seqlens_q, cu_seqlens_k, seqused_k)``; ``grid_m`` rows cover the longest sequence;
    ``longest``: packed sequences' max_seqlen_q and max_seqlen_k (the room of ``hopper``'s work list).
    ``split_len > 0``: keys split in chunks of that many (flash-decoding); ``o`` is then a float32
    ``[splits, batch, heads, seqlen_q, D]`` workspace and ``lse`` ``[splits, batch, heads, seqlen_q]``.
    ``descale`` (``prob.fp8``): float32 ``[batch * kv_heads, 3]``, each (batch, kv head)'s q, k and v factors.
    ``merge = (out, out_lse)`` (``tiled``, split): the split that ends each row block last merges the partials
    into ``out`` (in ``layout``) and, when not None, ``out_lse`` (``[batch, heads, seqlen_q]``).
    ``attn_mask`` (``tiled``): a boolean ``[batch, heads, seqlen_q, seqlen_k]`` view (any strides) joining the band.
    ``checks = (num_pages, max_seqlen_q, max_seqlen_k)`` (``tiled``, paged or packed): the kernel checks the block
    table and cache_seqlens, or the cu_seqlens, itself (:func:`fmha.forward.self_checked`).  ``dropout = (seed,
    dropout_p)`` (``tiled``, ``prob.dropout``): the seed tensor and probability of :mod:`.dropout`."""
    if variant == "hopper":
        from . import hopper
        return hopper.launch(prob, cfg, q, k, v, o, lse, layout, alibi, seqs, longest, block_table, descale)
    kernel, params = VARIANTS[variant], PARAMETERS[variant]
    splits = -(-prob.seqlen_k // split_len) if split_len else 1
    grid = (*prob.grid(cfg.block_m, grid_m), splits)
    cu_q, cu_k, seqused = seqs
    strides = [list(strides_bhsd(t, layout)) for t in (q, k, v)]
    strides.append(list(o.stride()[1:]) if split_len else list(strides_bhsd(o, layout)))
    if prob.varlen:  # packed: the batch index picks a sequence through cu_seqlens, not a stride
        for st in strides:
            st[0] = 0
    a = prob.align_offset  # the kernel adds each sequence's own diagonal back
    kv_tma = bool(cfg.tma)
    if kv_tma:  # K/V as 3-D TMA descriptors: boxes [1, BLOCK_N, D] of one (batch, kv head)
        from triton.tools.tensor_descriptor import TensorDescriptor
        kv = [(t, tma.kv_view(t, layout)) for t in (k, v)]
        k_desc, v_desc = (TensorDescriptor(t, list(w.shape), list(w.strides), [1, cfg.block_n, prob.head_dim])
                          for t, w in kv)
        kv_place = (kv[0][1].batch, kv[0][1].head, kv[0][1].col)
    else:
        k_desc, v_desc, kv_place = k, v, (0, 0, 0)
    replay.launch(
        kernel, grid, q, k, v, o, lse if lse is not None else o, *strides[0], *strides[1], *strides[2], *strides[3],
        prob.heads, prob.heads // prob.kv_heads, prob.seqlen_q, prob.seqlen_k,
        prob.causal_offset - a, prob.scale_log2,
        (prob.window_offset or 0) - a, 0, prob.softcap, alibi.contiguous() if alibi is not None else o,
        cu_q if cu_q is not None else o, cu_k if cu_k is not None else o, seqused if seqused is not None else o,
        split_len, o.stride(0) if split_len else 0, lse[0].numel() if split_len and lse is not None else 0,
        block_table if block_table is not None else o, block_table.stride(0) if block_table is not None else 0,
        block_table.shape[1] if block_table is not None else 0, k_desc, v_desc, *kv_place,
        HEAD_DIM=prob.head_dim - prob.qk_lo, BLOCK_D=prob.block_d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        CAUSAL=prob.causal, STORE_LSE=lse is not None, WINDOW=prob.window_offset is not None,
        SOFTCAP=prob.softcap > 0, ALIBI=alibi_kind(alibi), VARLEN=prob.varlen, SEQUSED=prob.seqused,
        ALIGN_BR=prob.align_br, SPLIT=bool(split_len), PAGED=bool(prob.page), PAGE=max(prob.page, 1),
        PACK_GQA=prob.pack_gqa, KV_TMA=kv_tma,
        **(dict(HEAD_V=prob.dv, BLOCK_DV=prob.block_dv) if "HEAD_V" in params else {}),
        **(dict(Descale=descale if descale is not None else o, FP8=prob.fp8) if "FP8" in params else {}),
        **(dict(QK_LO=prob.qk_lo, V_FROM_K=v_from_k(prob, k, v)) if "QK_LO" in params else {}),
        **(dict(AMD=amd_build(q)) if "AMD" in params else {}),
        **(dict(QK_CHUNKS=cfg.qk_chunks) if "QK_CHUNKS" in params else {}),
        **(_merge_args(merge, layout, q.device, grid, o) if "MERGE" in params else {}),
        **(mask_args(attn_mask, o) if "ATTN_MASK" in params else {}),
        **(dict(MASK_UNIT=mask_unit(attn_mask, q)) if "MASK_UNIT" in params else {}),
        **(_check_args(checks) if "CHECKED" in params else {}),
        **dropout_args(dropout),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _check_args(checks) -> dict:
    """The arguments of a kernel that checks the indices it follows (``checks = (num_pages, max_seqlen_q,
    max_seqlen_k)``), built as :data:`.guards.CHECK_OPTIONS` says, or of one that does not (None)."""
    if checks is None:
        return dict(num_pages=0, max_seqlen_q=0, max_seqlen_k=0, CHECKED=False)
    from .guards import CHECK_OPTIONS
    num_pages, max_q, max_k = checks
    return dict(num_pages=num_pages, max_seqlen_q=max_q, max_seqlen_k=max_k, CHECKED=True, **CHECK_OPTIONS)


def mask_kind(attn_mask) -> int:
    """The kernels' ``ATTN_MASK`` for ``attn_mask``: none, boolean or an additive float bias."""
    kind = MASK_NONE if attn_mask is None else MASK_BOOL if attn_mask.dtype == torch.bool else MASK_BIAS
    return kind.value


def mask_unit(attn_mask, q) -> bool:
    """Whether ``tiled`` reads ``attn_mask``'s keys as lying next to each other (its ``MASK_UNIT``): where they do,
    on NVIDIA GPUs of compute capability 9 and above, where that was timed (3.2-3.9x the stride read at run time on
    an H100, a boolean mask).  Not on sm_80 and sm_89, whose builds spill 4876 registers so at head_dim 128 (100 with
    the stride read at run time; not timed), nor on AMD GPUs (the seed's chip builds without spills only so)."""
    if attn_mask is None or attn_mask.stride(-1) != 1 or not q.is_cuda:
        return False
    index = q.device.index if q.device.index is not None else torch.cuda.current_device()
    return mask_unit_on("hip" if amd_build(q) else "cuda", device_facts(index)[0])


def mask_unit_on(backend: str, major: int) -> bool:
    """Whether a launch on a GPU of ``backend`` ("cuda", "hip") and compute capability ``major`` reads a unit-stride
    attn_mask as such (:func:`mask_unit`; the ahead-of-time builds ask too)."""
    return backend == "cuda" and major >= 9


def mask_args(attn_mask, o) -> dict:
    """The arguments of a kernel that reads an attn_mask (``tiled``, the backward's), for a ``[batch, heads, seqlen_q,
    seqlen_k]`` view, or for none (``o``: any tensor, never read)."""
    if attn_mask is None:
        return dict(AttnMask=o, stride_mb=0, stride_mh=0, stride_mq=0, stride_mk=0, ATTN_MASK=MASK_NONE.value)
    mb, mh, mq, mk = attn_mask.stride()
    kind = mask_kind(attn_mask)  # (a boolean one read as bytes: the kernel tests them against 0)
    return dict(AttnMask=attn_mask.view(torch.uint8) if kind == MASK_BOOL.value else attn_mask, stride_mb=mb,
                stride_mh=mh, stride_mq=mq, stride_mk=mk, ATTN_MASK=kind)


def _merge_args(merge, layout: str, device, grid, o) -> dict:
    """The tiled kernel's arguments for a split launch that merges its own partials (``merge = (out,
    out_lse)``), or for one that does not (None)."""
    if merge is None:
        return dict(Out=o, stride_fb=0, stride_fh=0, stride_fs=0, stride_fd=0, LseOut=o, Tickets=o, MERGE=False,
                    MERGE_LSE=False)
    out, out_lse = merge
    fb, fh, fs, fd = strides_bhsd(out, layout)
    return dict(Out=out, stride_fb=fb, stride_fh=fh, stride_fs=fs, stride_fd=fd,
                LseOut=out_lse if out_lse is not None else o, Tickets=replay.tickets(device, grid[0] * grid[1]),
                MERGE=True, MERGE_LSE=out_lse is not None)
