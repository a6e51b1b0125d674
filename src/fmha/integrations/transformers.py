"""fmha as a Hugging Face transformers attention implementation: ``attn_implementation="fmha"``.

    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()                                   # once, before building the model
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fmha")

Calls without a mask (causal or bidirectional, prefill or decode with a KV cache,
sliding-window layers, Gemma-style soft-capping) run fmha.  A call that carries a
real mask (padding in the batch, or any other pattern) goes to torch SDPA with
that mask, so nothing is computed wrong; dropout in training is refused.
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
    if attention_mask is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal) and query.shape[2] > 1  # one new token sees the whole cache
    sliding = kwargs.get("sliding_window")
    window = (sliding - 1, -1) if sliding else (-1, -1)
    softcap = kwargs.get("softcap") or 0.0
    # transformers' q/k/v are transposed views of [batch, seq, heads, dim] projections: read them as bshd
    out = fmha.attention(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), causal=causal,
                         scale=scaling, causal_align="bottom_right", layout="bshd", window=window,
                         softcap=float(softcap))
    return out, None


def register() -> None:
    """Register ``"fmha"`` with transformers' attention and mask interfaces."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)  # None when the mask is plain causal: the fmha path
