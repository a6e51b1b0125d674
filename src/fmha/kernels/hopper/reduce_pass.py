"""What Gluon 3.6 cannot say for the backward's dQ, said in the PTX: a TMA reduce-add.

The backward kernel (:mod:`.backward`) adds each tile's float32 dQ into a global buffer that several
programs add into.  Hopper's TMA does that in one instruction, ``cp.reduce.async.bulk.tensor ... .add``,
as FlashAttention-3 does; Gluon 3.6 has only the TMA store.  The kernel marks itself with
:data:`KERNEL_MARK` and issues its dQ tiles as TMA stores; this pass, run on the PTX between Triton's
``ptx`` and ``cubin`` stages (:mod:`.ptx_passes`), turns every TMA store
of a marked kernel into the reduce-add of the same box.  It checks what it found (no store at all, or
one it cannot read, raises), and the marker carries a version so that a changed pass cannot meet a
kernel cached under the old one.
"""
from __future__ import annotations

import re

from . import ptx_passes

KERNEL_MARK = "// fmha.tma-reduce v1"

_STORE = re.compile(r"^(\s*)(@%p\d+ )?cp\.async\.bulk\.tensor\.(\d)d\.global\.shared::cta\.bulk_group"
                    r"( \[[^\]]+\], \[[^\]]+\];)\s*$")


def rewrite(ptx: str) -> str:
    """The marked kernel's PTX with its TMA stores made reduce-adds; any other PTX unchanged."""
    if KERNEL_MARK not in ptx:
        return ptx
    lines = ptx.split("\n")
    stores = 0
    for i, line in enumerate(lines):
        if "cp.async.bulk.tensor" in line and ".global.shared::cta" in line:
            m = _STORE.match(line)
            if not m:
                raise RuntimeError(f"reduce pass: a TMA store it cannot read: {line.strip()}")
            indent, pred, rank, operands = m.groups()
            lines[i] = (f"{indent}{pred or ''}cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.add.tile"
                        f".bulk_group{operands}")
            stores += 1
    if not stores:
        raise RuntimeError("reduce pass: a marked kernel without a TMA store")
    return "\n".join(lines)


def install() -> None:
    """Run :func:`rewrite` on every build from now on (:mod:`.ptx_passes`)."""
    ptx_passes.install("reduce", rewrite)
