"""Input validation: every error names the argument, what was given and what is accepted."""
from __future__ import annotations

import math

import torch

from .device import interpreting

HEAD_DIMS = tuple(range(8, 257, 8))  # every multiple of 8 up to 256, as FlashAttention takes them (Phi-2's 80 too)
HOPPER_HEAD_DIMS = tuple(range(32, 257, 8))  # the Gluon forward's: tiles of the next power of two, zeros past head_dim
TUNED_HEAD_DIMS = (32, 64, 96, 128, 192, 256)  # the head dims whose tiles were timed (the fuzzer's usual draw)
HEAD_DIMS_SAID = "a multiple of 8 from 8 to 256"
MLA_ABSORBED = (576, 512)  # DeepSeek's MLA decoded in its absorbed form: q/k 512 latent + 64 rope columns, V the latent
DTYPES = (torch.float16, torch.bfloat16)
FP8 = torch.float8_e4m3fn  # K and V (and q) of :func:`fmha.attention` with descale factors
LAYOUTS = ("bhsd", "bshd")
CAUSAL_ALIGNS = ("top_left", "bottom_right")


def variants(interpreter: bool = False) -> list[str]:
    """Names accepted by ``variant=`` (besides ``"auto"``); with ``interpreter=True`` only those
    the CPU interpreter runs (the Triton ones, not the Gluon ones)."""
    from . import kernels  # imported on first use: Triton fixes interpretation when a kernel is defined
    return list(kernels.VARIANTS if interpreter else kernels.ALL_VARIANTS)


def head_dims_reason(d: int, dv: int) -> str | None:
    """Why fmha does not take q/k's head dim ``d`` with V's ``dv``, or None: each in :data:`HEAD_DIMS`, or MLA's
    absorbed pair.  (A V head dim other than q/k's runs in a V tile of its own width, :func:`fmha.plan.v_tile`.)"""
    if (d, dv) == MLA_ABSORBED:
        return None
    if d not in HEAD_DIMS or dv not in HEAD_DIMS:
        return f"head_dim {d} with v's {dv}: each must be {HEAD_DIMS_SAID}"
    return None


def check_inputs(q, k, v, causal_align: str, layout: str, variant: str, scale, fp8: bool = False) -> None:
    """q, k, v of :func:`fmha.attention` (4-D in ``layout``) and its scalar choices; with ``fp8``, float8
    K and V (and q) are taken too (:func:`check_fp8`)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    if variant != "auto" and variant not in variants():
        raise ValueError(f"variant must be 'auto' or one of {variants()}, got {variant!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions ({layout}), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES and not (t.dtype == FP8 and fp8):
            where = "" if fp8 or t.dtype != FP8 else " (float8 inputs run through fmha.attention, forward only)"
            raise TypeError(f"{name} has dtype {t.dtype}; fmha takes float16 or bfloat16{where} "
                            f"(float32 inputs: cast them, accumulation is float32 anyway)")
    if k.dtype == FP8 or q.dtype == FP8:
        if not (k.dtype == v.dtype == FP8):
            raise TypeError(f"float8 attention takes float8_e4m3fn k and v (q float8 or 16-bit), got {q.dtype}, "
                            f"{k.dtype}, {v.dtype}")
    elif not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type == "cpu" and not interpreting():
        raise RuntimeError("fmha got CPU tensors but Triton's interpreter is off: move the tensors "
                           "to a GPU, or set TRITON_INTERPRET=1 before importing fmha to run the "
                           "same kernels on the CPU (slowly)")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"fmha runs on CUDA/ROCm GPUs (or the CPU interpreter), got device {q.device}")
    seq_dim, head_axis = (2, 1) if layout == "bhsd" else (1, 2)
    b, h, d = q.shape[0], q.shape[head_axis], q.shape[3]
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != b:
            raise ValueError(f"{name} has batch {t.shape[0]}, q has {b}")
    if k.shape[3] != d:
        raise ValueError(f"k has head_dim {k.shape[3]}, q has {d}")
    if k.shape[head_axis] != v.shape[head_axis] or k.shape[seq_dim] != v.shape[seq_dim]:
        raise ValueError(f"k and v must agree in kv_heads and seqlen_k ({layout}), got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    kv_heads = k.shape[head_axis]
    if kv_heads == 0 and h != 0 or kv_heads and h % kv_heads:
        raise ValueError(f"heads ({h}) must be a multiple of kv_heads ({kv_heads})")
    if (d, v.shape[3]) != MLA_ABSORBED:
        if d not in HEAD_DIMS:
            raise ValueError(f"head_dim must be {HEAD_DIMS_SAID} (or {MLA_ABSORBED[0]} with v's "
                             f"{MLA_ABSORBED[1]}: MLA's absorbed form), got {d}")
        if v.shape[3] not in HEAD_DIMS:
            raise ValueError(f"v's head_dim must be {HEAD_DIMS_SAID} (or {MLA_ABSORBED[1]} with q/k's "
                             f"{MLA_ABSORBED[0]}), got {v.shape[3]}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        raise ValueError(f"scale must be a finite number or None, got {scale!r}")


def check_features(q, layout: str, window, softcap, alibi_slopes, sinks=None, batch: int | None = None) -> None:
    """The score modifiers: a window, a softcap, ALiBi slopes (``[heads]``, or ``[batch, heads]``: ``batch`` the
    sequences', q's batch unless given); and attention sinks."""
    if window == (-1, -1) and softcap == 0.0 and alibi_slopes is None and sinks is None:  # none: nothing to check
        return
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, int) and w >= -1 for w in window)):
        raise ValueError(f"window must be (left, right) with ints >= -1 (-1: unbounded), got {window!r}")
    if not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    if alibi_slopes is not None:
        heads = q.shape[1] if layout == "bhsd" else q.shape[2]
        batch = q.shape[0] if batch is None else batch
        if (not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.shape not in ((heads,), (batch, heads))
                or alibi_slopes.dtype != torch.float32 or alibi_slopes.device != q.device):
            got = ((tuple(alibi_slopes.shape), alibi_slopes.dtype, alibi_slopes.device)
                   if isinstance(alibi_slopes, torch.Tensor) else type(alibi_slopes).__name__)
            raise ValueError(f"alibi_slopes must be a float32 tensor of shape ({heads},) or ({batch}, {heads}) on "
                             f"{q.device}, got {got}")
    if sinks is not None:
        heads = q.shape[1] if layout == "bhsd" else q.shape[2]
        if (not isinstance(sinks, torch.Tensor) or sinks.shape != (heads,) or sinks.dtype != torch.float32
                or sinks.device != q.device):
            got = (tuple(sinks.shape), sinks.dtype, sinks.device) if isinstance(sinks, torch.Tensor) \
                else type(sinks).__name__
            raise ValueError(f"sinks must be a float32 tensor of shape ({heads},) on {q.device}, got {got}")


MASK_DTYPES = (torch.bool, torch.float16, torch.bfloat16, torch.float32)  # a boolean attn_mask, or an additive bias


def attn_mask_view(attn_mask, q, k, layout: str) -> torch.Tensor:
    """``attn_mask`` (SDPA's: boolean, True where the key takes part, or a float bias added to the scores;
    broadcastable to ``[batch, heads, seqlen_q, seqlen_k]`` in every layout) checked and expanded to that shape
    (broadcast dimensions stride 0)."""
    batch, heads, seqlen_q = (q.shape[0], q.shape[1], q.shape[2]) if layout == "bhsd" else (
        q.shape[0], q.shape[2], q.shape[1])
    seqlen_k = k.shape[2] if layout == "bhsd" else k.shape[1]
    full = (batch, heads, seqlen_q, seqlen_k)
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    if attn_mask.dtype not in MASK_DTYPES:
        raise ValueError(f"attn_mask must be boolean (True: the key takes part) or a float16, bfloat16 or float32 "
                         f"bias added to the scores, got {attn_mask.dtype}")
    if attn_mask.device != q.device:
        raise ValueError(f"attn_mask must be on {q.device}, got {attn_mask.device}")
    try:
        if attn_mask.dim() > 4 or torch.broadcast_shapes(attn_mask.shape, full) != full:
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to [batch, heads, "
                         f"seqlen_q, seqlen_k] = {list(full)}") from None
    return attn_mask.expand(full)


def check_index(t, name: str, shape: tuple, device) -> None:
    """An int32 index tensor of ``shape`` on ``device`` (lengths, offsets, block tables)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != shape or t.device != device:
        got = (tuple(t.shape), t.dtype, t.device) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be an int32 tensor of shape {shape} on {device}, got {got}")


def check_splits(num_splits) -> None:
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: decide), got {num_splits!r}")


def check_dropout(dropout_p, k, sinks) -> None:
    """Attention dropout: a probability in [0, 1), on 16-bit K/V without sinks (whose denominator the kept pairs would
    not share)."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not 0.0 <= dropout_p < 1.0:
        raise ValueError(f"dropout_p must be a float in [0, 1), got {dropout_p!r}")
    if dropout_p and k.dtype == FP8:
        raise NotImplementedError("attention dropout with float8 K/V: float8 attention is for inference")
    if dropout_p and sinks is not None:
        raise NotImplementedError("attention dropout with attention sinks is not supported")


def check_packed_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k) -> None:
    """What of packed sequences the host knows without reading the device: 3-D q/k/v of one packed
    key length, int32 cu_seqlens of one length on q's device."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-dimensional tensor [total, heads, head_dim], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    for name, t in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be an int32 torch.Tensor [batch + 1], got {type(t).__name__}")
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must be 1-D of one length (batch + 1), got "
                         f"{tuple(cu_seqlens_q.shape)} and {tuple(cu_seqlens_k.shape)}")
    batch = cu_seqlens_q.shape[0] - 1
    check_index(cu_seqlens_q, "cu_seqlens_q", (batch + 1,), q.device)
    check_index(cu_seqlens_k, "cu_seqlens_k", (batch + 1,), q.device)
    if batch < 0:
        raise ValueError(f"cu_seqlens_q must start at 0, never decrease and end at {q.shape[0]} (the packed "
                         f"length), got []")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"k and v must have the same packed length, got {k.shape[0]} and {v.shape[0]}")


def check_cu_seqlens(both, total_q: int, total_k: int, max_seqlen_q: int, max_seqlen_k: int):
    """The values of both cu_seqlens, on the host (``both``: ``[2, batch + 1]``): start at 0, never
    decrease, end at the packed lengths, no sequence past its ``max_seqlen``.  Returns each sequence's
    (query rows, keys)."""
    batch = both.shape[1] - 1
    lengths = []
    for name, host, total, longest in (("cu_seqlens_q", both[0], total_q, max_seqlen_q),
                                       ("cu_seqlens_k", both[1], total_k, max_seqlen_k)):
        lengths.append(host[1:] - host[:-1])
        if batch < 0 or host[0] != 0 or host[-1] != total or (lengths[-1] < 0).any():
            raise ValueError(f"{name} must start at 0, never decrease and end at {total} (the packed length), "
                             f"got {host.tolist()}")
        if batch and int(lengths[-1].max()) > longest:
            raise ValueError(f"max_seqlen for {name} is {longest}, but a sequence has {int(lengths[-1].max())} rows")
    return lengths


def _v_like(q, v_cache):
    """What stands for V beside q in :func:`check_inputs` for a paged call: q, or its first columns where the
    pool's V is narrower (MLA's absorbed form: V the latent's 512 of q/k's 576); the pools' own checks follow."""
    if (isinstance(q, torch.Tensor) and isinstance(v_cache, torch.Tensor) and q.dim() == v_cache.dim() == 4
            and v_cache.shape[3] < q.shape[3]):
        return q[..., :v_cache.shape[3]]
    return q


def check_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, causal_align: str, variant: str, scale, window, softcap,
                      alibi_slopes, sinks) -> None:
    """Everything :func:`fmha.attention_varlen` checks on the host but whether autograd records it: the packed
    shapes and cu_seqlens, q, k and v as one bshd sequence, the modifiers."""
    check_packed_shapes(q, k, v, cu_seqlens_q, cu_seqlens_k)
    check_inputs(q[None], k[None], v[None], causal_align, "bshd", variant, scale)
    check_features(q[None], "bshd", window, softcap, alibi_slopes, sinks, batch=cu_seqlens_q.shape[0] - 1)


def check_paged_call(q, k_cache, v_cache, block_table, cache_seqlens, causal_align: str, layout: str, variant: str,
                     scale, window, softcap, alibi_slopes, sinks, num_splits: int) -> None:
    """Everything :func:`fmha.attention_paged` checks on the host: the variant, q (against the pool's V
    width), the modifiers, the pools and the table's shapes, the split count."""
    if variant not in ("auto", "tiled", "hopper"):
        raise ValueError(f"attention_paged runs variant 'auto', 'tiled' or 'hopper', got {variant!r}")
    check_inputs(q, q, _v_like(q, v_cache), causal_align, layout, variant, scale)
    check_features(q, layout, window, softcap, alibi_slopes, sinks)
    check_pages(q, k_cache, v_cache, block_table, cache_seqlens, layout)
    check_splits(num_splits)


def check_pages(q, k_cache, v_cache, block_table, cache_seqlens, layout: str) -> None:
    """A paged cache (:func:`fmha.attention_paged`): page pools ``[num_pages, page_size, kv_heads, D]``
    (V's D no larger than q/k's, a multiple of 8: DeepSeek's 192/128; the absorbed form's 512) and an
    int32 block table ``[batch, pages_per_seq]``.  The table's entries and the lengths are checked on the
    device (:mod:`fmha.kernels.guards`), not here."""
    batch, heads = q.shape[0], (q.shape[1] if layout == "bhsd" else q.shape[2])
    head_dim = q.shape[3]
    # the absorbed form: V the latent
    v_dims = (MLA_ABSORBED[1],) if head_dim == MLA_ABSORBED[0] else tuple(d for d in HEAD_DIMS if d <= head_dim)
    for name, t, dims in (("k_cache", k_cache, (head_dim,)), ("v_cache", v_cache, v_dims)):
        if (not isinstance(t, torch.Tensor) or t.dim() != 4 or t.shape[3] not in dims or t.dtype != q.dtype
                or t.device != q.device):
            d = dims[0] if len(dims) == 1 else f"D (a multiple of 8 up to {head_dim})"
            raise ValueError(f"{name} must be [num_pages, page_size, kv_heads, {d}] {q.dtype} on {q.device}, "
                             f"got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k_cache.shape[:3] != v_cache.shape[:3]:
        raise ValueError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    if page % 16 or page == 0:
        raise ValueError(f"k_cache must be a page pool [num_pages, page_size, kv_heads, head_dim] with page_size a "
                         f"multiple of 16, got shape {tuple(k_cache.shape)} (page_size {page}); a contiguous "
                         f"[batch, kv_heads, seqlen, head_dim] cache goes to fmha.attention (with seqused_k)")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be [batch={batch}, pages_per_seq], got {tuple(block_table.shape)}")
    check_index(block_table, "block_table", tuple(block_table.shape), q.device)
    check_index(cache_seqlens, "cache_seqlens", (batch,), q.device)


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        lo = t.data_ptr()
        hi = lo + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) * t.element_size()
        return lo, hi + t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def output_dtype(q) -> torch.dtype:
    """The output's dtype: q's, bfloat16 for float8 q."""
    return torch.bfloat16 if q.dtype == FP8 else q.dtype


def check_out(out, q, k, v) -> None:
    """``out=``: q's shape with v's head dim, the output's dtype (:func:`output_dtype`) and q's device,
    overlapping no input."""
    shape = (*q.shape[:-1], v.shape[-1])
    dtype = output_dtype(q)
    if tuple(out.shape) != shape or out.dtype != dtype or out.device != q.device:
        raise ValueError(f"out must have q's shape with v's head_dim, dtype and device {shape}, {dtype}, "
                         f"{q.device}; got {tuple(out.shape)}, {out.dtype}, {out.device}")
    if torch._debug_has_internal_overlap(out) == 1:
        raise ValueError(f"out has elements that share memory (strides {tuple(out.stride())}, a broadcast): each "
                         "output element needs a place of its own; pass a tensor from torch.empty")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if _overlaps(out, t):
            raise ValueError(f"out overlaps {name}: the kernel reads {name} while writing out")


def check_forward_only(q, v, grad: bool) -> None:
    """MLA's absorbed form (q/k 576, v 512) decodes: it has no backward."""
    if grad and (q.shape[-1], v.shape[-1]) == MLA_ABSORBED:
        raise NotImplementedError(f"q/k head dim {MLA_ABSORBED[0]} with v's {MLA_ABSORBED[1]} (MLA's absorbed form) "
                                  f"has no backward: it is for decoding; train MLA in its 192/128 form")


def check_fp8(q, k, layout: str, descales, sinks, grad: bool) -> None:
    """Float8 attention (k and v float8_e4m3fn, q float8 or 16-bit): each descale factor float32
    ``[batch, kv_heads]`` on q's device (FlashAttention-3's ``q_descale``, ``k_descale``, ``v_descale``),
    forward only, no sinks; 16-bit inputs take no descale factors."""
    names = ("q_descale", "k_descale", "v_descale")
    if k.dtype != FP8:
        given = [n for n, t in zip(names, descales) if t is not None]
        if given:
            raise ValueError(f"{', '.join(given)} scale float8 inputs; q, k, v are {q.dtype}")
        return
    if grad:
        raise NotImplementedError("float8 attention has no backward: run it under torch.no_grad() "
                                  "(or train in bfloat16)")
    if sinks is not None:
        raise NotImplementedError("float8 attention takes no attention sinks")
    if q.is_cuda and (torch.version.hip or torch.cuda.get_device_capability(q.device) < (8, 9)):
        raise NotImplementedError("float8_e4m3fn K/V need an NVIDIA GPU of compute capability 8.9 or newer "
                                  "(Triton's float8 conversions)")
    if q.dtype != FP8 and descales[0] is not None:
        raise ValueError(f"q_descale scales a float8 q; q is {q.dtype}")
    kv_heads = k.shape[1] if layout == "bhsd" else k.shape[2]
    shape = (q.shape[0], kv_heads)
    for name, t in zip(names, descales):
        if t is not None and (not isinstance(t, torch.Tensor) or t.dtype != torch.float32
                              or tuple(t.shape) != shape or t.device != q.device):
            got = f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a float32 tensor of shape [batch, kv_heads] = {list(shape)} on "
                             f"{q.device}, got {got}")
