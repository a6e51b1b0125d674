"""2-CTA clusters sharing K/V: the cluster barrier, the ring slot's release on both CTAs, per-CTA stores,
and the markers the PTX pass (:mod:`.multicast`) rewrites into multicast loads and remote arrivals."""
from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from . import multicast


# CLUSTER: a barrier of every thread of both CTAs (the first one also publishes the barriers' init), and
# the markers the PTX pass reads (multicast.py)
CLUSTER_SYNC = gl.constexpr(f"{multicast.KERNEL_MARK}\n\tfence.mbarrier_init.release.cluster; "
                            "barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
                            "mov.u32 $0, 0;")


BOTH_MARK = gl.constexpr(f"{multicast.BOTH}\n\tmov.u32 $0, 0;")


UNSYNCED_MARK = gl.constexpr(f"{multicast.UNSYNCED}\n\tmov.u32 $0, 0;")


# CLUSTER's layouts: every CTA holds the whole of each tensor and buffer (a broadcast CTA basis)
MMA_128_CLUSTER = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                         instr_shape=[16, 128, 16], cga_layout=[[0, 0]]))


BARRIER_CLUSTER = gl.constexpr(mbarrier.MBarrierLayout(cga_layout=[[0]]))


SPARE_CLUSTER = gl.constexpr(gl.SwizzledSharedLayout(1, 1, 1, [2, 1, 0], cga_layout=[[0, 0, 0]]))


multicast.install()


@gluon.jit
def _cta_rank(CLUSTER: gl.constexpr):
    """This CTA's place in its cluster of two (0 or 1); 0 without clusters."""
    rank = 0
    if CLUSTER:
        rank = gl.inline_asm_elementwise("mov.u32 $0, %cluster_ctarank;", "=r", [], dtype=gl.int32, is_pure=True,
                                         pack=1)
    return rank


@gluon.jit
def _cluster_sync(CLUSTER: gl.constexpr):
    """CLUSTER, at each partition's start and end (every warp of a CTA runs one): every thread of
    both CTAs arrives and waits.  At the start the barriers each CTA initialised are then visible to
    the other's multicasts and arrivals; at the end neither CTA touches the other's shared memory any
    more, so neither leaves while the other still might."""
    if CLUSTER:
        gl.inline_asm_elementwise(CLUSTER_SYNC, "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _release(bar, CLUSTER: gl.constexpr):
    """A consumer warpgroup is done with a ring slot (its wgmma on it waited for): it arrives on the
    slot's empty barrier, and with CLUSTER on the other CTA's too (the PTX pass makes the marked
    arrive both, with no warpgroup barrier before it): the next multicast into the slot fills both
    CTAs' copies."""
    if CLUSTER:
        gl.inline_asm_elementwise(BOTH_MARK, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    mbarrier.arrive(bar, count=1)


@gluon.jit
def _wait_ring(bar, phase, CLUSTER: gl.constexpr):
    """A consumer warpgroup waits for a ring slot's tile.  CLUSTER: without the warpgroup barrier
    Triton puts between two waits on one barrier array (the PTX pass drops it; the wgmma between
    them keeps the warps together)."""
    if CLUSTER:
        gl.inline_asm_elementwise(UNSYNCED_MARK, "=r", [], dtype=gl.int32, is_pure=False, pack=1)
    mbarrier.wait(bar, phase)


STORE_32 = gl.constexpr("{ .reg .pred %p; setp.ne.b32 %p, $3, 0; @%p st.global.b32 [$1], $2; mov.u32 $0, 0; }")


STORE_16 = gl.constexpr("{ .reg .pred %p; setp.ne.b32 %p, $3, 0; @%p st.global.b16 [$1], $2; mov.u32 $0, 0; }")


@gluon.jit
def _store(ptrs, values, mask, CLUSTER: gl.constexpr):
    """``gl.store(ptrs, values, mask=mask)`` (``mask`` None for all); CLUSTER: by inline PTX, one
    element at a time.  Triton reads a cluster layout's broadcast CTA basis as the same tensor held
    by both CTAs, so its own store writes from the first CTA only; here each CTA holds rows of its
    own."""
    if CLUSTER:
        if mask is None:
            mask = gl.full(values.shape, 1, gl.int1, values.type.layout)
        else:
            mask, _ = gl.broadcast(mask, values)
        if values.dtype.primitive_bitwidth == 32:
            gl.inline_asm_elementwise(STORE_32, "=r,l,r,r", [ptrs, values.to(gl.int32, bitcast=True),
                                                             mask.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)
        else:
            gl.inline_asm_elementwise(STORE_16, "=r,l,h,r", [ptrs, values.to(gl.int16, bitcast=True),
                                                             mask.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.store(ptrs, values, mask=mask)
