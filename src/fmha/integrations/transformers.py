"""fmha as a Hugging Face transformers attention implementation: ``attn_implementation="fmha"``.

    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()                                   # once, before building the model
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="fmha")

Head dims fmha does not take, an additive bias on the scores (T5's ``position_bias``) and float32 q, k, v outside
autocast run SDPA (a warning says so once); a model with attention code of its own (Bloom; Falcon, GPT-J, GPT-Neo and
GIT, which pick a class of theirs by the implementation's name, take their SDPA or eager class for ``"fmha"``) gets
eager's masks from the mask function, and runs its code; sparse attention's picks (``indices``, DeepSeek-V3.2's) join
the mask, as eager joins them.  Calls without a mask (causal or bidirectional, prefill or decode with a KV cache,
sliding-window layers, Gemma-style soft-capping, gpt-oss's attention sinks) run fmha.  The mask function registered
beside it (:func:`mask`) asks for no mask whenever the causal band and the layer's window are all there is (no padding,
the queries the last positions of the keys), under ``torch.compile`` too, so those calls make no host checks and trace
whole (a model that offers neither SDPA, FlashAttention nor attention functions, whose layers' ``is_causal`` nothing has
read, gets its masks: BigBird-Pegasus's decoder, whose layers say not causal, runs causal with the band read from them);
a layer whose call names no window, where the sliding mask was left out, takes its config's window as its mask would
(Doge, PhiMoE, Qwen2-MoE), and what goes to SDPA gets the band back; a window a call names that the model's masks never
hold (OLMoE's, from a config that has one) is left out, as eager and SDPA leave it.  A padded batch (a mask that is
exactly the causal band, the layer's window and one contiguous run of real tokens per sequence) runs as packed
sequences: the real tokens gathered, :func:`fmha.attention_varlen`, scattered back, with zeros on padded query rows; its
decoding steps (one query row a sequence, every row computed) run fmha with the mask as ``attn_mask``, the cache read in
place; a static cache's mask (the real keys a prefix, the queries the last of them, the unused slots after) runs with
``seqused_k``.  A padding mask with no band (an encoder's own, a decoder's cross-attention) computes every query row
against the real keys.  Sequences packed along a row and told apart by position_ids alone (transformers' padding-free
format, ``DataCollatorWithFlattening``) run as one varlen call over every token (:func:`packed_attention`; the mask
function notes them, :func:`mask`, or FlashAttention's kwargs ``cu_seq_lens_q/k`` and ``max_length_q/k`` tell
them).  Any other mask goes to torch SDPA with that mask, so nothing is computed wrong; with sinks, which SDPA lacks,
fmha runs with the mask itself, boolean or additive (``attn_mask``, gradients included).  Under ``torch.compile`` a mask
is not read on the host: a decoding step without gradients (and any call with sinks) runs fmha with the mask itself
(``attn_mask``, the keys up to its last real one), with no ``torch.cond``, so transformers' compiled decoding (a static
cache, CUDA graphs) keeps its CUDA graph; otherwise ``torch.cond`` picks fmha for the band alone, fmha with
``seqused_k`` for a static cache's mask and SDPA with the mask otherwise (no graph break, no graphs that depend on the
mask's values).  Training works (gradients through :mod:`fmha.gradients`), under autocast too (float32 q, k, v are cast
to the autocast dtype, as autocast casts SDPA's); a training step with attention dropout runs SDPA, said once (fmha's
``dropout_p`` runs on its portable kernels, a step's forward and backward about even with SDPA's FlashAttention-2
kernels, which also take dropout under ``torch.compile``: docs/PERF.md).
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import weakref
from dataclasses import dataclass

import torch

import fmha
from ..checks import head_dims_reason

NAME = "fmha"


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: q/k/v ``[batch, heads, seq, head_dim]`` in,
    ``[batch, seq, heads, head_dim]`` out."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = bool(causal)
    if query.shape[2] <= 1:  # one new token sees the whole cache (a branch: where Dynamo traces the length as a
        causal = False  # symbol, ``causal`` stays a plain bool, as torch.cond's branches need what they read to be)
    sliding = kwargs.get("sliding_window") if "sliding_window" in kwargs else _window_left_out(module)
    if sliding and _window_not_masked(module):
        sliding = None
    window = (sliding - 1, -1) if sliding else (-1, -1)
    softcap = float(kwargs.get("softcap") or 0.0)
    sinks = kwargs.get("s_aux")  # gpt-oss's attention sinks, one logit a head
    sinks = sinks.float() if sinks is not None else None
    q, k, v = query, key, value
    # mixed precision: q, k and v cast as autocast casts SDPA's
    if q.dtype == torch.float32 and torch.is_autocast_enabled(q.device.type):
        q, k, v = (t.to(torch.get_autocast_dtype(q.device.type)) for t in (q, k, v))
    if kwargs.get("block_indices") is not None:
        raise NotImplementedError("fmha does not take block-sparse attention (block_indices: the key blocks an "
                                  "indexer picks, MiniMax-M3's); use attn_implementation='sdpa'")
    if kwargs.get("indices") is not None:  # sparse attention (DeepSeek-V3.2, GLM-DSA, HY-V4): in the mask from here
        attention_mask = _picked(attention_mask, kwargs.pop("indices"), query.shape[2], key.shape[2], causal, window)
    instead = _not_taken(q.shape[-1], v.shape[-1], kwargs, q.dtype, bool(dropout and module.training))
    if instead:
        return _sdpa_instead(instead, module, query, key, value, attention_mask, dropout, scaling, is_causal, causal,
                             window, sinks, kwargs)
    kw = dict(causal=causal, scale=scaling, window=window, softcap=softcap, sinks=sinks)
    packing = q.shape[0] == 1 and kwargs.get("cu_seq_lens_q") is not None  # told as FlashAttention is told it
    if packing:
        given = [kwargs.get(n) for n in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")]
        packing = all(x is not None for x in given)
    if attention_mask is None and q.shape[2] == 1 and not packing:
        # one new token a sequence: q/k/v read as the bhsd tensors they are; the [batch, heads, 1, dim] output,
        # transposed, is the [batch, 1, heads, dim] one transformers takes, contiguous (two views fewer a call)
        return fmha.attention(q, k, v, causal_align="bottom_right", **kw).transpose(1, 2), None
    # transformers' q/k/v are transposed views of [batch, seq, heads, dim] projections: read them as bshd
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if packing:
        cu_q, cu_k, max_q, max_k = given
        return packed_attention(q, k, v, (cu_q.to(torch.int32), cu_k.to(torch.int32), int(max_q), int(max_k)),
                                **kw), None
    if attention_mask is None:
        return fmha.attention(q, k, v, causal_align="bottom_right", layout="bshd", **kw), None
    training = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if torch.compiler.is_compiling():
        return _compiled_masked(module, query, key, value, attention_mask, q, k, v, kw, dropout, is_causal,
                                kwargs, training), None
    sequences = _packed_sequences(attention_mask, q.shape[:2], k.shape[:2])
    if sequences is not None:
        return packed_attention(q, k, v, sequences, **kw), None
    padding = key_padding(attention_mask, q.shape[1], k.shape[1], causal, window)
    if padding is None and not causal and q.shape[1] > 1:  # a layer saying is_causal=False under causal masks
        # (BigBird-Pegasus's decoder, given its masks whole: _keeps_is_causal): the band read from the mask itself
        padding = key_padding(attention_mask, q.shape[1], k.shape[1], True, window)
        if padding is not None:
            causal = kw["causal"] = True
    if padding is None:
        if sinks is not None:  # SDPA has no sinks: running it would drop them
            return masked_attention(q, k, v, attention_mask, scale=scaling, softcap=softcap, sinks=sinks), None
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, causal, window, kwargs)
    if padding.valid is None:  # every key real: the mask is the band alone
        return fmha.attention(q, k, v, causal_align="bottom_right", layout="bshd", **kw), None
    if padding.used is not None:  # each sequence's real keys a prefix, its queries the last of them
        return fmha.attention(q, k, v, causal_align="bottom_right", layout="bshd", seqused_k=padding.used, **kw), None
    if q.shape[1] == 1 and padding.all_rows:  # a decoding step over a padded cache: the cache read in place
        return fmha.attention(q, k, v, causal_align="bottom_right", layout="bshd", attn_mask=attention_mask,
                              **kw), None
    return unpadded_attention(q, k, v, padding.gather, **kw), None


def _picked(attention_mask, indices, q_len: int, k_len: int, causal: bool, window) -> torch.Tensor:
    """The mask of a sparse attention call (DeepSeek-V3.2's indexer, as transformers hands it to any implementation
    but eager and SDPA): ``indices`` ``[batch, q_len, top_k]``, the keys each query row takes (-1: none), joined with
    ``attention_mask`` (None: the layer's band, which :func:`mask` left out), as eager joins them.  Boolean
    ``[batch, 1, q_len, k_len]``, or additive where the mask was."""
    idx = indices.long()
    picked = torch.zeros(idx.shape[0], 1, q_len, k_len, dtype=torch.int32, device=idx.device)
    picked = picked.scatter_add_(-1, idx.clamp_min(0)[:, None], (idx >= 0).to(torch.int32)[:, None]) > 0
    if attention_mask is None:
        return picked & _bottom_right(q_len, k_len, causal, window, idx.device)
    if attention_mask.dtype == torch.bool:
        return attention_mask[..., :k_len] & picked
    return attention_mask[..., :k_len].masked_fill(~picked, torch.finfo(attention_mask.dtype).min)


def _not_taken(d: int, dv: int, kwargs, dtype: torch.dtype = torch.bfloat16, dropout: bool = False) -> str | None:
    """What of a call fmha does not take, or None: a float32 model outside autocast (fmha computes in float16 and
    bfloat16; :func:`fmha.attention` refuses float32 rather than round it), attention dropout in a training step
    (GPT-2's default ``attn_pdrop``: the module's docstring says why), head dims it has no kernel for (it takes
    multiples of 8 up to 256, and MLA's absorbed form), or an additive bias on the scores (T5's relative positions,
    ``position_bias``, which transformers' SDPA attention adds to the mask: fmha's ``tiled`` takes it as ``attn_mask``,
    at 0.61x cuDNN at T5-base's encoder shapes on an H100, docs/PERF.md)."""
    if dtype in (torch.float32, torch.float64):
        return f"{dtype} q, k, v (fmha takes float16 and bfloat16: load the model in one, or run under autocast)"
    why = head_dims_reason(d, dv)
    if why is not None:
        return f"head dims ({why})"
    if kwargs.get("position_bias") is not None:
        return "position bias (an additive bias on every score)"
    if dropout:
        return "attention dropout"
    return None


_warned: set = set()


def _sdpa_instead(what: str, module, query, key, value, attention_mask, dropout, scaling, is_causal, causal, window,
                  sinks, kwargs):
    """A call fmha does not take (``what``: :func:`_not_taken`) runs torch SDPA (:func:`_sdpa`), said once a
    reason; with sinks, which SDPA lacks, it is refused."""
    import warnings

    if sinks is not None:
        raise NotImplementedError(f"fmha does not take this model's {what}, and SDPA has no attention "
                                  "sinks: use attn_implementation='eager'")
    if what not in _warned:
        _warned.add(what)
        warnings.warn(f"fmha does not take this model's {what}: it runs on torch SDPA", stacklevel=3)
    return _sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, causal, window, kwargs)


def _sdpa(module, query, key, value, attention_mask, dropout, scaling, is_causal, causal: bool, window, kwargs):
    """transformers' SDPA attention for a call fmha leaves to it, the layer's band (causal, bottom-right, and its
    window) made explicit where the mask may lack it.  :func:`mask` asks for no mask wherever the band is all there
    is, which SDPA's ``is_causal`` (top-left, no window) stands for only when the layer has no window and the rows
    are all the keys or one; and a model may build an additive mask of its own from that None (Doge adds a bias to
    every key).  A float mask gets the dtype's lowest value outside the band (where the band is in it already,
    nothing changes); no mask, the band as a boolean one where ``is_causal`` would not be it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    q_len, k_len = query.shape[2], key.shape[2]
    if attention_mask is None:
        explicit = window[0] >= 0 or causal and q_len not in (1, k_len)
    else:
        explicit = (causal or window[0] >= 0) and attention_mask.dtype.is_floating_point
    if explicit:
        band = _bottom_right(q_len, k_len, causal, window, query.device)[:, None]
        attention_mask = band if attention_mask is None else \
            attention_mask[..., :k_len].masked_fill(~band, torch.finfo(attention_mask.dtype).min)
    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  is_causal=is_causal, **kwargs)


@dataclass(frozen=True)
class Padding:
    """What :func:`key_padding` found: ``valid``, bool ``[batch, k_len]``, the real keys (one run a
    sequence; None when every key is real and the mask is the band alone: nothing to gather);
    ``all_rows``: every query row is computed, the queries being each sequence's last ``q_len`` real keys (a
    static cache, whose unused slots follow the real keys) or tied to no key column (no band), else query row
    i is key column ``k_len - q_len + i`` and only the rows at real keys are computed; ``used``: int32
    ``[batch]`` real keys a sequence when each run starts at key 0 and every row is computed (no gathering
    needed: ``seqused_k``), else None; ``gather``: otherwise, the flat indices of the query rows computed and
    of the real keys and their cu_seqlens (:func:`unpadded_attention`), made once for every layer."""
    valid: torch.Tensor | None
    all_rows: bool
    used: torch.Tensor | None
    gather: tuple | None = None


_seen: dict = {}  # key_padding's verdicts on the masks of the current forward (every layer passes the same)


def key_padding(mask: torch.Tensor, q_len: int, k_len: int, causal: bool, window) -> Padding | None:
    """The real keys when the bool mask ``[batch, 1, q_len, k_len]`` is exactly the causal band and
    the layer's window over one contiguous run of real keys per sequence, with the queries either at
    the last ``q_len`` key columns (bottom-right: left or right padding, or none) or at the last
    ``q_len`` real keys of each sequence (a static cache: its unused slots follow); or, with no band (not
    causal, no window), when every query row sees exactly the real keys; otherwise None.
    Computed on the device, read once on the host (one read a forward: the layers share the mask)."""
    if mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[2:] != (q_len, k_len):
        return None
    # an inference tensor keeps no version counter: its verdict is not kept (nothing tells a change in place)
    remember = not torch.compiler.is_compiling() and not mask.is_inference()
    key = (id(mask), mask._version if remember else 0, q_len, k_len, causal, tuple(window))
    if remember and key in _seen and _seen[key][0]() is mask:
        return _seen[key][1]
    valid, end, verdicts = _structure(mask, q_len, k_len, causal, window)
    one_run, aligned, last, prefix, full, n_keys, n_rows = verdicts.tolist()
    padding = None
    if aligned and full:
        padding = Padding(None, False, None)
    elif one_run and aligned and not causal and tuple(window) == (-1, -1):
        # no band: every query row sees the real keys, and nothing ties a row to a key column (cross-attention,
        # an encoder's own): every row is computed, against the real keys only
        used = end.to(torch.int32) if prefix else None
        padding = Padding(valid, True, used, None if used is not None else _gather(valid, q_len, n_keys, n_rows, True))
    elif one_run and (aligned or last):
        last = last and not (aligned and q_len == k_len)  # (rows and key columns coincide: the aligned reading)
        used = end.to(torch.int32) if last and prefix else None
        padding = Padding(valid, last, used, None if used is not None else
                          _gather(valid, q_len, n_keys, n_rows, last))
    if remember:
        _note(_seen, key, mask, (weakref.ref(mask), padding))
    return padding


def _note(table: dict, key, mask: torch.Tensor, entry) -> None:
    """``table[key] = entry`` for as long as ``mask`` lives: what the entry holds (a verdict's device tensors) goes
    with the mask, so no tensor of one forward outlives it into the program's next allocations."""
    if len(table) > 8:
        table.clear()
    table[key] = entry
    weakref.finalize(mask, table.pop, key, None)


def _structure(mask: torch.Tensor, q_len: int, k_len: int, causal: bool, window):
    """:func:`key_padding`'s reading of the mask, on the device: the real keys ``valid`` ``[batch, k_len]``,
    one past each sequence's last ``end``, and the verdicts (int64 ``[7]``: one run of real keys a sequence,
    the band at the last key columns, the band at the last real keys, every run from key 0, every key real;
    then the real keys and the real keys in the last ``q_len`` columns, counted), read together."""
    m = mask[:, 0]
    valid = m.any(dim=1)  # a real key is seen by some query
    j = torch.arange(k_len, device=mask.device)
    runs = (valid[:, 1:] & ~valid[:, :-1]).sum(1) + valid[:, 0]  # starts of runs of real keys
    end = torch.where(valid, j + 1, 0).amax(1)  # one past each sequence's last real key
    start = torch.where(valid, j, k_len).amin(1)
    aligned = (m == _bottom_right(q_len, k_len, causal, window, mask.device) & valid[:, None, :]).all()
    last_pos = end[:, None] - q_len + torch.arange(q_len, device=mask.device)[None, :]  # [batch, q_len]
    last = (m == (_band(last_pos, j, causal, window) & valid[:, None, :])).all() & ((end - start) >= q_len).all()
    verdicts = [(runs <= 1).all(), aligned, last, (start == 0).all(), valid.all(), valid.sum(),
                valid[:, k_len - q_len:].sum()]
    return valid, end, torch.stack([x.to(torch.int64) for x in verdicts])


def _gather(valid: torch.Tensor, q_len: int, n_keys: int, n_rows: int, all_rows: bool) -> tuple:
    """The flat indices of the query rows computed (every row when ``all_rows``, else the ``n_rows`` rows at
    real key columns) and of the ``n_keys`` real keys, and both cu_seqlens, from counts read with the verdicts:
    no further read."""
    if all_rows:
        q_valid = torch.ones(valid.shape[0], q_len, dtype=torch.bool, device=valid.device)
        n_rows = q_valid.numel()
    else:
        q_valid = valid[:, valid.shape[1] - q_len:]
    cu = [torch.nn.functional.pad(t.sum(1, dtype=torch.int32).cumsum(0, dtype=torch.int32), (1, 0))
          for t in (q_valid, valid)]
    rows = torch.nonzero_static(q_valid.flatten(), size=n_rows)[:, 0]
    keys = torch.nonzero_static(valid.flatten(), size=n_keys)[:, 0]
    return rows, keys, cu[0], cu[1]


def _boolean(mask: torch.Tensor) -> bool:
    """Whether ``mask`` is transformers' boolean ``[batch, 1, q_len, k_len]``, which fmha takes as ``attn_mask``."""
    return mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[1] == 1


def masked_attention(q, k, v, mask, *, scale, softcap, sinks=None):
    """Query rows (bshd) against the keys that ``mask`` (``[batch, 1 or heads, q_len, k_len]``, the band, window and
    padding all in it: boolean, or additive, a key hidden by the dtype's lowest value or ``-inf``) picks: fmha with the
    mask as it is (differentiable), reading keys up to the last one the mask keeps (a static cache's unused slots
    after it are not read).  No ``torch.cond`` and nothing read on the host,
    so a compiled decoding step stays one CUDA graph (``torch.cond`` makes inductor give up CUDA graphs for the
    whole graph)."""
    kept = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min
    seen = kept.any(dim=2).any(dim=1)  # [batch, k_len]
    last = mask.shape[-1] - torch.flip(seen, (1,)).to(torch.int32).argmax(dim=1)  # past the last key kept
    used = torch.where(seen.any(dim=1), last, 0).to(torch.int32)
    return fmha.attention(q, k, v, layout="bshd", attn_mask=mask, seqused_k=used, scale=scale, softcap=softcap,
                          sinks=sinks)


def _compiled_masked(module, query, key, value, attention_mask, q, k, v, kw, dropout, is_causal, kwargs, training):
    """A mask met under ``torch.compile``.  A decoding step without gradients (one query row) runs fmha with the
    mask itself (:func:`masked_attention`), as does any call with attention sinks (SDPA, the other branch below,
    has none).  Otherwise the mask's structure is read on the device and chooses,
    through ``torch.cond``, fmha when the mask is the band alone (every key real: generate()'s all-ones
    mask), fmha with ``seqused_k`` when it is a static cache's (each sequence's real keys a prefix, the queries
    the last of them: the lengths come from the mask on the device; without gradients), and SDPA with the mask
    otherwise, so the graph neither breaks nor depends on the mask's values (packing a padded batch would: its
    shapes follow the mask); with gradients both branches differentiate.  (A model whose outputs transformers
    has once captured, ``output_hidden_states``, carries capture hooks that Dynamo breaks on around a
    ``torch.cond``, whatever its branches: a training step then has 7 graph breaks.)"""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    if not _boolean(attention_mask) and kw["sinks"] is None:
        return _sdpa(module, query, key, value, attention_mask, dropout, kw["scale"], is_causal, kw["causal"],
                     kw["window"], kwargs)[0]
    q_len, k_len = q.shape[1], k.shape[1]
    if kw["sinks"] is not None or q_len == 1 and not training:
        return masked_attention(q, k, v, attention_mask, scale=kw["scale"], softcap=kw["softcap"], sinks=kw["sinks"])
    _, end, verdicts = _structure(attention_mask, q_len, k_len, kw["causal"], kw["window"])
    one_run, aligned, last, prefix, full = (verdicts[i].bool() for i in range(5))
    band_alone = aligned & full
    # key_padding's seqused_k reading (rows and key columns coinciding read as aligned, not as a cache; with no
    # band, every row against a prefix of real keys)
    if not kw["causal"] and tuple(kw["window"]) == (-1, -1):
        cached = one_run & aligned & prefix
    else:
        cached = one_run & last & prefix & ~(aligned & (q_len == k_len))

    def canonical(x):  # the branches' outputs must agree in strides: one flat dimension has one (torch.cond's
        return x.reshape(-1)  # stride merge trips over a decode's size-1 dimensions, even contiguous ones)

    # the operands go in flat as well: inductor may lay out a tensor it computes (q after the rotary embedding)
    # otherwise than the strides the branches were traced with, and the branches assert those strides
    (fq, fk, fv), ways = zip(*(_flat(t) for t in (q, k, v)))

    def unflat(*flat):
        return [_unflat(t, way) for t, way in zip(flat, ways)]

    def ours(fq, fk, fv, mask, end, cached, seqused_k=None):
        return canonical(fmha.attention(*unflat(fq, fk, fv), causal_align="bottom_right", layout="bshd",
                                        seqused_k=seqused_k, **kw))

    def with_lengths(fq, fk, fv, mask, end, cached):
        return ours(fq, fk, fv, mask, end, cached, seqused_k=end.to(torch.int32))

    def theirs(fq, fk, fv, mask, end, cached):
        q, k, v = (t.transpose(1, 2) for t in unflat(fq, fk, fv))
        return canonical(sdpa_attention_forward(module, q, k, v, mask, dropout=dropout, scaling=kw["scale"],
                                                is_causal=is_causal, **kwargs)[0])

    def other(fq, fk, fv, mask, end, cached):
        return torch.cond(cached, with_lengths, theirs, (fq, fk, fv, mask, end, cached))
    # a static cache is an inference thing; with gradients the branches' gradients would have to agree in strides
    # too, which the lengths' branch and SDPA's do not
    out = torch.cond(band_alone, ours, theirs if training else other, (fq, fk, fv, attention_mask, end, cached))
    return out.view(*q.shape[:3], v.shape[3])


def _flat(t: torch.Tensor):
    """``t`` as one flat dimension, its elements in the order its memory holds them (a view, no copy, wherever some
    order of its dimensions is contiguous), and how :func:`_unflat` views it back."""
    order = []  # the outermost dimension first: an insertion sort, whose comparisons Dynamo guards (it sorts no
    for i in range(t.dim()):  # symbolic keys, which a dynamic shape's strides are)
        at = len(order)
        while at and t.stride(order[at - 1]) < t.stride(i):
            at -= 1
        order.insert(at, i)
    p = t.permute(order)
    return p.reshape(-1), (tuple(p.shape), [order.index(i) for i in range(t.dim())])


def _unflat(x: torch.Tensor, way) -> torch.Tensor:
    shape, inverse = way
    return x.view(shape).permute(inverse)


_packed: dict = {}  # id(mask) -> [the mask, weakly; its sequence ids [batch, seq]; _packed_sequences' answer]


def _remember_packing(dense: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Note that ``dense``, the mask :func:`mask` built, is the causal band (and window) within packed sequences
    whose index per token is ``ids`` (transformers' ``find_packed_sequence_indices``)."""
    _note(_packed, id(dense), dense, [weakref.ref(dense), ids, None])
    return dense


def _packed_sequences(mask: torch.Tensor, q_shape, k_shape):
    """(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k) of the packed sequences ``mask`` stands for (one
    noted by :func:`mask`), or None.  The sequences start where a row starts or its sequence index changes;
    their count and the longest are read on the host once a mask (every layer passes the same)."""
    entry = _packed.get(id(mask))
    if entry is None or entry[0]() is not mask or not tuple(q_shape) == tuple(k_shape) == tuple(entry[1].shape):
        return None
    if entry[2] is None:
        ids = entry[1].to(mask.device)
        starts = torch.ones_like(ids, dtype=torch.bool)
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
        starts = starts.flatten()
        token = torch.arange(starts.numel(), device=ids.device)
        first = torch.cummax(torch.where(starts, token, 0), 0).values  # each token's sequence's first token
        count, longest = torch.stack([starts.sum(), (token - first + 1).max()]).tolist()  # the one read
        at = torch.nonzero_static(starts, size=count)[:, 0]
        cu = torch.cat([at, at.new_tensor([starts.numel()])]).to(torch.int32)
        entry[2] = (cu, cu, longest, longest)
    return entry[2]


def packed_attention(q, k, v, sequences, *, causal, scale, window, softcap, sinks=None):
    """Attention over packed sequences laid along each row of a bshd batch (transformers' padding-free format:
    position_ids restart at each sequence), ``sequences`` their (cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
    max_seqlen_k) over the flattened rows: one varlen call over every token, no gathering."""
    (b, s, h, _), dv = q.shape, v.shape[3]
    flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
    o = fmha.attention_varlen(flat(q), flat(k), flat(v), *sequences, causal=causal, scale=scale,
                              causal_align="bottom_right", window=window, softcap=softcap, sinks=sinks)
    return o.view(b, s, h, dv)


def _packing_of(mask_function):
    """(the band's mask function, the sequence index per token) when ``mask_function`` is transformers' band
    joined with its packed-sequence mask (``and_masks(band, packed_sequence_mask_function(ids))``), else None."""
    for cell in getattr(mask_function, "__closure__", None) or ():
        parts = cell.cell_contents
        if isinstance(parts, tuple) and len(parts) == 2 and callable(parts[1]):
            base, packed = parts
            if "packed_sequence_mask_function" in getattr(packed, "__qualname__", ""):
                for inner in packed.__closure__ or ():
                    if isinstance(inner.cell_contents, torch.Tensor):
                        return base, inner.cell_contents
    return None


def _band(pos: torch.Tensor, j: torch.Tensor, causal: bool, window) -> torch.Tensor:
    """Keys ``j`` a query at position ``pos`` (``[batch or 1, q_len]``) sees: ``[.., q_len, k_len]``."""
    band = torch.ones(*pos.shape, j.shape[0], dtype=torch.bool, device=j.device)
    if causal:
        band &= j <= pos[..., None]
    if window[0] >= 0:
        band &= j >= pos[..., None] - window[0]
    return band


def _bottom_right(q_len: int, k_len: int, causal: bool, window, device) -> torch.Tensor:
    """The band with the queries the last ``q_len`` key columns: ``[1, q_len, k_len]``."""
    j = torch.arange(k_len, device=device)
    return _band(torch.arange(q_len, device=device)[None, :] + (k_len - q_len), j, causal, window)


def unpadded_attention(q, k, v, gather, *, causal, scale, window, softcap, sinks=None):
    """Attention over the real tokens of a padded bshd batch: the real query rows and keys (``gather``:
    :func:`_gather`'s indices and cu_seqlens) packed by index, one varlen call, the result scattered back;
    padded query rows get zeros.  Nothing here waits for the GPU."""
    rows, keys, cu_q, cu_k = gather
    (b, sq, h, _), dv = q.shape, v.shape[3]
    flat = lambda t: t.reshape(-1, *t.shape[2:])  # noqa: E731
    packed = fmha.attention_varlen(flat(q).index_select(0, rows), flat(k).index_select(0, keys),
                                   flat(v).index_select(0, keys), cu_q, cu_k, sq, k.shape[1], causal=causal,
                                   scale=scale, causal_align="bottom_right", window=window, softcap=softcap,
                                   sinks=sinks)
    return q.new_zeros(b * sq, h, dv).index_copy(0, rows, packed).view(b, sq, h, dv)


def mask(batch_size, q_length, kv_length, q_offset=0, kv_offset=0, mask_function=None, attention_mask=None,
         local_size=None, allow_is_causal_skip=True, **kwargs):
    """transformers' mask interface for ``"fmha"``: None (fmha applies the band itself, bottom-right) when
    the mask would be the causal band or a sliding-window one and nothing else: no padding, nothing
    added to the band (transformers then forbids the skip), and the queries the last positions of the
    keys.  Otherwise SDPA's mask, which :func:`attention_forward` unpads or hands to SDPA (never SDPA's skip
    that relies on its top-left alignment; and always, band included, for a model whose layers' ``is_causal`` may not
    be its masks', :func:`_keeps_is_causal`); where it is the band within packed sequences (transformers found
    them in position_ids), that mask noted with their index per token, for :func:`packed_attention`.  A
    model whose layers do not name their window takes it from its config there (:func:`_window_left_out`)."""
    from transformers.masking_utils import causal_mask_function, eager_mask, prepare_padding_mask, sdpa_mask
    mask_function = mask_function or causal_mask_function
    if not _calls_the_interface(kwargs.get("config")):  # its own attention code reads the mask: eager's, as it is
        return eager_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                          mask_function=mask_function, attention_mask=attention_mask, local_size=local_size, **kwargs)
    packing = _packing_of(mask_function)
    if (packing is not None and attention_mask is None and q_offset == kv_offset == 0 and q_length == kv_length
            and not torch.compiler.is_compiling()):
        base, ids = packing
        if (base is causal_mask_function if local_size is None else _sliding_window(base)) and \
                tuple(ids.shape) == (batch_size, q_length):
            # SDPA's mask all the same (whatever else reads it stays right), noted as packed sequences
            return _remember_packing(sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset,
                                               kv_offset=kv_offset, mask_function=mask_function, attention_mask=None,
                                               local_size=local_size, allow_is_causal_skip=False, **kwargs), ids)
    band = mask_function is causal_mask_function if local_size is None else _sliding_window(mask_function)
    config = kwargs.get("config")
    if config is not None and not _keeps_is_causal(type(config)):  # its layers' is_causal may not be its masks'
        allow_is_causal_skip = False
    # SDPA skips a static cache's prefill mask (12 queries, 17 slots) for its top-left is_causal; fmha reads no
    # mask as bottom-right, so it skips only where the two agree
    skip = allow_is_causal_skip and q_length in (1, kv_length)
    if allow_is_causal_skip and band and q_offset + q_length == kv_offset + kv_length:
        padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
        # an all-ones padding mask (generate() passes one) read once a forward, as SDPA's skip reads it
        if padding is None or not torch.compiler.is_compiling() and bool(padding.all()):
            return None
        if not torch.compiler.is_compiling():  # padding read: SDPA's skip would read it again, to skip nothing
            skip = False
    return sdpa_mask(batch_size, q_length, kv_length, q_offset=q_offset, kv_offset=kv_offset,
                     mask_function=mask_function, attention_mask=attention_mask, local_size=local_size,
                     allow_is_causal_skip=skip, **kwargs)


_interface: dict = {}  # config class -> whether its model computes attention through transformers' interface
_is_causal_kept: dict = {}  # config class -> whether its model's attention layers say is_causal as their masks are


def _calls_the_interface(config) -> bool:
    """Whether the model of ``config`` computes attention through transformers' attention interface (its module
    imports ``ALL_ATTENTION_FUNCTIONS`` and picks no attention class of its own), where fmha runs.  A model with
    attention code of its own (Bloom, MPT, XGLM, CodeGen; Falcon, GPT-J, GPT-Neo, GIT) only asks the mask interface,
    and reads what it gets as its eager code reads an additive mask: it gets eager's mask (and fmha runs none of that
    attention, said once).  A config transformers does not map to a model (remote code) is taken to call the
    interface."""
    return config is None or _interface_of(type(config))


def _model_of(kind):
    """The model class transformers builds for config class ``kind``, or None (remote code)."""
    from transformers import AutoModel
    try:
        model = AutoModel._model_mapping[kind]
    except (KeyError, ValueError, ImportError, AttributeError):
        return None
    return model[0] if isinstance(model, (tuple, list)) else model


@torch._dynamo.assume_constant_result  # under torch.compile: run once while tracing, a constant after
def _interface_of(kind) -> bool:
    if kind not in _interface:
        import sys
        import warnings

        model = _model_of(kind)
        module = sys.modules.get(model.__module__) if model is not None else None
        own = module is not None and (not hasattr(module, "ALL_ATTENTION_FUNCTIONS") or _attention_classes(module))
        _interface[kind] = not own
        if not _interface[kind]:
            warnings.warn(f"{model.__name__} computes attention in its own code, not through transformers' "
                          "attention interface: attn_implementation='fmha' runs none of it (its masks are eager's)",
                          stacklevel=4)
    return _interface[kind]


@torch._dynamo.assume_constant_result  # under torch.compile: run once while tracing, a constant after
def _keeps_is_causal(kind) -> bool:
    """Whether the model of config class ``kind`` offers SDPA, FlashAttention or any attention function: transformers
    then hands those no mask for a causal band alone, and they read its layers' ``is_causal``, so the flag is the
    masks'.  A model that offers none may have layers whose flag was never read (BigBird-Pegasus's decoder says
    ``is_causal=False`` under causal masks): :func:`mask` gives it its masks, band included, whatever they hold.  A
    config transformers does not map to a model (remote code) is taken to keep it."""
    if kind not in _is_causal_kept:
        model = _model_of(kind)
        _is_causal_kept[kind] = model is None or any(
            getattr(model, flag, False) for flag in ("_supports_sdpa", "_supports_flash_attn",
                                                     "_supports_attention_backend"))
    return _is_causal_kept[kind]


_windows: dict = {}  # config class -> where its model's window lives: "mask", "call" (alone), or None (both, or none)


def _model_source(kind) -> str:
    """The source of the module that defines the model of config class ``kind`` ("" for remote code, or where there
    is none to read)."""
    import inspect
    import sys

    model = _model_of(kind)
    try:
        return inspect.getsource(sys.modules[model.__module__]) if model is not None else ""
    except (KeyError, OSError, TypeError):
        return ""


def _window_lives(kind) -> str | None:
    """Where the sliding window of the model of config class ``kind`` lives, read from its module's source:
    ``"mask"`` where it builds sliding-window masks but names no window in its attention calls (``sliding_window=``
    nowhere: Doge, PhiMoE, Qwen2-MoE); ``"call"`` where its calls name one but it builds its masks itself
    (``create_causal_mask``) and never a sliding-window one (OLMoE, whose calls pass its config's ``sliding_window``
    where it has one, and DeepSeek-OCR 2's and PaddleOCR-VL's sliding layers, whose masks transformers builds
    without it): the eager and SDPA attentions, which read the mask alone, see no window there.  None otherwise (both
    agree; or a config transformers does not map to a model, remote code)."""
    if kind not in _windows:
        import re

        source = _model_source(kind)
        named = "sliding_window=" in source
        own_masks = "create_causal_mask" in source or "create_bidirectional_mask" in source
        any_sliding_mask = re.search(r"sliding_window\w*mask|sliding_window_overlay", source) is not None
        _windows[kind] = "mask" if "create_sliding_window_causal_mask" in source and not named else \
            "call" if named and own_masks and not any_sliding_mask else None
    return _windows[kind]


@torch._dynamo.assume_constant_result  # under torch.compile: run once while tracing, a constant after
def _window_in_mask_only(kind) -> bool:
    """Whether the model of config class ``kind`` keeps its window in its masks alone (:func:`_window_lives`)."""
    return _window_lives(kind) == "mask"


@torch._dynamo.assume_constant_result  # under torch.compile: run once while tracing, a constant after
def _window_in_call_only(kind) -> bool:
    """Whether the model of config class ``kind`` names a window in its attention calls that none of its masks holds
    (:func:`_window_lives`): the model as its eager attention defines it has none."""
    return _window_lives(kind) == "call"


def _window_not_masked(module) -> bool:
    """Whether the window a layer's call names is one its model's masks never hold (:func:`_window_in_call_only`):
    fmha then computes what the eager and SDPA attentions compute, with or without padding (the window applied only
    where :func:`mask` leaves the mask out would make the padded and unpadded calls of one model disagree)."""
    config = getattr(module, "config", None)
    return config is not None and _window_in_call_only(type(config))


def _window_left_out(module) -> int | None:
    """The sliding window of a layer whose call names none, in a model whose window lives in its mask alone
    (:func:`_window_in_mask_only`), where :func:`mask` may leave that mask out: the config's ``sliding_window``, on
    the layers its ``layer_types`` mark sliding where it has them (Qwen2-MoE), else on every layer (Doge, PhiMoE),
    as the model's own code picks its masks (Doge builds an additive mask of its own from the None, which
    :func:`_sdpa` joins with the band).  None otherwise: the layer's mask, or the plain causal band, holds what it
    sees.  The same eagerly and under ``torch.compile``."""
    config = getattr(module, "config", None)
    if config is None or not _window_in_mask_only(type(config)):
        return None
    types, at = getattr(config, "layer_types", None), getattr(module, "layer_idx", None)
    if types is not None and at is not None and at < len(types) and types[at] != "sliding_attention":
        return None
    return getattr(config, "sliding_window", None)


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


def _attention_classes(module) -> list[dict]:
    """A model module's tables of attention classes by implementation name (``FALCON_ATTENTION_CLASSES``: "eager",
    "sdpa", "flash_attention_2"), which it reads where others call transformers' attention interface."""
    return [table for name, table in vars(module).items()
            if name.endswith("ATTENTION_CLASSES") and isinstance(table, dict) and "eager" in table]


def _adopt(module) -> None:
    """``"fmha"`` in ``module``'s tables of attention classes: its SDPA class where it has one, else its eager one,
    so a model that picks its class by name builds (Falcon, GPT-J, GPT-Neo and GIT raised ``KeyError: 'fmha'``) and
    runs its own code, on eager's masks (:func:`mask`)."""
    for table in _attention_classes(module):
        table.setdefault(NAME, table.get("sdpa", table["eager"]))


class _Adopter(importlib.abc.MetaPathFinder):
    """Runs :func:`_adopt` on each transformers model module as it is imported (each is imported on first use)."""

    def find_spec(self, name, path, target=None):
        if not name.startswith("transformers.models.") or not name.rpartition(".")[2].startswith("modeling_"):
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _adopt(module)
        spec.loader.exec_module = exec_module
        return spec


def register() -> None:
    """Register ``"fmha"`` with transformers' attention and mask interfaces, and with the models that pick an
    attention class of their own by the implementation's name (:func:`_adopt`)."""
    import sys

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register(NAME, attention_forward)
    AttentionMaskInterface.register(NAME, mask)
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.models.") and module is not None:
            _adopt(module)
    if not any(isinstance(finder, _Adopter) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Adopter())
