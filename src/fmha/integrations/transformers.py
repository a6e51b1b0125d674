"""fmha as a Hugging Face transformers attention implementation: ``attn_implementation="fmha"``.

    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()                                   # once, before building the model
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fmha")

Calls without a mask (causal or bidirectional, prefill or decode with a KV cache,
sliding-window layers, Gemma-style soft-capping, gpt-oss's attention sinks) run fmha.  The mask
function registered beside it (:func:`mask`) asks for no mask whenever the causal band and the
layer's window are all there is (no padding, the queries the last positions of the keys), under
``torch.compile`` too, so those calls make no host checks and trace whole.  A padded
batch (a mask that is exactly the causal band, the layer's window and one contiguous run of real
tokens per sequence) runs as packed sequences: the real tokens gathered,
:func:`fmha.attention_varlen`, scattered back, with zeros on padded query rows.  Any other mask goes
to torch SDPA with that mask, so nothing is computed wrong (with sinks, which SDPA lacks, such a
mask is refused).  Training works (gradients through :mod:`fmha.gradients`), under autocast
too (float32 q, k, v are cast to the autocast dtype, as autocast casts SDPA's); attention dropout
is refused.
"""
from __future__ import annotations

import torch

import fmha

NAME = "fmha"


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: q/k/v ``[batch, heads, seq, head_dim]`` in,
    ``[batch, seq, heads, head_dim]`` out."""
    if dropout and module.training:
        raise NotImplementedError("fmha has no attention dropout; use attn_implementation='sdpa' to train with it")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and query.shape[2] > 1  # one new token sees the whole cache
    sliding = kwargs.get("sliding_window")
    window = (sliding - 1, -1) if sliding else (-1, -1)
    softcap = float(kwargs.get("softcap") or 0.0)
    sinks = kwargs.get("s_aux")  # gpt-oss's attention sinks, one logit a head
    sinks = sinks.float() if sinks is not None else None
    # transformers' q/k/v are transposed views of [batch, seq, heads, dim] projections: read them as bshd
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)
    dev = q.device.type
    if q.dtype == torch.float32 and torch.is_autocast_enabled(dev):  # mixed precision: as autocast casts SDPA's
        q, k, v = (t.to(torch.get_autocast_dtype(dev)) for t in (q, k, v))
    if attention_mask is None:
        out = fmha.attention(q, k, v, causal=causal, scale=scaling, causal_align="bottom_right", layout="bshd",
                             window=window, softcap=softcap, sinks=sinks)
        return out, None
    valid = key_padding(attention_mask, q.shape[1], k.shape[1], causal, window)
    if valid is None:
        if sinks is not None:  # SDPA has no sinks: running it would drop them
            raise NotImplementedError("fmha takes attention sinks with causal, sliding-window and padding masks "
                                      "only; for this mask use attn_implementation='eager'")
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    return unpadded_attention(q, k, v, valid, causal=causal, scale=scaling, window=window, softcap=softcap,
                              sinks=sinks), None


def key_padding(mask: torch.Tensor, q_len: int, k_len: int, causal: bool, window) -> torch.Tensor | None:
    """The real keys, bool ``[batch, k_len]``, when the bool mask ``[batch, 1, q_len, k_len]`` is
    exactly the causal band (bottom-right), the window and one contiguous run of real keys per
    sequence (padding on the left or the right); otherwise None.  One comparison on the device,
    read once on the host."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2:] != (q_len, k_len):
        return None
    valid = mask[:, 0].any(dim=1)  # a real key is seen by some query
    i = torch.arange(q_len, device=mask.device)[:, None] + (k_len - q_len)
    j = torch.arange(k_len, device=mask.device)[None, :]
    band = torch.ones(q_len, k_len, dtype=torch.bool, device=mask.device)
    if causal:
        band &= j <= i
    if window[0] >= 0:
        band &= j >= i - window[0]
    runs = (valid[:, 1:] & ~valid[:, :-1]).sum(1) + valid[:, 0]  # starts of runs of real keys
    same = torch.equal(mask[:, 0], band[None] & valid[:, None, :]) and bool((runs <= 1).all())
    return valid if same else None


def unpadded_attention(q, k, v, valid, *, causal, scale, window, softcap, sinks=None):
    """Attention over the real tokens of a padded bshd batch: each sequence's real queries (the
    last ``q_len`` key positions that are real) and keys packed, one varlen call, the result
    scattered back; padded query rows get zeros."""
    q_valid = valid[:, valid.shape[1] - q.shape[1]:]
    lens_q, lens_k = q_valid.sum(1, dtype=torch.int32), valid.sum(1, dtype=torch.int32)
    cu = [torch.nn.functional.pad(n.cumsum(0, dtype=torch.int32), (1, 0)) for n in (lens_q, lens_k)]
    packed = fmha.attention_varlen(q[q_valid], k[valid], v[valid], *cu, q.shape[1], k.shape[1], causal=causal,
                                   scale=scale, causal_align="bottom_right", window=window, softcap=softcap,
                                   sinks=sinks)
    out = q.new_zeros(q.shape)
    out[q_valid] = packed
    return out


def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
         local_size=None, allow_is_causal_skip=True, **kwargs):
    """transformers' mask interface for ``"fmha"``: None (fmha applies the band itself, bottom-right) when
    the mask would be the causal band or a sliding-window one and nothing else: no padding, nothing
    added to the band (transformers then forbids the skip), and the queries the last positions of the
    keys.  Otherwise SDPA's mask, which :func:`attention_forward` unpads or hands to SDPA."""
    from transformers.masking_utils import causal_mask_function, prepare_padding_mask, sdpa_mask
    mask_function = mask_function or causal_mask_function
    band = mask_function is causal_mask_function if local_size is None else _sliding_window(mask_function)
    if allow_is_causal_skip and band and q_offset + q_length == kv_offset + kv_length:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        # an all-ones padding mask (generate() passes one) read once a forward, as SDPA's skip reads it
        if padding is None or not torch.compiler.is_compiling() and bool(padding.all()):
            return None
    return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=mask_function, attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=allow_is_causal_skip, **kwargs)


def _sliding_window(mask_function) -> bool:
    """Whether ``mask_function`` is transformers' sliding-window causal mask (its window overlay and the
    causal mask, joined by ``and_masks``), not another local pattern such as chunked attention."""
    from transformers.masking_utils import causal_mask_function
    for cell in getattr(mask_function, "__closure__", None) or ():
        parts = cell.cell_contents
        if isinstance(parts, tuple) and len(parts) == 2:
            overlay, causal = parts
            return causal is causal_mask_function and "sliding_window_overlay" in getattr(overlay, "__qualname__", "")
    return False


def register() -> None:
    """Register ``"fmha"`` with transformers' attention and mask interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask)
