"""The public entry points, thin: check the inputs, then run the one checked call of
:mod:`fmha.forward` (which plans and launches), through autograd when it records the call
(:mod:`fmha.gradients`)."""
from __future__ import annotations

import torch

from . import configs, forward
from .checks import (attn_mask_view, check_dropout, check_features, check_forward_only, check_fp8, check_index,
                     check_inputs, check_out, check_paged_call, check_splits, check_varlen_call, variants)
from . import gradients
from .plan import describe, select_variant
from .sinks import attach as attach_sinks

__all__ = ["attention", "attention_varlen", "attention_paged", "describe", "select_variant", "variants"]


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, variant: str = "auto", causal_align: str = "top_left",
              layout: str = "bhsd", return_lse: bool = False, out: torch.Tensor | None = None,
              window: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
              seqused_k: torch.Tensor | None = None, num_splits: int = 0, sinks: torch.Tensor | None = None,
              deterministic: bool = False, config: configs.KernelConfig | None = None,
              q_descale: torch.Tensor | None = None, k_descale: torch.Tensor | None = None,
              v_descale: torch.Tensor | None = None, attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0):
    """Exact attention ``softmax(scale * q k^T) v``, computed flash-style (no score matrix).

    Shapes (``layout="bhsd"``): ``q`` ``[batch, heads, seqlen_q, head_dim]``, ``k`` and
    ``v`` ``[batch, kv_heads, seqlen_k, head_dim]`` with ``heads`` a multiple of
    ``kv_heads`` (GQA/MQA).  ``layout="bshd"``: ``[batch, seq, heads, head_dim]``,
    read through strides without copies.  float16 or bfloat16; head_dim a multiple
    of 8 up to 256 (v's may differ from q/k's: MLA's 192/128); any seqlen >= 0.  Returns
    ``o`` in q's layout and dtype with v's head dim (a new tensor, never an alias of an input), and with ``return_lse``
    also the natural-log log-sum-exp, float32 ``[batch, heads, seqlen_q]``.

    ``scale`` defaults to ``1/sqrt(head_dim)``; the kernels receive
    ``scale * log2(e)`` and use exp2.  ``causal=True`` masks key j for query i
    unless ``j <= i`` (``causal_align="top_left"``, torch SDPA's ``is_causal``) or
    ``j <= i + seqlen_k - seqlen_q`` (``"bottom_right"``, FlashAttention 2.1+).

    Edges: a query row with no visible key (``seqlen_k == 0``, or causal
    bottom-right with ``seqlen_q > seqlen_k``) gives 0 and LSE ``-inf``, never NaN;
    an empty batch, heads or seqlen_q gives an empty result without a launch.

    ``variant``: ``"auto"`` (the fastest for this device) or one of
    :func:`variants`; ``config`` overrides the variant's tuned
    :class:`~fmha.configs.KernelConfig` (for sweeps).  ``out``: a tensor of q's
    shape, dtype and device to write into (any strides; it must not overlap an input).
    CPU tensors run only under Triton's interpreter (``TRITON_INTERPRET=1``).
    Under ``torch.compile`` the call goes through the custom op ``fmha::attention``
    (:mod:`fmha.custom_op`), the modifiers and sinks below with it; a call with ``out`` or ``config``
    runs eagerly there (a graph break).

    Modifiers (every variant takes them):
    ``window=(left, right)``: query i sees keys ``i + d - left <= j <= i + d + right``
    around its diagonal ``d`` (0 top-left, ``seqlen_k - seqlen_q`` bottom-right; -1 leaves
    a side open; ``causal`` closes the right side at 0); key tiles outside the band
    are skipped whole.  ``softcap > 0``: scores become ``softcap * tanh(s / softcap)``.
    ``alibi_slopes`` (float32 ``[heads]``, or ``[batch, heads]`` as FlashAttention also takes them: a slope per
    (batch, head), run on the Triton kernels): score ``- slope_h * |i + d - j|``.
    ``seqused_k`` (int32 ``[batch]``): batch b uses only its first ``seqused_k[b]`` keys
    (key padding; values past seqlen_k are clamped); bottom-right alignment then uses
    that length.  For packed variable-length batches see :func:`attention_varlen`.
    ``sinks`` (float32 ``[heads]``, learnable attention sinks as in gpt-oss): head h's logit joins every
    row's softmax denominator and brings no value (not scaled; a row that sees no key returns 0 and LSE
    ``sink_h``); differentiable (:mod:`fmha.sinks`).

    ``attn_mask``: SDPA's boolean mask, True where a key takes part, broadcastable to ``[batch, heads,
    seqlen_q, seqlen_k]`` whatever the layout (transformers' 4-D masks as they are), joined with the band
    and modifiers above; a row it leaves no key gives 0 (SDPA's math gives NaN there); a key it hides takes
    part as ``0 * v`` (NaN in its value reaches the row, as in SDPA; in its key it does not).  It runs on the
    ``tiled`` variant, which reads the mask's rows tile by tile (the band's own tiles are skipped whole, the
    mask's are not: pass ``causal``/``window`` for what is a band and the mask for the rest);
    differentiable through the Triton backward, which reads it too (a non-finite key it hides still
    reaches dQ, ``0 * k`` in dS K, as in SDPA).  A float ``attn_mask`` (float16, bfloat16 or float32) is SDPA's
    additive one: added to each score after the scale (and the softcap), ``-inf`` hiding a key; a bias that
    requires grad gets its gradient, the gradient of each score, summed over the dimensions it broadcast.
    ``dropout_p``: attention dropout, as SDPA's and FlashAttention's: each probability is dropped with probability
    ``dropout_p`` (in steps of 2^-16) and the kept ones scaled by one over the share kept, after the softmax (its
    denominator counts every key); the pairs drawn from torch's generator on q's device (``torch.manual_seed``
    repeats them), the same pairs again in the backward, on the ``tiled`` variant and the Triton backward
    (:mod:`fmha.kernels.dropout`); :func:`attention_varlen` takes it too.
    SDPA applies it whenever it is given, as here: pass 0 outside training.  Not with float8, sinks, or under
    ``torch.compile``.
    ``num_splits``: split the keys over that many programs per query block and merge
    the partials by their LSE (flash-decoding); 0 (default) decides: on a GPU, short
    queries (seqlen_q <= 16) against long keys are split to fill the chip; 1 never splits.

    Float8: ``k`` and ``v`` ``torch.float8_e4m3fn`` (an FP8 KV cache), ``q`` float8 too or 16-bit, with
    FlashAttention-3's descale factors ``q_descale``, ``k_descale``, ``v_descale`` (float32 ``[batch, kv_heads]``,
    1 where not given): the attention of ``q * q_descale``, ``k * k_descale``, ``v * v_descale``; the output is
    bfloat16 for float8 q.  On sm_90, float8 q, k and v past 16 query rows at head_dim 64, 96 or 128 run on ``hopper``'s
    float8 wgmma; elsewhere the ``tiled`` variant runs it, K and V read as float8 (half the bytes) and dequantized
    on load; forward only, not under ``torch.compile``.

    Differentiable (:mod:`fmha.gradients`, docs/BACKWARD.md) when autograd records the call;
    ``deterministic=True`` makes the backward's dQ bit for bit the same on every run, as FlashAttention's flag
    does (the Triton kernels: its own pass over the keys; the Gluon kernel: its adds in one fixed order).
    """
    if (out is None and attn_mask is None and not dropout_p and sinks is None and alibi_slopes is None
            and seqused_k is None and q_descale is None and k_descale is None and v_descale is None
            and _replayable((q, k, v), window=window, softcap=softcap) and not gradients.needs_grad(q, k, v)
            and not torch.compiler.is_compiling()):  # a plain call whose kind was met: replayed, nothing else made
        hit = forward.replayed_dense(q, k, v, causal, scale, variant, causal_align, layout, return_lse, config,
                                     window, float(softcap), num_splits)
        if hit is not None:
            o, lse = hit
            return (o, lse) if return_lse else o
    descales = (q_descale, k_descale, v_descale)
    mask = None if attn_mask is None else attn_mask_view(attn_mask, q, k, layout)

    def checks():
        check_inputs(q, k, v, causal_align, layout, variant, scale, fp8=True)
        check_fp8(q, k, layout, descales, sinks, gradients.needs_grad(q, k, v, mask))
        check_forward_only(q, v, gradients.needs_grad(q, k, v, mask))
        check_features(q, layout, window, softcap, alibi_slopes, sinks)
        if seqused_k is not None:
            check_index(seqused_k, "seqused_k", (q.shape[0],), q.device)
        check_splits(num_splits)
        if out is not None:
            check_out(out, q, k, v)
    dropout = _dropout(dropout_p, q, k, sinks)
    if (out is None and sinks is None and q_descale is None and k_descale is None and v_descale is None
            and _replayable((q, k, v), (alibi_slopes, seqused_k, mask), window=window, softcap=softcap)
            and not gradients.needs_grad(q, k, v, mask) and not torch.compiler.is_compiling()):
        o, lse = forward.dense(q, k, v, causal=causal, scale=scale, variant=variant, causal_align=causal_align,
                               layout=layout, return_lse=return_lse, config=config, window=window,
                               softcap=float(softcap), alibi_slopes=alibi_slopes, seqused_k=seqused_k,
                               num_splits=num_splits, descale=forward.descale_table(q, k, layout, descales),
                               checks=checks, attn_mask=mask, dropout=dropout)
        return (o, lse) if return_lse else o
    checks()
    descale = forward.descale_table(q, k, layout, descales)
    if descale is not None and torch.compiler.is_compiling():
        raise NotImplementedError("float8 attention does not run under torch.compile: call it eagerly")
    grad = gradients.needs_grad(q, k, v, sinks, mask)
    if torch.compiler.is_compiling() and out is None and config is None:
        from .custom_op import attention_op
        o, lse = attention_op(q, k, v, bool(causal), None if scale is None else float(scale), variant,
                              causal_align, layout, return_lse or grad, bool(deterministic), int(window[0]),
                              int(window[1]), float(softcap), alibi_slopes, seqused_k, int(num_splits), sinks,
                              attn_mask)
        lse = lse if return_lse else None
    elif grad:
        if out is not None:
            raise ValueError("out= is not differentiable: drop it, or run under torch.no_grad()")
        kw = dict(causal=causal, scale=scale, variant=variant, causal_align=causal_align, layout=layout, config=config,
                  window=tuple(window), softcap=float(softcap), num_splits=num_splits, dropout=dropout)
        o, lse = gradients.Attention.apply(q, k, v, alibi_slopes, seqused_k, sinks, kw, bool(deterministic),
                                           attn_mask)
        lse = lse if return_lse else None
    else:
        o, lse = forward.dense(q, k, v, causal=causal, scale=scale, variant=variant, causal_align=causal_align,
                               layout=layout, return_lse=return_lse or sinks is not None, out=out, config=config,
                               window=tuple(window), softcap=float(softcap), alibi_slopes=alibi_slopes,
                               seqused_k=seqused_k, num_splits=num_splits, descale=descale, attn_mask=mask,
                               dropout=dropout)
        if sinks is not None:
            o, lse = attach_sinks(o, lse, sinks, layout)
    return (o, lse) if return_lse else o


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     scale: float | None = None, variant: str = "auto", causal_align: str = "bottom_right",
                     return_lse: bool = False, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     alibi_slopes: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                     deterministic: bool = False, config: configs.KernelConfig | None = None, dropout_p: float = 0.0):
    """Attention over packed sequences of different lengths (``flash_attn_varlen_func``'s shape).

    ``q`` ``[total_q, heads, head_dim]``, ``k``/``v`` ``[total_k, kv_heads, head_dim]``;
    sequence b is rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q and
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of k/v (int32, ``[batch + 1]``, starting at 0,
    non-decreasing, ending at the totals).  ``max_seqlen_q/k`` must be at least the
    longest sequence.  Masks and modifiers act per sequence, aligned as FlashAttention aligns
    them: ``causal_align="bottom_right"`` by default (query i of a sequence with ``n_q`` queries
    and ``n_k`` keys sees key j when ``j <= i + n_k - n_q``: its new queries are its last
    positions); ``"top_left"`` gives torch SDPA's ``j <= i``.  ``alibi_slopes``: ``[heads]`` or a row per sequence,
    ``[batch, heads]``.  Returns ``o`` ``[total_q, heads, head_dim]`` (and LSE
    ``[heads, total_q]``).  Programs (or ``hopper``'s work items) past a sequence's end exit at
    once: no padded work beyond the last tile of each sequence.  ``auto`` picks the variant as
    :func:`attention` would for the longest sequences (``hopper`` on sm_90 at head_dim 64 and
    128); ``config`` overrides its config, as in :func:`attention`.  Every variant reads the cu_seqlens
    on the device only, checked there in stream order before any kernel reads through them (a failed
    check stops the stream with an assert that names it; ``hopper`` builds its work list from them
    there too), so the call never waits for the GPU.
    Differentiable, with ``deterministic`` as in :func:`attention`; under ``torch.compile`` the call goes
    through the custom op ``fmha::attention_varlen`` (:mod:`fmha.custom_op`), its backward with it.
    ``dropout_p``: attention dropout as in :func:`attention` (each pair drawn at its row's place and its key's number
    in the sequence).
    """
    if (sinks is None and alibi_slopes is None and not dropout_p
            and _replayable((q, k, v, cu_seqlens_q, cu_seqlens_k), window=window, softcap=softcap)
            and not gradients.needs_grad(q, k, v) and not torch.compiler.is_compiling()):  # (as attention's)
        hit = forward.replayed_packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal, scale,
                                      variant, causal_align, return_lse, window, float(softcap), config)
        if hit is not None:
            o, lse = hit
            return (o, lse) if return_lse else o

    def checks():
        check_varlen_call(q, k, v, cu_seqlens_q, cu_seqlens_k, causal_align, variant, scale, window, softcap,
                          alibi_slopes, sinks)
        check_forward_only(q, v, gradients.needs_grad(q, k, v))
    dropout = _dropout(dropout_p, q, k, sinks)
    if (sinks is None and _replayable((q, k, v, cu_seqlens_q, cu_seqlens_k), (alibi_slopes,), window=window,
                                      softcap=softcap)
            and not gradients.needs_grad(q, k, v) and not torch.compiler.is_compiling()):
        o, lse = forward.packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                                scale=scale, variant=variant, causal_align=causal_align, return_lse=return_lse,
                                window=window, softcap=float(softcap), alibi_slopes=alibi_slopes, config=config,
                                checks=checks, dropout=dropout)
        return (o, lse) if return_lse else o
    checks()
    grad = gradients.needs_grad(q, k, v, sinks)
    if torch.compiler.is_compiling() and config is None:
        from .custom_op import attention_varlen_op
        o, lse = attention_varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, bool(causal),
                                     None if scale is None else float(scale), variant, causal_align,
                                     return_lse or grad, bool(deterministic), int(window[0]), int(window[1]),
                                     float(softcap), alibi_slopes, sinks)
        return (o, lse) if return_lse else o
    if grad:
        kw = dict(causal=causal, scale=scale, variant=variant, causal_align=causal_align, window=tuple(window),
                  softcap=float(softcap), config=config, dropout=dropout)
        o, lse = gradients.AttentionVarlen.apply(q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes, sinks,
                                                 max_seqlen_q, max_seqlen_k, kw, bool(deterministic))
        return (o, lse) if return_lse else o
    o, lse = forward.packed(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal=causal,
                            scale=scale, variant=variant, causal_align=causal_align,
                            return_lse=return_lse or sinks is not None, window=tuple(window), softcap=float(softcap),
                            alibi_slopes=alibi_slopes, config=config, dropout=dropout)
    if sinks is not None:
        o, lse = attach_sinks(o, lse, sinks, "packed")
    return (o, lse) if return_lse else o


def _dropout(dropout_p, q, k, sinks):
    """``(seed, dropout_p)`` of a call with attention dropout (its seed drawn now), or None; checked here, not with
    the call's other checks: a replayed call runs none, and each call draws its own seed."""
    if not dropout_p:
        return None
    check_dropout(dropout_p, k, sinks)
    if torch.compiler.is_compiling():
        raise NotImplementedError("attention dropout does not run under torch.compile: call it eagerly")
    from .kernels.dropout import draw_seed
    return draw_seed(q.device), float(dropout_p)


def _replayable(given, optional=(), *, window, softcap) -> bool:
    """A call the replay table can answer (:mod:`fmha.replay`): tensors ``given``, the first on a CUDA device, and
    ``optional`` tensors or None, a window tuple and a numeric softcap.  The checks of such a call are a function of
    its replay key: they run on the first call of each kind only (a call that is none goes to them at once)."""
    for t in given:
        if not isinstance(t, torch.Tensor):
            return False
    for t in optional:
        if t is not None and not isinstance(t, torch.Tensor):
            return False
    return given[0].is_cuda and type(window) is tuple and isinstance(softcap, (int, float))


@gradients.inference_only
def attention_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    cache_seqlens: torch.Tensor, *, causal: bool = False, scale: float | None = None,
                    causal_align: str = "bottom_right", layout: str = "bhsd", return_lse: bool = False,
                    window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None, num_splits: int = 0, variant: str = "auto",
                    sinks: torch.Tensor | None = None, config=None):
    """Attention against a paged KV cache (vLLM's and ``flash_attn_with_kvcache``'s layout).

    ``q``: ``[batch, heads, seqlen_q, head_dim]`` (or ``bshd``); ``k_cache``/``v_cache``:
    ``[num_pages, page_size, kv_heads, head_dim]``; ``block_table``: int32
    ``[batch, pages_per_seq]``, page ``block_table[b, n // page_size]`` holding keys
    ``n``; ``cache_seqlens``: int32 ``[batch]``, the keys in use.  ``page_size`` must be
    a multiple of 16.  Causal defaults to bottom-right: the new queries are the last
    positions of the cache (decode, or prefill with a cached prefix).  ``variant``: ``auto``,
    ``tiled`` or ``hopper``; ``auto`` takes the Gluon kernel on sm_90 for prefill (more than 16
    queries) when ``page_size`` is a multiple of its 128-key tile, else ``tiled``, where short
    queries split the keys as :func:`attention` does.  Under ``torch.compile`` the call goes through the
    custom op ``fmha::attention_paged`` (:mod:`fmha.custom_op`).
    """
    def checks():
        check_paged_call(q, k_cache, v_cache, block_table, cache_seqlens, causal_align, layout, variant, scale,
                         window, softcap, alibi_slopes, sinks, num_splits)
    if torch.compiler.is_compiling() and config is None:
        from .custom_op import attention_paged_op
        o, lse = attention_paged_op(q, k_cache, v_cache, block_table, cache_seqlens, bool(causal),
                                    None if scale is None else float(scale), causal_align, layout, return_lse,
                                    int(window[0]), int(window[1]), float(softcap), alibi_slopes, int(num_splits),
                                    variant, sinks)
        return (o, lse) if return_lse else o
    if not (sinks is None and _replayable((q, k_cache, v_cache, block_table, cache_seqlens), (alibi_slopes,),
                                          window=window, softcap=softcap)):
        checks()
        checks = None
    o, lse = forward.paged(q, k_cache, v_cache, block_table, cache_seqlens, causal=causal, scale=scale,
                           causal_align=causal_align, layout=layout, return_lse=return_lse or sinks is not None,
                           window=tuple(window), softcap=float(softcap), alibi_slopes=alibi_slopes,
                           num_splits=num_splits, variant=variant, config=config, checks=checks)
    if sinks is not None:
        o, lse = attach_sinks(o, lse, sinks, layout)
    return (o, lse) if return_lse else o
