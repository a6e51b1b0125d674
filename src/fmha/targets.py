"""Ahead-of-time builds of any variant for any Triton target, with no GPU, and their reports.

``build(variant, target, head_dim, dtype, causal)`` compiles a variant's kernel the
way a launch on that chip would specialise it (unit head-dim strides, 16-byte
aligned pointers and strides) and returns a :class:`Build`; :func:`report` reads
the assembly and the binary's own metadata and returns a :class:`Report`: the
matrix instructions, registers, shared memory / LDS, scratch, an occupancy
estimate, and the memory instructions and cross-lane reductions of the key loop.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .checks import HEAD_DIMS, HOPPER_HEAD_DIMS, MLA_ABSORBED


@dataclass(frozen=True)
class Chip:
    """Per-chip limits for the occupancy estimate (vendor documentation and LLVM's AMDGPU tables)."""
    backend: str
    arch: object
    warp_size: int
    regs: int            # AMD: VGPRs per lane per SIMD; NVIDIA: 32-bit registers per SM
    reg_granule: int     # AMD: VGPRs per allocation block; NVIDIA: registers per warp allocation
    max_waves: int       # AMD: waves per SIMD; NVIDIA: warps per SM
    shared_bytes: int    # LDS per workgroup processor / CU, or shared memory per SM
    max_blocks: int = 0  # NVIDIA: resident CTAs per SM
    simds: int = 0       # AMD: SIMDs sharing the LDS (a WGP has 4 on gfx11, a CU 4 on gfx9)


TARGETS = {
    # RDNA 3.5 (Strix Halo) and RDNA 3 (Navi 31): wave32, 16x16x16 WMMA; LLVM models both with
    # the 1536-VGPR file (granule 24 in wave32); 128 KB LDS per WGP of 4 SIMDs
    "gfx1151": Chip("hip", "gfx1151", 32, 1536, 24, 16, 131072, simds=4),
    "gfx1100": Chip("hip", "gfx1100", 32, 1536, 24, 16, 131072, simds=4),
    # CDNA 3 (MI300): wave64, MFMA, 512 unified VGPR/AGPR per lane
    "gfx942": Chip("hip", "gfx942", 64, 512, 8, 8, 65536, simds=4),
    "sm_80": Chip("cuda", 80, 32, 65536, 256, 64, 167936, max_blocks=32),
    "sm_90": Chip("cuda", 90, 32, 65536, 256, 64, 233472, max_blocks=32),
}
DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float8_e4m3fn": "fp8e4nv"}  # float8: K/V (and q), tiled
MODIFIERS = ("window", "softcap", "alibi", "lse")  # what ``build(modifiers=...)`` names: the optional parts of a build


def variants() -> list[str]:
    from .kernels import ALL_VARIANTS
    return list(ALL_VARIANTS)


def _hopper_source(head_dim: int, dtype: str, causal: bool, cfg, seqlen_k: int = 0, lengths: str = "dense",
                   head_dim_v: int = 0):
    """The Gluon kernel's source with its TMA descriptor types, from stand-in CPU tensors
    (``seqlen_k`` 0: one whole key tile; off the tile: the ragged key mask's build; ``lengths``
    "varlen" or "seqused": lengths per sequence, bottom-right; "paged": per-batch key lengths in a
    paged cache of 256-key pages; ``head_dim_v``: V's and O's head dim, 0: q/k's)."""
    import torch
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.experimental.gluon._runtime import GluonASTSource

    from .kernels import hopper
    from .plan import Problem
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn}[dtype]
    fp8 = tdt == torch.float8_e4m3fn
    seqlen_k = seqlen_k or cfg.block_n
    page = 256 if lengths == "paged" else 0
    dv = head_dim_v or head_dim
    prob = Problem(1, 1, 1, 128, seqlen_k, head_dim, causal, 0, 1.0, align_br=lengths != "dense",
                   varlen=lengths == "varlen", seqused=lengths in ("seqused", "paged"), page=page, fp8=fp8,
                   head_dim_v=head_dim_v if dv != head_dim else 0)
    t = torch.empty(1, 1, max(cfg.block_m, seqlen_k), head_dim, dtype=tdt)
    q, k = t[:, :, :cfg.block_m], t[:, :, :seqlen_k]
    why = hopper.fp8_reason(prob, cfg, q) if fp8 else None  # (a config the plan would refuse, refused here alike)
    if why:
        raise ValueError(why)
    v = torch.empty(1, 1, seqlen_k, dv, dtype=tdt)
    o = torch.empty(*q.shape[:3], dv, dtype=torch.bfloat16 if fp8 else tdt)  # float8 q: O in bfloat16
    if page:  # a pool of two pages [pages, page, kv_heads, D]
        k, v = torch.empty(2, page, 1, head_dim, dtype=tdt), torch.empty(2, page, 1, dv, dtype=tdt)
    vt = torch.empty(1, dv, -(-seqlen_k // 32) * 32, dtype=tdt) if fp8 else None  # V^T's stand-in
    descs, _ = hopper.descriptors(prob, cfg, q, k, v, o, "bhsd", vt)
    kernel = hopper.KERNEL
    # causal: the paired schedule (balance: with its host-built tail); non-causal dense with split_tail:
    # the pieces of the last round
    split = bool(cfg.split_tail) and not causal and lengths == "dense"
    const = hopper.constexprs(prob, cfg, store_lse=False, paired=causal, split=split,
                              balance=causal and bool(cfg.balance))
    sig = {}
    for name in kernel.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_desc"):
            d = descs[("q_desc", "k_desc", "v_desc", "o_desc").index(name)]
            sig[name] = native_specialize_impl(BaseBackend, d, False, True, True)[0]
        elif name in ("LSE", "Alibi", "PieceO", "PieceLSE", "Descale"):
            sig[name] = "*fp32"
        elif name in ("CuQ", "CuK", "SeqK", "Items", "Pages", "Rows"):
            sig[name] = "*i32"
        elif name == "O":
            sig[name] = "*" + ("bf16" if fp8 else DTYPES[dtype])
        elif name in ("scale_log2", "cap_in", "cap_out", "alibi_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return GluonASTSource(kernel, sig, const)


def _backward_cut(head_dim: int, causal: bool, deterministic: bool, head_dim_v: int, softcap: bool):
    """The Gluon backward's tiles for a call of these (:func:`fmha.kernels.hopper.backward.cut_of`)."""
    from .kernels.hopper import backward
    from .plan import Problem
    dv = head_dim_v or head_dim
    prob = Problem(1, 1, 1, 256, 256, head_dim, causal, 0, 1.0, softcap=float(softcap),
                   head_dim_v=dv if dv != head_dim else 0)
    return backward.cut_of(prob, deterministic)


def _compile_backward(head_dim: int, dtype: str, causal: bool, deterministic: bool, window: bool, ragged: bool,
                      varlen: bool, head_dim_v: int, softcap: bool = False, alibi: bool = False):
    """The Gluon backward (:mod:`fmha.kernels.hopper.backward`) compiled for sm_90 from stand-in CPU
    tensors: Triton's compiled kernel, its PTX after fmha's passes (the dQ stores made reduce-adds)."""
    import torch
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend
    from triton.experimental.gluon._runtime import GluonASTSource

    from .kernels.hopper import backward, narrow_pass, reduce_pass
    tdt = {"float16": torch.float16, "bfloat16": torch.bfloat16}[dtype]
    head = backward.tile_width(head_dim)
    cut = _backward_cut(head_dim, causal, deterministic, head_dim_v, softcap)
    t = torch.empty(1, 1, 256, head_dim, dtype=tdt)
    tv = torch.empty(1, 1, 256, head_dim_v, dtype=tdt)
    stat = torch.empty(1, 256, dtype=torch.float32)
    dq = torch.empty(1, 256, head_dim, dtype=torch.float32)
    descs, _ = backward.descriptors(t, t, tv, tv, dq, stat, stat, "bhsd", head, cut)
    kernel = backward.backward_kernel
    const = dict(HEAD=head, D=head_dim, D_V=head_dim_v, CAUSAL=causal, WINDOW=window, RAGGED=ragged or varlen,
                 RS=cut.rs, DS_BUFS=cut.ds_bufs, DETERMINISTIC=deterministic, VARLEN=varlen, ALIGN_BR=varlen,
                 DYNAMIC=backward.schedule(1, 1, causal, varlen, deterministic)[1], STAGES=cut.stages, COLS=cut.cols,
                 EARLY=cut.early_free, SOFTCAP=softcap, ALIBI=alibi)
    by_name = dict(zip(("q_desc", "k_desc", "v_desc", "do_desc", "dq_desc", "lse_desc", "delta_desc"), descs))
    sig = {}
    for name in kernel.arg_names:
        if name in const:
            sig[name] = "constexpr"
        elif name in by_name:
            sig[name] = native_specialize_impl(BaseBackend, by_name[name], False, True, True)[0]
        elif name in ("Locks", "Deal", "CuQ", "CuK"):
            sig[name] = "*i32"
        elif name in ("DK", "DV"):
            sig[name] = "*" + DTYPES[dtype]
        elif name == "Alibi":
            sig[name] = "*fp32"
        elif name in ("scale_log2", "scale", "cap_in", "cap_out", "alibi_scale"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    reduce_pass.install()
    narrow_pass.install()
    return triton.compile(GluonASTSource(kernel, sig, const), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4})


def build_hopper_backward(head_dim: int, dtype: str = "bfloat16", causal: bool = False, deterministic: bool = False,
                          window: bool = False, ragged: bool = False, varlen: bool = False,
                          head_dim_v: int = 0, softcap: bool = False, alibi: bool = False) -> "Build":
    """The Gluon backward built for ``sm_90`` as a :class:`Build` (variant ``hopper_backward``) for :func:`report`
    and :func:`write`: its config names the tile (query rows, keys a program: 128, 64 past head_dim 128), the ring's
    depth, the CTA's 12 warps (two consumer warpgroups and the producer's, padded to a warpgroup) and, deterministic,
    the fixed order of dQ's adds.  ``window``: built for a sliding window's lower edge; ``ragged``: for a key count
    not a multiple of the key block; ``varlen``: for packed sequences (bottom-right aligned, ragged);
    ``head_dim_v``: V's, if narrower; ``softcap``, ``alibi``: built to cap and bias the scores as the forward's."""
    from .kernels.hopper import backward
    _check_choice("dtype", dtype, ["float16", "bfloat16"])
    _check_choice("head_dim", head_dim, backward.HEAD_DIMS)
    if head_dim_v:
        _check_choice("head_dim_v", head_dim_v, [d for d in backward.HEAD_DIMS if d <= head_dim])
    flags = dict(window=window, ragged=ragged, varlen=varlen, softcap=softcap, alibi=alibi)
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return _build_elsewhere(head_dim, dtype, causal, deterministic, window, ragged, varlen, head_dim_v, softcap,
                                alibi, builder="build_hopper_backward")
    compiled = _compile_backward(head_dim, dtype, causal, deterministic, **flags, head_dim_v=head_dim_v or head_dim)
    cut = _backward_cut(head_dim, causal, deterministic, head_dim_v, softcap)
    cfg = dict(block_m=cut.rows, block_n=cut.block_n, num_warps=12, num_stages=cut.stages,
               **({"head_dim_v": head_dim_v} if head_dim_v and head_dim_v != head_dim else {}),
               **({"deterministic": True} if deterministic else {}), **{k: True for k, v in flags.items() if v})
    return Build("hopper_backward", "sm_90", head_dim, dtype, causal, cfg, dict(compiled.asm),
                 _plain(compiled.metadata))


def family_of_target(target: str) -> str:
    """The backward's tile table of ``target`` (:func:`fmha.device.family_of`): nvidia, sm80, rdna or cdna."""
    chip = TARGETS[target]
    if chip.backend != "hip":
        return "nvidia" if chip.arch >= 90 else "sm80"
    return "rdna" if chip.arch.startswith("gfx1") else "cdna"


def build_backward_kernels(target: str, head_dim: int, dtype: str = "bfloat16", causal: bool = False,
                           deterministic: bool = False, attn_mask: bool | str = False,
                           shared: int = 0, mask_grad: bool = False, dropout: bool = False,
                           head_dim_v: int = 0) -> list["Build"]:
    """The portable backward's kernels (:mod:`fmha.kernels.backward`: dK/dV, and dQ unless the first adds it
    atomically) compiled for ``target`` without a GPU, with the tiles :func:`fmha.backward.tiles` picks
    there; their ``variant`` is the kernel's name.  ``attn_mask``: built to read one (:func:`_mask_build`);
    ``mask_grad``: a bias's gradient too, stored by the dQ kernel (in the deterministic tiles, as the backward
    takes them then).  ``dropout``: built to drop the forward's attention probabilities again
    (:mod:`fmha.kernels.dropout`).
    ``shared``: the bytes of shared memory a block may take, as a GPU of that target has them (0: the target's
    SM's less 1 KB: an A100's for sm_80).  ``head_dim_v``: V's head dim where it is not q/k's (DeepSeek-V3's 128
    beside 192), in the tiles the backward takes for the larger."""
    from .backward import tiles
    from .plan import v_tile
    from .kernels import backward as kernels
    _check_choice("target", target, list(TARGETS))
    _check_choice("dtype", dtype, ["float16", "bfloat16"])
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return _build_elsewhere(target, head_dim, dtype, causal, deterministic, attn_mask, shared, mask_grad, dropout,
                                head_dim_v, builder="build_backward_kernels")
    chip = TARGETS[target]
    # a block's shared memory: an SM's less the 1 KB the driver keeps (an A100's 163 KB for sm_80)
    if mask_grad and attn_mask in (False, True):
        raise ValueError("mask_grad: the gradient of a float attn_mask (attn_mask='bias')")
    dv = head_dim_v or head_dim
    if dv != head_dim:
        _check_choice("head_dim_v", dv, list(range(8, 257, 8)))
    kv_tiles, q_tiles = tiles(max(head_dim, dv), causal, deterministic or mask_grad, family_of_target(target),
                              shared or chip.shared_bytes - 1024, bool(attn_mask), dropout, head_dim_v=dv)
    block_d = max(16, triton.next_power_of_2(head_dim))
    out = []
    for kernel, t in ((kernels.dkdv_kernel, kv_tiles), (kernels.dq_kernel, q_tiles)):
        if t is None:
            continue
        atomic = kernel is kernels.dkdv_kernel and q_tiles is None
        const = dict(HEAD_DIM=head_dim, BLOCK_D=block_d, BLOCK_M=t["BLOCK_M"], BLOCK_N=t["BLOCK_N"], CAUSAL=causal,
                     WINDOW=False, SOFTCAP=False, ALIBI=False, VARLEN=False, SEQUSED=False, ALIGN_BR=False,
                     HEAD_V=dv, BLOCK_DV=v_tile(head_dim, dv), QK_CHUNKS=t["QK_CHUNKS"],
                     **_mask_build(attn_mask, kernel)[0])
        if dropout:
            const["DROPOUT"] = True
        if t.get("HALVES"):  # the dK/dV kernel's columns in halves
            const["HALVES"] = True
        if "ATOMIC_DQ" in kernel.arg_names:
            const["ATOMIC_DQ"] = atomic
        else:  # the dQ kernel
            const["MASK_GRAD"] = mask_grad
        dt = DTYPES[dtype]
        aligned = {**dict.fromkeys(("Q", "K", "V", "DO", "DK", "DV"), dt), "DQ": "fp32" if atomic else dt,
                   **dict.fromkeys(("LSE", "Delta", "Alibi", "DMask"), "fp32"), **_mask_build(attn_mask, kernel)[1],
                   **({"Seed": "i64"} if dropout else {})}
        compiled = _compile(kernel, const, aligned, chip, t["num_warps"], t["num_stages"])
        cfg = dict(block_m=t["BLOCK_M"], block_n=t["BLOCK_N"], num_warps=t["num_warps"], num_stages=t["num_stages"],
                   **({"qk_chunks": t["QK_CHUNKS"]} if t["QK_CHUNKS"] else {}),
                   **({"halves": True} if t.get("HALVES") else {}),
                   **({"head_dim_v": dv} if dv != head_dim else {}),
                   **({"deterministic": True} if deterministic else {}))
        out.append(Build(kernel.__name__, target, head_dim, dtype, causal, cfg, dict(compiled.asm),
                         _plain(compiled.metadata)))
    return out


def _mask_build(attn_mask: bool | str, kernel, chip=None) -> tuple[dict, dict]:
    """The constexprs and the mask's pointer type of ``kernel``'s build that reads an attn_mask: ``True`` a boolean
    one (bytes), ``"bias"`` an additive float32 one, either with its keys next to each other as a launch on
    ``chip`` reads them (a specialised stride, or ``tiled``'s MASK_UNIT: :func:`fmha.kernels.mask_unit`); ``False``
    none."""
    if not attn_mask:
        return dict(ATTN_MASK=0), {}
    if attn_mask not in (True, "bias"):
        raise ValueError(f"attn_mask: True (boolean), 'bias' (float32) or False, got {attn_mask!r}")
    if "MASK_UNIT" in kernel.arg_names:
        from .kernels import mask_unit_on
        major = chip.arch // 10 if chip is not None and chip.backend == "cuda" else 0  # (AMD's arch is its name)
        unit = dict(MASK_UNIT=chip is not None and mask_unit_on(chip.backend, major))
    else:
        unit = {} if "stride_mk" in kernel.do_not_specialize else dict(stride_mk=1)
    return dict(ATTN_MASK=1 if attn_mask is True else 2, **unit), {"AttnMask": "fp32"} if attn_mask == "bias" else {}


def _build_elsewhere(*args, builder: str = "build"):
    """Under ``TRITON_INTERPRET=1`` (the CPU tests) the build (``targets.<builder>(*args)``) runs in a child
    process with the interpreter off: Triton fixes interpretation when kernels are defined, and once an interpreted
    kernel has called one of ``triton.language.standard``'s functions (``tl.cdiv``, ``tl.max``), Triton 3.6's
    interpreter leaves ``triton.language.core``'s builtins patched for good (its device-function call patches
    without restoring), so a compile in that process would run the interpreter's arithmetic on IR values."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "build.pickle"
        code = ("import pickle, sys; from fmha import targets; from fmha.configs import KernelConfig; "
                f"pickle.dump(targets.{builder}(*{args!r}), open({str(path)!r}, 'wb'))")
        env = dict(os.environ, TRITON_INTERPRET="0")
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"ahead-of-time build failed:\n{out.stderr[-3000:]}")
        return pickle.loads(path.read_bytes())


@dataclass
class Build:
    variant: str
    target: str
    head_dim: int
    dtype: str
    causal: bool
    config: dict
    asm: dict          # stage name -> text or bytes (ttir, ttgir, llir, ptx/amdgcn, cubin/hsaco)
    metadata: dict


@dataclass
class Report:
    variant: str
    target: str
    head_dim: int
    dtype: str
    causal: bool
    config: dict
    wave_size: int
    matrix_instructions: dict = field(default_factory=dict)
    registers: dict = field(default_factory=dict)
    shared_bytes: int = 0
    scratch_bytes: int = 0
    spilled_registers: int | None = None
    occupancy: dict = field(default_factory=dict)
    loop_memory: dict = field(default_factory=dict)
    loop_reductions: dict = field(default_factory=dict)
    loop_tile: dict = field(default_factory=dict)  # AMD: one key tile's work, from the loop body (see tile_work)
    sass_matrix_instructions: dict | None = None
    files: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def unbuildable(variant: str, target: str, head_dim: int, dtype: str = "float16") -> str | None:
    """Why ``variant`` has no build for ``target`` at ``head_dim`` in ``dtype``, or None: the Gluon
    kernel is written for one chip; float8 runs on ``tiled`` (K/V dequantized on load, NVIDIA GPUs of sm_89
    or newer) and on ``hopper`` (q, k and v float8, at the head dims :func:`.kernels.hopper.fp8_head_dim_reason`
    names)."""
    if variant == "hopper" and target != "sm_90":
        return f"variant 'hopper' builds for sm_90 only, not {target!r}"
    if dtype == "float8_e4m3fn":
        if variant not in ("tiled", "hopper"):
            return f"float8 runs on the tiled variant (K/V dequantized on load) or on hopper, not {variant!r}"
        if target != "sm_90":
            return f"float8_e4m3fn builds for sm_90 (of these targets), not {target!r}"
        if variant == "hopper":
            from .kernels import hopper
            return hopper.fp8_head_dim_reason(head_dim, head_dim)
    return None


def _check_choice(kind: str, value, valid) -> None:
    if value not in valid:
        raise ValueError(f"unsupported {kind} {value!r}; valid: {', '.join(map(str, valid))}")


def build(variant: str, target: str, head_dim: int = 128, dtype: str = "float16", causal: bool = False,
          config=None, seqlen_k: int = 0, lengths: str = "dense", head_dim_v: int = 0,
          attn_mask: bool | str = False, checked: bool = False, modifiers: bool | tuple = False,
          dropout: bool = False) -> Build:
    """Compile ``variant`` for ``target`` (a key of :data:`TARGETS`) without a GPU.  ``seqlen_k``
    matters to ``hopper`` only (a length off its key tile builds the ragged key mask); ``lengths`` to ``hopper``
    and ``tiled`` ("varlen" or "seqused" the lengths per sequence; "paged" those in a paged cache of 256-key
    pages).  ``head_dim_v``:
    V's head dim where it differs from q/k's (DeepSeek's 192/128; no larger), 0 where it does not.
    ``attn_mask`` (``tiled``): built to read an attn_mask (:func:`_mask_build`).
    ``checked`` (``tiled``, ``lengths`` "varlen" or "paged"): the kernel checks the indices it follows itself, built
    with its asserts (:func:`fmha.forward.self_checked`).  ``modifiers`` (the Triton variants): built with a window,
    softcap, ALiBi and the LSE all at once (the most registers they take), in the config the plan takes beside
    them; or some of them, named (:data:`MODIFIERS`).  ``dropout`` (``tiled``): built to drop attention
    probabilities (:mod:`fmha.kernels.dropout`)."""
    from . import configs
    _check_choice("target", target, list(TARGETS))
    _check_choice("variant", variant, variants())
    _check_choice("dtype", dtype, list(DTYPES))
    _check_choice("head_dim", head_dim, (HOPPER_HEAD_DIMS if variant == "hopper" else HEAD_DIMS)
                  + ((MLA_ABSORBED[0],) if variant == "tiled" else ()))
    _check_choice("lengths", lengths, ("dense", "varlen", "seqused", "paged"))
    if head_dim_v:
        if variant in ("singlewave", "pipelined") or head_dim == MLA_ABSORBED[0]:
            raise ValueError(f"head_dim_v: {variant} at head_dim {head_dim} takes V's head dim as it is")
        _check_choice("head_dim_v", head_dim_v, [d for d in (HOPPER_HEAD_DIMS if variant == "hopper" else HEAD_DIMS)
                                                 if d <= head_dim])
    if attn_mask and variant != "tiled":
        raise ValueError(f"attn_mask: {variant} takes none (the tiled variant reads it)")
    if dropout and (variant != "tiled" or lengths == "paged" or head_dim == MLA_ABSORBED[0]):
        raise ValueError("dropout: the tiled variant's, not over a paged cache")
    if modifiers and variant == "hopper":
        raise ValueError("modifiers: the Triton variants' switch (hopper builds its own per call)")
    if checked and (variant != "tiled" or lengths not in ("varlen", "paged")):
        raise ValueError("checked: the tiled variant checks its own cu_seqlens (lengths='varlen') or block table "
                         "(lengths='paged')")
    reason = unbuildable(variant, target, head_dim, dtype)
    if reason:
        raise ValueError(reason)
    if not isinstance(modifiers, bool):
        for name in modifiers:
            _check_choice("modifier", name, MODIFIERS)
    mods = MODIFIERS if modifiers is True else tuple(modifiers or ())
    if os.environ.get("TRITON_INTERPRET", "0") == "1":
        return _build_elsewhere(variant, target, head_dim, dtype, causal, config, seqlen_k, lengths, head_dim_v,
                                attn_mask, checked, modifiers, dropout)
    chip = TARGETS[target]
    arch_key = "hip" if chip.backend == "hip" else ("sm90" if chip.arch == 90 else "sm80")
    scored = bool(set(mods) - {"lse"}) or bool(attn_mask)  # what the plan's configs call modifiers
    cfg = config or configs.default_config(variant, arch_key, head_dim, causal, fp8=dtype == "float8_e4m3fn",
                                           head_dim_v=head_dim_v or 0, modifiers=scored, masked=bool(attn_mask),
                                           dropout=dropout)
    if variant == "hopper":
        from .kernels import hopper
        compiled = triton.compile(_hopper_source(head_dim, dtype, causal, cfg, seqlen_k, lengths, head_dim_v),
                                  target=GPUTarget(chip.backend, chip.arch, chip.warp_size),
                                  options={"num_warps": cfg.num_warps, **hopper.launch_options(cfg)})
        return Build(variant, target, head_dim, dtype, causal, cfg.as_dict(), dict(compiled.asm),
                     _plain(compiled.metadata))
    from .kernels import VARIANTS
    kernel = VARIANTS[variant]
    const = dict(HEAD_DIM=head_dim, BLOCK_D=max(16, triton.next_power_of_2(head_dim)), BLOCK_M=cfg.block_m,
                 BLOCK_N=cfg.block_n, CAUSAL=causal, STORE_LSE="lse" in mods, WINDOW="window" in mods,
                 SOFTCAP="softcap" in mods, ALIBI=int("alibi" in mods),
                 VARLEN=False, SEQUSED=False, ALIGN_BR=False, SPLIT=False, PAGED=False, PAGE=1,
                 PACK_GQA=False, KV_TMA=False)
    if "HEAD_V" in kernel.arg_names:  # tiled: V's head dim
        from .plan import v_tile
        dv = head_dim_v or head_dim
        const.update(HEAD_V=dv, BLOCK_DV=v_tile(head_dim, dv))
    if "AMD" in kernel.arg_names:  # pipelined: the build orders its loop for gfx11's WMMA registers
        const.update(AMD=chip.backend == "hip")
    if "QK_CHUNKS" in kernel.arg_names:  # tiled: Q K^T batched over column chunks
        const.update(QK_CHUNKS=cfg.qk_chunks)
    fp8 = dtype == "float8_e4m3fn"
    if "FP8" in kernel.arg_names:  # tiled: float8 K/V (and q) dequantized on load, the output bfloat16
        const.update(FP8=fp8)
    if "QK_LO" in kernel.arg_names:  # tiled: no second slice of Q K^T (MLA's absorbed form), V read apart
        const.update(QK_LO=0, V_FROM_K=False)
    if "MERGE" in kernel.arg_names:  # tiled: a split launch's partials merged apart; an attn_mask when asked
        const.update(MERGE=False, MERGE_LSE=False, **_mask_build(attn_mask, kernel, chip)[0])
    if "CHECKED" in kernel.arg_names:  # tiled: lengths per sequence or a paged cache of 256-key pages
        const.update(CHECKED=checked, VARLEN=lengths == "varlen", PAGED=lengths == "paged",
                     SEQUSED=lengths in ("seqused", "paged"), PAGE=256 if lengths == "paged" else 1)
    if head_dim == MLA_ABSORBED[0]:  # MLA's absorbed decode: 512 + 64 columns, V K's first 512, keys split, GQA packed
        const.update(HEAD_DIM=512, BLOCK_D=512, HEAD_V=512, BLOCK_DV=512, QK_LO=64, V_FROM_K=True, SPLIT=True,
                     PACK_GQA=True, ALIGN_BR=True, SEQUSED=True)
    const.update({name: 1 for name in kernel.arg_names  # unit strides, as launches specialise them
                  if name.startswith("stride_") and name.endswith("d") and name not in const})
    if dropout:
        const.update(DROPOUT=True)
    out = "bf16" if fp8 else DTYPES[dtype]
    aligned = {**dict.fromkeys(("Q", "K", "V"), DTYPES[dtype]), **dict.fromkeys(("O", "Out"), out),
               **dict.fromkeys(("LSE", "Alibi", "Descale", "LseOut"), "fp32"), **_mask_build(attn_mask, kernel)[1],
               **({"Seed": "i64"} if dropout else {})}
    from .kernels.guards import CHECK_OPTIONS
    compiled = _compile(kernel, const, aligned, chip, cfg.num_warps, cfg.num_stages, CHECK_OPTIONS if checked else {})
    return Build(variant, target, head_dim, dtype, causal, cfg.as_dict(), dict(compiled.asm),
                 _plain(compiled.metadata))


def _compile(kernel, const: dict, aligned: dict, chip, num_warps: int, num_stages: int, options=None):
    """Triton's build of the Triton ``kernel`` for ``chip`` as a launch specialises it: ``const`` its constexprs,
    ``aligned`` the element type of each pointer it reads 16-byte aligned; the cu_seqlens, lengths and block
    table int32 pointers, the scale, softcap and dropout probability float32, every other argument an int32
    (strides divisible by 16); a constexpr not in ``const`` and an argument whose default is None take their
    defaults, as a launch that leaves them out does (``BH_BASE`` 0: one launch's grid, :func:`fmha.replay.launch`;
    no dropout); ``options``: more of Triton's build options."""
    sig, attrs = {}, {}
    const = {**{p.name: p.default for p in kernel.params
                if p.has_default and (p.is_constexpr or p.default is None) and p.name not in aligned}, **const}
    for i, name in enumerate(kernel.arg_names):
        if name in const:
            sig[name] = "constexpr"
        elif name in aligned:
            sig[name], attrs[(i,)] = "*" + aligned[name], [["tt.divisibility", 16]]
        elif name in ("CuQ", "CuK", "SeqK", "BlockTable", "Tickets"):
            sig[name] = "*i32"
        elif name == "AttnMask":
            sig[name] = "*u8"
        elif name in ("scale_log2", "softcap", "dropout_p"):
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
            if name.startswith("stride_") and name not in kernel.do_not_specialize:
                attrs[(i,)] = [["tt.divisibility", 16]]
    target = GPUTarget(chip.backend, chip.arch, chip.warp_size)
    return triton.compile(ASTSource(kernel, sig, const, attrs), target=target,
                          options={"num_warps": num_warps, "num_stages": num_stages, **(options or {})})


def _plain(md) -> dict:
    metadata = md._asdict() if hasattr(md, "_asdict") else dict(vars(md))
    return {k: v for k, v in metadata.items() if isinstance(v, (int, float, str, bool))}


# --- reading the assembly -------------------------------------------------------------------------

MATRIX = {"hip": r"\b(v_wmma_\w+|v_mfma_\w+|v_smfmac_\w+)", "cuda": r"\b(wgmma\.mma_async[\w.]*|mma\.sync[\w.]*)"}
MEMORY = {
    "hip": r"\b(global_load_\w+|global_store_\w+|buffer_load_\w+|buffer_store_\w+|ds_(?:read|load)\w*|"
           r"ds_(?:write|store)\w*|scratch_load_\w+|scratch_store_\w+)",
    "cuda": r"\b(ld\.global[\w.]*|st\.global[\w.]*|cp\.async\.bulk\.tensor[\w.:]*|cp\.async\.c[ag][\w.]*|"
            r"ld\.shared[\w.:]*|st\.shared[\w.:]*|ldmatrix[\w.:]*|stmatrix[\w.:]*|ld\.local[\w.]*|st\.local[\w.]*)",
}
REDUCTIONS = {
    "hip": r"(\bv_permlane\w*|\bds_swizzle\w*|\bds_bpermute\w*|\bv_\w+_dpp\b|row_shr:\d+|row_xmask:\d+|"
           r"row_ror:\d+|row_share:\d+|quad_perm:\[[\d,]+\]|row_bcast:\d+)",
    "cuda": r"\b(shfl\.sync\.\w+[\w.]*|redux\.sync[\w.]*)",
}
LABEL = {"hip": r"^(\.LBB\d+_\d+):", "cuda": r"^(\$L__BB\d+_\d+):"}
BRANCH = {"hip": r"\bs_c?branch\w*\s+(\.LBB\d+_\d+)", "cuda": r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+);"}


# the bytes one lane moves per memory instruction, by its width suffix
WIDTH_BYTES = {"b32": 4, "b64": 8, "b96": 12, "b128": 16, "u16": 2, "d16_hi": 2, "u8": 1, "dword": 4,
               "dwordx2": 8, "dwordx4": 16}


def tile_work(loop: str, wave_size: int, rows: int, key_tile: int) -> dict:
    """One key tile's work in an AMD key loop that runs one tile an iteration (``singlewave``,
    ``pipelined``): its instructions by kind, the FLOPs of its matrix instructions (a 16x16x16
    WMMA is 2 * 16**3 per wave), the bytes it reads from global memory (width x lanes), and their
    ratio, the arithmetic intensity to hold against a chip's FLOP/byte ridge (peak rate over DRAM
    bandwidth: below it, the tile waits on its operands)."""
    pattern = re.compile(r"\s+([sv]_|global_|ds_|scratch_|buffer_)")
    instr = [line.split()[0] for line in loop.splitlines() if pattern.match(line)]
    wmma = sum(1 for i in instr if i.startswith("v_wmma_"))
    flops = 2 * 16 * 16 * 16 * wmma

    def moved(prefix):
        return sum(WIDTH_BYTES.get(i.rsplit("_", 1)[-1], 4) * wave_size for i in instr if i.startswith(prefix))

    global_bytes = moved("global_load")
    return {"instructions": len(instr), "wmma": wmma, "valu": sum(i.startswith("v_") for i in instr) - wmma,
            "salu": sum(i.startswith("s_") for i in instr),
            "lds": sum(i.startswith("ds_") for i in instr), "global": sum(i.startswith("global_") for i in instr),
            "scratch": sum(i.startswith("scratch_") for i in instr), "flops": flops, "global_bytes": global_bytes,
            "flop_per_byte": round(flops / global_bytes, 1) if global_bytes else None,
            "rows": rows, "keys": key_tile}


def _count(pattern: str, text: str) -> dict:
    out: dict = {}
    for m in re.finditer(pattern, text, re.M):
        name = m.group(1)
        name = re.sub(r":\d+$", "", re.sub(r":\[[\d,]+\]$", "", name))  # row_shr:1 -> row_shr
        out[name] = out.get(name, 0) + 1
    return dict(sorted(out.items()))


def key_loop(asm: str, backend: str) -> str:
    """The loop (label ... backward branch to it) holding the most matrix instructions."""
    lines = asm.splitlines()
    labels = {}
    loops = []
    for i, line in enumerate(lines):
        m = re.match(LABEL[backend], line.strip())
        if m:
            labels[m.group(1)] = i
        b = re.search(BRANCH[backend], line)
        if b and b.group(1) in labels:
            loops.append("\n".join(lines[labels[b.group(1)]:i + 1]))
    if not loops:
        return ""
    return max(loops, key=lambda body: (len(re.findall(MATRIX[backend], body)), len(body)))


def _elf_sections(blob: bytes) -> dict:
    """Section name -> (sh_info, offset, size) of a little-endian ELF64 image."""
    shoff, = struct.unpack_from("<Q", blob, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    str_off = heads[shstrndx][4]
    out = {}
    for h in heads:
        end = blob.index(b"\0", str_off + h[0])
        out[blob[str_off + h[0]:end].decode()] = (h[7], h[4], h[5])
    return out


def cubin_attributes(cubin: bytes) -> dict:
    """The cubin's own record of its kernel: ``.nv.info`` attributes EIATTR_REGCOUNT (0x2f),
    EIATTR_FRAME_SIZE (0x11) and EIATTR_MIN_STACK_SIZE (0x12), for the one kernel inside."""
    _, off, size = _elf_sections(cubin)[".nv.info"]
    names = {0x2F: "registers", 0x11: "frame_bytes", 0x12: "min_stack_bytes"}
    out, i = {}, off
    while i < off + size:
        fmt, attr = cubin[i], cubin[i + 1]
        if fmt == 0x04:  # EIFMT_SVAL: u16 size, then (u32 symbol, u32 value) for these attributes
            n, = struct.unpack_from("<H", cubin, i + 2)
            if attr in names and n == 8:
                out[names[attr]] = struct.unpack_from("<I", cubin, i + 8)[0]
            i += 4 + n
        else:
            i += 4
    return out


def hsaco_metadata(hsaco: bytes) -> dict:
    """``.vgpr_count``, ``.sgpr_count``, ``.vgpr_spill_count``, ``.group_segment_fixed_size`` and
    ``.private_segment_fixed_size`` from the code object's msgpack note."""
    out = {}
    for key in (".vgpr_count", ".sgpr_count", ".vgpr_spill_count", ".sgpr_spill_count",
                ".group_segment_fixed_size", ".private_segment_fixed_size", ".wavefront_size"):
        i = hsaco.find(bytes([0xA0 | len(key)]) + key.encode())
        if i < 0:
            continue
        j = i + 1 + len(key)
        tag = hsaco[j]
        if tag < 0x80:
            out[key] = tag
        elif tag == 0xCC:
            out[key] = hsaco[j + 1]
        elif tag == 0xCD:
            out[key] = struct.unpack_from(">H", hsaco, j + 1)[0]
        elif tag == 0xCE:
            out[key] = struct.unpack_from(">I", hsaco, j + 1)[0]
    return out


def ptxas_usage(ptx: str, arch: int) -> dict:
    """Registers, spill bytes and stack frame from ``ptxas -v`` (an independent second reading), and whether
    ptxas serialized the wgmma instructions (``serialized``: it waits for each product before the next, for
    instance where a product's accumulator registers are read or copied while it may be in flight)."""
    from triton.backends.nvidia.compiler import get_ptxas
    exe = get_ptxas(arch).path if hasattr(get_ptxas(arch), "path") else get_ptxas(arch)
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        suffix = "a" if arch >= 90 else ""
        out = subprocess.run([exe, "-v", f"--gpu-name=sm_{arch}{suffix}", str(src), "-o", str(Path(d) / "k.o")],
                             capture_output=True, text=True, timeout=300)
    text = out.stdout + out.stderr
    g = lambda p: int(m.group(1)) if (m := re.search(p, text)) else 0  # noqa: E731
    return {"registers": g(r"Used (\d+) registers"), "spill_stores": g(r"(\d+) bytes spill stores"),
            "spill_loads": g(r"(\d+) bytes spill loads"), "stack_frame": g(r"(\d+) bytes stack frame"),
            "serialized": "wgmma.mma_async instructions are serialized" in text}


def report(b: Build) -> Report:
    """What the build became: instructions, resources, occupancy, the key loop's traffic."""
    chip = TARGETS[b.target]
    r = Report(b.variant, b.target, b.head_dim, b.dtype, b.causal, b.config, chip.warp_size)
    # a warp-specialised kernel runs its consumer warpgroups and the producer's warp, padded to a warpgroup
    warps = 4 * (b.config["block_m"] // 64 + 1) if b.variant == "hopper" else b.config["num_warps"]
    r.shared_bytes = int(b.metadata.get("shared", 0))
    if chip.backend == "hip":
        asm = b.asm["amdgcn"]
        meta = hsaco_metadata(b.asm["hsaco"])
        vgpr, sgpr = meta.get(".vgpr_count", 0), meta.get(".sgpr_count", 0)
        r.registers = {"vgpr": vgpr, "sgpr": sgpr}
        r.scratch_bytes = meta.get(".private_segment_fixed_size", 0)
        r.spilled_registers = meta.get(".vgpr_spill_count", 0) + meta.get(".sgpr_spill_count", 0)
        r.wave_size = meta.get(".wavefront_size", chip.warp_size)
        alloc = -(-max(vgpr, 1) // chip.reg_granule) * chip.reg_granule
        by_regs = min(chip.max_waves, chip.regs // alloc)
        groups_per_lds = chip.shared_bytes // r.shared_bytes if r.shared_bytes else None
        # waves of one workgroup spread over the SIMDs; LDS is shared by the WGP/CU
        by_lds = (groups_per_lds * warps) // chip.simds if groups_per_lds is not None else None
        waves = min(by_regs, by_lds) if by_lds is not None else by_regs
        llvm = re.search(r"; Occupancy: (\d+)", asm)
        r.occupancy = {"waves_per_simd": max(waves, 0), "limited_by_vgprs": by_regs, "limited_by_lds": by_lds,
                       "llvm_estimate": int(llvm.group(1)) if llvm else None}
    else:
        asm = b.asm["ptx"]
        attrs = cubin_attributes(b.asm["cubin"])
        regs = attrs.get("registers", 0)
        r.registers = {"per_thread": regs}
        r.scratch_bytes = attrs.get("frame_bytes", 0)
        try:  # spills are not in the cubin's attributes: ask ptxas
            r.spilled_registers = ptxas_usage(asm, chip.arch)["spill_stores"] // 4
        except (OSError, subprocess.SubprocessError, ImportError, RuntimeError):
            r.spilled_registers = None
        per_warp = -(-regs * 32 // chip.reg_granule) * chip.reg_granule
        by_regs = chip.regs // (per_warp * warps) if regs else chip.max_blocks
        by_smem = chip.shared_bytes // (r.shared_bytes + 1024)
        by_warps = chip.max_waves // warps
        ctas = min(by_regs, by_smem, by_warps, chip.max_blocks)
        r.occupancy = {"ctas_per_sm": ctas, "warps_per_sm": ctas * warps, "limited_by_registers": by_regs,
                       "limited_by_shared": by_smem, "limited_by_warps": by_warps}
        sass = sass_of(b.asm["cubin"])
        if sass:
            r.sass_matrix_instructions = _count(r"\b(HGMMA[\w.]*|HMMA[\w.]*)", sass)
    r.matrix_instructions = _count(MATRIX[chip.backend], asm)
    loop = key_loop(asm, chip.backend)
    r.loop_memory = _count(MEMORY[chip.backend], loop)
    r.loop_reductions = _count(REDUCTIONS[chip.backend], loop)
    if chip.backend == "hip" and b.variant in ("singlewave", "pipelined"):
        r.loop_tile = tile_work(loop, r.wave_size, b.config["block_m"], b.config["block_n"])
    return r


def sass_of(cubin: bytes) -> str | None:
    """SASS through cuobjdump, where one is installed."""
    exe = shutil.which("cuobjdump")
    if not exe:
        return None
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "k.cubin"
        path.write_bytes(cubin)
        out = subprocess.run([exe, "--dump-sass", str(path)], capture_output=True, text=True, timeout=300)
    return out.stdout if out.returncode == 0 else None


def write(b: Build, r: Report, out_dir) -> list[Path]:
    """Binary, assembly and intermediate IRs of ``b`` under ``out_dir``; records the paths in ``r``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = f"{b.variant}_{b.target}_d{b.head_dim}_{b.dtype}{'_causal' if b.causal else ''}"
    paths = []
    for stage, data in b.asm.items():
        path = out_dir / f"{stem}.{stage}"
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        paths.append(path)
    if "cubin" in b.asm:
        sass = sass_of(b.asm["cubin"])
        if sass:
            (out_dir / f"{stem}.sass").write_text(sass)
            paths.append(out_dir / f"{stem}.sass")
    (out_dir / f"{stem}.report.json").write_text(r.to_json())
    paths.append(out_dir / f"{stem}.report.json")
    r.files = [str(p) for p in paths]
    return paths
