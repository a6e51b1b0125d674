"""One pipeline-stages hook that runs fmha's PTX passes (:mod:`.multicast`, :mod:`.reduce_pass`) between
Triton's ``ptx`` and ``cubin`` stages.  Each pass touches only PTX that carries its own marker."""
from __future__ import annotations

from typing import Callable

from triton import knobs

_PASSES: dict[str, Callable[[str], str]] = {}


def _apply(ptx: str) -> str:
    for rewrite in _PASSES.values():
        ptx = rewrite(ptx)
    return ptx


def install(name: str, rewrite: Callable[[str], str]) -> None:
    """Register ``rewrite`` and make sure the hook is in place, keeping any other stages hook set before it
    (again on every launch that needs it: another library may have replaced the hook since)."""
    _PASSES[name] = rewrite
    previous = knobs.runtime.add_stages_inspection_hook
    if getattr(previous, "fmha_passes", False):
        return

    def hook(backend, stages, options, language, capability):
        if previous is not None:
            previous(backend, stages, options, language, capability)
        if "ptx" in stages:
            make_ptx = stages["ptx"]
            stages["ptx"] = lambda src, metadata: _apply(make_ptx(src, metadata))

    hook.fmha_passes = True
    knobs.runtime.add_stages_inspection_hook = hook
