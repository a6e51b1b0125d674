"""Who gets timed: every fmha variant and the peers a user could pick instead.

A provider turns ``(q, k, v, cell)`` (bhsd tensors) into a zero-argument callable
returning the output in bhsd, or raises to say why it cannot run that cell.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

import fmha


@dataclass(frozen=True)
class Provider:
    name: str
    make: Callable  # (q, k, v, cell) -> callable
    peer: bool      # True for what we compare against


def _fmha(variant: str) -> Provider:
    def make(q, k, v, cell):
        return lambda: fmha.attention(q, k, v, causal=cell.causal, variant=variant)
    return Provider(f"fmha:{variant}", make, peer=False)


def _sdpa(backend_name: str, max_score_bytes: float | None = None) -> Provider:
    def make(q, k, v, cell):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend = getattr(SDPBackend, backend_name)
        if max_score_bytes and 4.0 * cell.batch * cell.heads * cell.seqlen_q * cell.seqlen_k > max_score_bytes:
            raise RuntimeError("skipped: the math backend would materialise a score matrix this large")
        gqa = cell.heads != cell.kv_heads

        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=cell.causal,
                                                                        enable_gqa=gqa)
        return run
    return Provider(f"sdpa:{backend_name.lower().replace('_attention', '')}", make, peer=True)


def _flash_attn(module: str) -> Provider:
    def make(q, k, v, cell):
        import importlib
        fn = importlib.import_module(module).flash_attn_func
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))  # bshd, outside the timing

        def run():
            o = fn(qt, kt, vt, causal=cell.causal)
            return (o[0] if isinstance(o, tuple) else o).transpose(1, 2)
        return run
    return Provider(module, make, peer=True)


def importable(module: str) -> bool:
    import importlib.util
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def providers(device: str) -> list[Provider]:
    """Every provider that can run on ``device`` (cpu: fmha variants in the interpreter, SDPA math)."""
    out = [_fmha("auto")] + [_fmha(v) for v in fmha.variants(interpreter=device == "cpu")]
    if device == "cpu":
        return out + [_sdpa("MATH")]
    out += [_sdpa("CUDNN_ATTENTION"), _sdpa("FLASH_ATTENTION"), _sdpa("EFFICIENT_ATTENTION"),
            _sdpa("MATH", max_score_bytes=2 ** 31)]
    out += [_flash_attn(m) for m in ("flash_attn", "flash_attn.cute") if importable(m)]
    return out


def select(all_providers: list[Provider], names: list[str] | None) -> list[Provider]:
    if not names:
        return all_providers
    known = {p.name: p for p in all_providers}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown provider(s) {unknown}; available here: {sorted(known)}")
    return [known[n] for n in names]
