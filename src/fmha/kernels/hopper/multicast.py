"""What Gluon 3.6 cannot say for a 2-CTA cluster, said in the PTX: K/V multicast and remote arrivals.

FlashAttention-3 runs its D >= 128 non-causal forward in clusters of two CTAs that read each K/V tile
once from L2 for both (TMA multicast).  Gluon 3.6 has no multicast operand on its TMA copy and no
shared-memory addresses, so the hopper kernel's ``CLUSTER`` build marks what it needs and this pass,
run on the PTX between Triton's ``ptx`` and ``cubin`` stages (:mod:`.ptx_passes`), rewrites it:

- every 4-D TMA load (the K and V tiles: Q and O use 3-D descriptors) gets ``.multicast::cluster`` to
  both CTAs: each CTA loads one column half of the tile, and each half lands, with its bytes counted
  on the ready barrier, at the same offset in both CTAs' shared memory;
- the ``mbarrier.arrive`` that follows each :data:`BOTH` marker arrives on the barrier and on the
  other CTA's barrier at the same offset (``mapa``), so a ring slot is free for the next multicast
  only once the consumers of both CTAs have released it.  The remote arrive keeps the default
  CTA-scope release, as CUTLASS's cluster barrier does: with ``.release.cluster`` the kernel ran
  13-15% slower (configs.HOPPER).  ptxas places the remote arrive of each K release below the
  softmax that follows; pinned beside the local one (the arrivals ending a loop that never
  repeats) the kernel ran 1.5-3% slower;
- the warpgroup ``bar.sync`` that Triton puts before each marked arrive (so that one thread arrives for
  all 128) and before each wait that follows :data:`UNSYNCED` goes: CUTLASS's pipelines have neither.
  Every marked arrive follows a ``wgmma.wait_group``, and a wgmma is one operation of the whole
  warpgroup, so once one warp has seen it complete, every warp has issued it and so has passed the
  waits before it; no warp of the warpgroup can then still be waiting on a phase the arrive lets the
  producer refill.  For the same reason no warp runs a ring's phase ahead of the others, which is
  what Triton's barrier between two waits on one barrier array guards against.  Measured against
  the pass without this (same call, D=128 non-causal 4k-16k keys, two rounds): 0.3% faster on
  average, within the noise; kept for what CUTLASS shows, not for a measured gain.

Only PTX that carries :data:`KERNEL_MARK` is touched.  The pass checks what it found (a load it cannot
read, or a marker with no arrive after it, raises), and the marker strings carry a version so that a
changed pass cannot meet a kernel cached under the old one.
"""
from __future__ import annotations

import re

from . import ptx_passes

KERNEL_MARK = "// fmha.multicast v8"
BOTH = "// fmha.arrive-both v8"
UNSYNCED = "// fmha.unsynced-wait v8"

_LOAD = re.compile(r"^(\s*)(@%p\d+ )?"
                   r"(cp\.async\.bulk\.tensor\.4d\.shared::cluster\.global\.mbarrier::complete_tx::bytes)"
                   r" (\[[^\]]+\], \[[^\]]+\], \[[^\]]+\]);\s*$")
_ARRIVE = re.compile(r"^(\s*)(@%p\d+ )?mbarrier\.arrive\.shared::cta\.b64 _, \[(%r\d+)\];\s*$")
_WG_SYNC = re.compile(r"^\s*bar\.sync\s+\d+, 128;\s*$")


def rewrite(ptx: str) -> str:
    """The cluster build's PTX with its K/V loads multicast and its marked arrivals on both CTAs' barriers;
    any other PTX unchanged."""
    if KERNEL_MARK not in ptx:
        return ptx
    lines = ptx.split("\n")
    loads = arrives = dropped = 0
    pending = False  # a BOTH marker seen, its arrive not yet
    unsync = False  # a BOTH or UNSYNCED marker seen, the warpgroup barrier before its arrive or wait not yet
    for i, line in enumerate(lines):
        if unsync and _WG_SYNC.match(line):
            lines[i] = "\t// fmha: warpgroup bar.sync dropped"
            dropped += 1
            unsync = False
            continue
        if "mbarrier.try_wait" in line or "mbarrier.arrive" in line:
            unsync = False
        if "cp.async.bulk.tensor.4d" in line:
            m = _LOAD.match(line)
            if not m:
                raise RuntimeError(f"multicast pass: a 4-D TMA load it cannot read: {line.strip()}")
            indent, pred, op, operands = m.groups()
            lines[i] = (f"{indent}{{ .reg .b16 %fmha_mc; mov.b16 %fmha_mc, 3; "
                        f"{pred or ''}{op}.multicast::cluster {operands}, %fmha_mc; }}")
            loads += 1
        elif BOTH in line:
            if pending:
                raise RuntimeError("multicast pass: two arrive markers without an arrive between")
            pending = unsync = True
        elif UNSYNCED in line:
            unsync = True
        elif pending and "mbarrier.arrive" in line:
            m = _ARRIVE.match(line)
            if not m:
                raise RuntimeError(f"multicast pass: a marked arrive it cannot read: {line.strip()}")
            indent, pred, addr = m.groups()
            lines[i] = (f"{indent}{{ .reg .b32 %fmha_rk, %fmha_ra; mov.u32 %fmha_rk, %cluster_ctarank; "
                        f"xor.b32 %fmha_rk, %fmha_rk, 1; mapa.shared::cluster.u32 %fmha_ra, {addr}, %fmha_rk; "
                        f"{pred or ''}mbarrier.arrive.shared::cta.b64 _, [{addr}]; "
                        f"{pred or ''}mbarrier.arrive.shared::cluster.b64 _, [%fmha_ra]; }}")
            arrives += 1
            pending = False
    if pending or not loads or not arrives:
        raise RuntimeError(f"multicast pass: {loads} K/V loads, {arrives} arrives on both CTAs, "
                           f"{dropped} warpgroup barriers dropped, a marker left over: {pending}")
    return "\n".join(lines)


def install() -> None:
    """Run :func:`rewrite` on every build from now on (:mod:`.ptx_passes`)."""
    ptx_passes.install("multicast", rewrite)
