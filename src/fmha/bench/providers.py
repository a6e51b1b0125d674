"""Who gets timed: every fmha variant and the peers a user could pick instead.

A provider turns ``(q, k, v, cell)`` (bhsd tensors) into a zero-argument callable
returning the output in bhsd, or raises to say why it cannot run that cell.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re
from dataclasses import dataclass
from typing import Callable

import torch

import fmha


@dataclass(frozen=True)
class Provider:
    name: str
    make: Callable  # (q, k, v, cell) -> callable
    peer: bool      # True for what we compare against
    config: Callable | None = None  # cell -> the KernelConfig it runs, when the provider fixes one
    # False where capturing the backward in a CUDA graph fails and leaves every later capture in the process
    # failing too (FlashAttention-4's): such a provider's backward rows under --cuda-graphs are not attempted
    graph_backward: bool = True
    # a context its calls run in, forward and backward (their checks and timings alike)
    scope: Callable = contextlib.nullcontext


def alibi_slopes(heads: int, device) -> torch.Tensor:
    """ALiBi's geometric slopes, ``2^(-8 (h + 1) / heads)``."""
    return torch.tensor([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], device=device)


def modifiers(cell, device) -> dict:
    """:func:`fmha.attention`'s keyword arguments for the cell's window, softcap, ALiBi and dropout."""
    kw = {"window": (cell.window, -1)} if cell.window >= 0 else {}
    if cell.softcap:
        kw["softcap"] = float(cell.softcap)
    if cell.alibi:
        kw["alibi_slopes"] = alibi_slopes(cell.heads, device)
    if cell.dropout:
        kw["dropout_p"] = float(cell.dropout)
    return kw


def sdpa_mask(q, cell, dtype=None) -> torch.Tensor:
    """The cell's band (:func:`fmha.reference.visible`) and ALiBi as SDPA's additive mask (what an
    SDPA user writes), in ``dtype`` (q's by default; float32 for a reference)."""
    from fmha import reference
    dtype = dtype or q.dtype
    seen = torch.from_numpy(reference.visible(cell.seqlen_q, cell.seqlen_k, cell.causal, "top_left",
                                              (cell.window, -1))).to(q.device)
    mask = torch.zeros(seen.shape, device=q.device, dtype=dtype).masked_fill(~seen, float("-inf"))
    if cell.alibi:
        i = torch.arange(cell.seqlen_q, device=q.device)[:, None]
        j = torch.arange(cell.seqlen_k, device=q.device)[None, :]
        mask = mask - alibi_slopes(cell.heads, q.device)[:, None, None].to(dtype) * (i - j).abs().to(dtype)
    return mask


def _fmha(variant: str, deterministic: bool = False) -> Provider:
    """``fmha:<variant>``; ``fmha:deterministic``: ``auto`` with the deterministic backward (the forward is
    ``auto``'s), asked for by name."""
    def make(q, k, v, cell):
        kw = modifiers(cell, q.device)
        return lambda: fmha.attention(q, k, v, causal=cell.causal, variant=variant, deterministic=deterministic,
                                      **kw)
    return Provider("fmha:deterministic" if deterministic else f"fmha:{variant}", make, peer=False)


def _table_config(variant: str, cell):
    """The config ``auto`` gives ``variant`` on an H200 for ``cell`` (tiled: the decode table for up
    to 16 query rows, whose GQA rows are packed; else the sm_90 row)."""
    from fmha import configs
    if variant == "hopper":
        return configs.hopper_config(cell.head_dim, cell.causal, cell.seqlen_k, modifiers=cell.modified,
                                     seqlen_q=cell.seqlen_q, head_dim_v=cell.head_dim_v,
                                     window_only=cell.window >= 0 and not (cell.softcap or cell.alibi))
    if cell.seqlen_q <= 16:
        return configs.decode_config(cell.seqlen_q * cell.heads // cell.kv_heads, cell.seqlen_k, cell.head_dim)
    return configs.tiled_config("sm90", cell.head_dim, dropout=cell.dropout > 0)


def config_changes(spec: str) -> dict:
    """``field=value,...`` -> ``{field: value}``, each field one of :class:`~fmha.configs.KernelConfig`'s
    and each value an integer (the changes a provider name, ``bench/power_probe.py`` and
    ``bench/ncu_profile.py`` take)."""
    from fmha import configs
    fields = {f.name for f in dataclasses.fields(configs.KernelConfig)}
    changes = {}
    for part in spec.split(","):
        key, _, val = part.partition("=")
        if key not in fields or not val.lstrip("-").isdigit():
            raise ValueError(f"{spec!r}: expected field=integer pairs of KernelConfig fields {sorted(fields)}")
        changes[key] = int(val)
    return changes


def _changed(name: str) -> Provider:
    """``fmha:hopper[field=value,...]`` (or ``fmha:tiled[...]``): that variant on each cell's own
    table config with those :class:`~fmha.configs.KernelConfig` fields replaced, so one change is
    timed against the table (``fmha:auto``) and the peers in the same run."""
    variant, inner = re.fullmatch(r"fmha:(hopper|tiled)\[(.+)\]", name).groups()
    changes = config_changes(inner)

    def config(cell):
        return dataclasses.replace(_table_config(variant, cell), **changes)

    def make(q, k, v, cell):
        kw = modifiers(cell, q.device)
        return lambda: fmha.attention(q, k, v, causal=cell.causal, variant=variant, config=config(cell), **kw)
    return Provider(name, make, peer=False, config=config)


def _sdpa(backend_name: str, max_score_bytes: float | None = None) -> Provider:
    def make(q, k, v, cell):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, backend_name)
        if max_score_bytes and 4.0 * cell.batch * cell.heads * cell.seqlen_q * cell.seqlen_k > max_score_bytes:
            raise RuntimeError("skipped: the math backend would materialise a score matrix this large")
        gqa = cell.heads != cell.kv_heads
        if cell.softcap:
            raise RuntimeError("skipped: SDPA has no softcap")
        mask = sdpa_mask(q, cell) if cell.modified else None

        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=cell.dropout, is_causal=cell.causal and mask is None,
                    enable_gqa=gqa)
        return run
    return Provider(f"sdpa:{backend_name.lower().replace('_attention', '')}", make, peer=True)


def _flash_attn(module: str) -> Provider:
    def make(q, k, v, cell):
        fn = entry(module, "flash_attn_func")
        if cell.dropout and module == "flash_attn.cute":
            raise RuntimeError("skipped: FlashAttention-4 has no dropout")
        # bshd: a contiguous cell's copy (FlashAttention's own layout) made outside the timing; the
        # other layouts as they lie (transformers' views are contiguous bshd; fused qkv slices are strided)
        qt, kt, vt = (t.transpose(1, 2) if cell.layout != "contiguous" else t.transpose(1, 2).contiguous()
                      for t in (q, k, v))
        kw = modifiers(cell, q.device)  # FlashAttention's own names for them, but the window's
        if "window" in kw:
            kw["window_size"] = kw.pop("window")

        def run():
            o = fn(qt, kt, vt, causal=cell.causal, **kw)
            return (o[0] if isinstance(o, tuple) else o).transpose(1, 2)
        return run
    return Provider(module, make, peer=True, graph_backward=module != "flash_attn.cute")


def entry(module: str, name: str):
    """``module``'s function ``name`` (FlashAttention's ``flash_attn_func``, ``flash_attn_varlen_func``), or None
    where the module is missing or lacks it: FlashAttention-4 alone installs ``flash_attn`` as the bare namespace
    of ``flash_attn.cute``."""
    import importlib
    try:
        return getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None


def providers(device: str) -> list[Provider]:
    """Every provider that can run on ``device`` (cpu: fmha variants in the interpreter, SDPA math)."""
    out = [_fmha("auto")] + [_fmha(v) for v in fmha.variants(interpreter=device == "cpu")]
    if device == "cpu":
        return out + [_sdpa("MATH")]
    out += [_sdpa("CUDNN_ATTENTION"), _sdpa("FLASH_ATTENTION"), _sdpa("EFFICIENT_ATTENTION"),
            _sdpa("MATH", max_score_bytes=2 ** 31)]
    out += [_flash_attn(m) for m in ("flash_attn", "flash_attn.cute") if entry(m, "flash_attn_func")]
    return out


# the Gluon backward's rows rules, emptied (one object: fmha.replay's key)
NO_GLUON_ROWS = dict.fromkeys(fmha.backward.GLUON_ROWS)


@contextlib.contextmanager
def triton_backward():
    """The backward held to the Triton kernels (:func:`fmha.backward.kernel`'s rows rules emptied) while inside."""
    from fmha import backward
    kept = backward.GLUON_ROWS, backward.GLUON_ROWS_DETERMINISTIC
    backward.GLUON_ROWS = backward.GLUON_ROWS_DETERMINISTIC = NO_GLUON_ROWS
    try:
        yield
    finally:
        backward.GLUON_ROWS, backward.GLUON_ROWS_DETERMINISTIC = kept


def select(all_providers: list[Provider], names: list[str] | None) -> list[Provider]:
    if not names:
        return all_providers
    known = {p.name: p for p in all_providers}
    known.update({n: _changed(n) for n in names if re.match(r"fmha:(hopper|tiled)\[", n) and n.split("[")[0] in known})
    known["fmha:deterministic"] = _fmha("auto", deterministic=True)
    # auto's forward, the backward on the Triton kernels: the Gluon backward's gain, in one run
    known["fmha:triton-backward"] = dataclasses.replace(_fmha("auto"), name="fmha:triton-backward",
                                                        scope=triton_backward)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown provider(s) {unknown}; available here: {sorted(known)}")
    return [known[n] for n in names]
