"""The public entry point: check the inputs once, pick a variant and its config, launch."""
from __future__ import annotations

import contextlib
import dataclasses
import math
import os

import torch

from . import configs
from .gradients import forward_only

LOG2E = math.log2(math.e)
HEAD_DIMS = (32, 64, 96, 128, 256)
DTYPES = (torch.float16, torch.bfloat16)
LAYOUTS = ("bhsd", "bshd")
CAUSAL_ALIGNS = ("top_left", "bottom_right")


def interpreting() -> bool:
    """True when Triton's CPU interpreter runs the kernels (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def arch_of(device: torch.device) -> str:
    """The config-table key of ``device``: interpreter, sm90, sm80 (other CUDA) or hip."""
    if interpreting():
        return "interpreter"
    if torch.version.hip:
        return "hip"
    major, _ = _kernels().device_facts(_index(device))
    return "sm90" if major == 9 else "sm80"


def _index(device: torch.device) -> int:
    return torch.cuda.current_device() if device.index is None else device.index


def _on(device: torch.device):
    """Make ``device`` current for the launch (a no-op, and cheap, when it already is)."""
    if device.type != "cuda" or _index(device) == torch.cuda.current_device():
        return contextlib.nullcontext()
    return torch.cuda.device(device)


def select_variant(arch: str, shape: dict | None = None) -> str:
    """``variant="auto"``: the fastest correct variant measured on ``arch`` for a
    problem of ``shape`` (keys ``head_dim``, ``seqlen_q``, ``seqlen_k``, ``causal``, and
    ``varlen``: packed sequences, the lengths then the longest).  A call the chosen kernel cannot
    take (see ``kernels.unsupported``) falls back to ``tiled``."""
    shape = shape or {}
    if shape.get("seqlen_q", 1 << 30) <= 16:
        return "tiled"  # decoding: the keys split over programs (flash-decoding), GQA rows packed
    if arch == "sm90" and shape.get("varlen") and shape.get("causal") and shape.get("head_dim") == 64:
        # packed causal D=64: hopper 1.00x, 1.00x and 0.85x tiled at random lengths, 32x2048 and 32x2000
        # (runs 20261129T211149, T211231, T211328); at D=128 and non-causal it wins (0.97-1.29x)
        return "tiled"
    if arch == "sm90" and shape.get("head_dim") in (64, 128):
        # causal D=64 at seqlen 512 went to tiled until session 3 (195 TFLOP/s against hopper's 180,
        # run 20261129T1321*); persistent hopper runs it at 234 (T161833)
        return "hopper"
    return "tiled"


def _kernels():
    # imported on first use: Triton fixes interpretation (TRITON_INTERPRET) when a
    # kernel is defined, so `python -m fmha` can still choose it after `import fmha`
    from . import kernels
    return kernels


def variants(interpreter: bool = False) -> list[str]:
    """Names accepted by ``variant=`` (besides ``"auto"``); with ``interpreter=True``
    only those the CPU interpreter runs (the Triton ones, not the Gluon ones)."""
    k = _kernels()
    return list(k.VARIANTS if interpreter else k.ALL_VARIANTS)


def _check_features(q, layout, window, softcap, alibi_slopes) -> None:
    if (not isinstance(window, (tuple, list)) or len(window) != 2
            or not all(isinstance(w, int) and w >= -1 for w in window)):
        raise ValueError(f"window must be (left, right) with ints >= -1 (-1: unbounded), got {window!r}")
    if not (isinstance(softcap, (int, float)) and math.isfinite(softcap) and softcap >= 0):
        raise ValueError(f"softcap must be a finite number >= 0 (0: off), got {softcap!r}")
    if alibi_slopes is not None:
        heads = q.shape[1] if layout == "bhsd" else q.shape[2]
        if (not isinstance(alibi_slopes, torch.Tensor) or alibi_slopes.shape != (heads,)
                or alibi_slopes.dtype != torch.float32 or alibi_slopes.device != q.device):
            got = (tuple(alibi_slopes.shape), alibi_slopes.dtype, alibi_slopes.device) \
                if isinstance(alibi_slopes, torch.Tensor) else type(alibi_slopes).__name__
            raise ValueError(f"alibi_slopes must be a float32 tensor of shape ({heads},) on {q.device}, got {got}")


def _check(q, k, v, causal_align: str, layout: str, variant: str, scale) -> None:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    if variant != "auto" and variant not in variants():
        raise ValueError(f"variant must be 'auto' or one of {variants()}, got {variant!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must have 4 dimensions ({layout}), got shape {tuple(t.shape)}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; fmha takes float16 or bfloat16 "
                            f"(float32 inputs: cast them, accumulation is float32 anyway)")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    if q.device.type == "cpu" and not interpreting():
        raise RuntimeError("fmha got CPU tensors but Triton's interpreter is off: move the tensors "
                           "to a GPU, or set TRITON_INTERPRET=1 before importing fmha to run the "
                           "same kernels on the CPU (slowly)")
    if q.device.type not in ("cpu", "cuda"):
        raise ValueError(f"fmha runs on CUDA/ROCm GPUs (or the CPU interpreter), got device {q.device}")
    seq_dim, head_dim_ = (2, 1) if layout == "bhsd" else (1, 2)
    b, h, d = q.shape[0], q.shape[head_dim_], q.shape[3]
    for name, t in (("k", k), ("v", v)):
        if t.shape[0] != b:
            raise ValueError(f"{name} has batch {t.shape[0]}, q has {b}")
        if t.shape[3] != d:
            raise ValueError(f"{name} has head_dim {t.shape[3]}, q has {d}")
    if k.shape[head_dim_] != v.shape[head_dim_] or k.shape[seq_dim] != v.shape[seq_dim]:
        raise ValueError(f"k and v must agree in kv_heads and seqlen_k ({layout}), got "
                         f"{tuple(k.shape)} and {tuple(v.shape)}")
    kv_heads = k.shape[head_dim_]
    if kv_heads == 0 and h != 0 or kv_heads and h % kv_heads:
        raise ValueError(f"heads ({h}) must be a multiple of kv_heads ({kv_heads})")
    if d not in HEAD_DIMS:
        raise ValueError(f"head_dim must be one of {HEAD_DIMS}, got {d}")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a finite positive number or None, got {scale!r}")


@forward_only
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
              scale: float | None = None, variant: str = "auto", causal_align: str = "top_left",
              layout: str = "bhsd", return_lse: bool = False, out: torch.Tensor | None = None,
              window: tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes: torch.Tensor | None = None,
              seqused_k: torch.Tensor | None = None, num_splits: int = 0,
              config: configs.KernelConfig | None = None):
    """Exact attention ``softmax(scale * q k^T) v``, computed flash-style (no score matrix).

    Shapes (``layout="bhsd"``): ``q`` ``[batch, heads, seqlen_q, head_dim]``, ``k`` and
    ``v`` ``[batch, kv_heads, seqlen_k, head_dim]`` with ``heads`` a multiple of
    ``kv_heads`` (GQA/MQA).  ``layout="bshd"``: ``[batch, seq, heads, head_dim]``,
    read through strides without copies.  float16 or bfloat16; head_dim in
    32, 64, 96, 128, 256; any seqlen >= 0.  Returns ``o`` in q's layout and
    dtype (a new tensor, never an alias of an input), and with ``return_lse``
    also the natural-log log-sum-exp, float32 ``[batch, heads, seqlen_q]``.

    ``scale`` defaults to ``1/sqrt(head_dim)``; the kernels receive
    ``scale * log2(e)`` and use exp2.  ``causal=True`` masks key j for query i
    unless ``j <= i`` (``causal_align="top_left"``, torch SDPA's ``is_causal``) or
    ``j <= i + seqlen_k - seqlen_q`` (``"bottom_right"``, FlashAttention 2.1+).

    Edges: a query row with no visible key (``seqlen_k == 0``, or causal
    bottom-right with ``seqlen_q > seqlen_k``) gives 0 and LSE ``-inf``, never NaN;
    an empty batch, heads or seqlen_q gives an empty result without a launch.

    ``variant``: ``"auto"`` (the fastest for this device) or one of
    :func:`variants`; ``config`` overrides the variant's tuned
    :class:`~fmha.configs.KernelConfig` (for sweeps).  ``out``: a tensor of q's
    shape, dtype and device to write into (any strides; it must not overlap an input).
    CPU tensors run only under Triton's interpreter (``TRITON_INTERPRET=1``).
    Under ``torch.compile`` the call goes through the custom op ``fmha::attention``
    (:mod:`fmha.library`); ``out``, ``config`` and the modifiers below are not available there.

    Modifiers (every variant takes them):
    ``window=(left, right)``: query i sees keys ``i + d - left <= j <= i + d + right``
    around its diagonal ``d`` (0 top-left, ``seqlen_k - seqlen_q`` bottom-right; -1 leaves
    a side open; ``causal`` closes the right side at 0); key tiles outside the band
    are skipped whole.  ``softcap > 0``: scores become ``softcap * tanh(s / softcap)``.
    ``alibi_slopes`` (float32 ``[heads]``): score ``- slope_h * |i + d - j|``.
    ``seqused_k`` (int32 ``[batch]``): batch b uses only its first ``seqused_k[b]`` keys
    (key padding; values past seqlen_k are clamped); bottom-right alignment then uses
    that length.  For packed variable-length batches see :func:`attention_varlen`.

    ``num_splits``: split the keys over that many programs per query block and merge
    the partials by their LSE (flash-decoding); 0 (default) decides: on a GPU, short
    queries (seqlen_q <= 16) against long keys are split to fill the chip; 1 never splits.
    """
    _check(q, k, v, causal_align, layout, variant, scale)
    _check_features(q, layout, window, softcap, alibi_slopes)
    if seqused_k is not None:
        _check_index(seqused_k, "seqused_k", (q.shape[0],), q.device)
    if not isinstance(num_splits, int) or num_splits < 0:
        raise ValueError(f"num_splits must be an int >= 0 (0: decide), got {num_splits!r}")
    modifiers = (tuple(window) != (-1, -1) or softcap > 0 or alibi_slopes is not None or seqused_k is not None
                 or num_splits > 1)
    if torch.compiler.is_compiling() and out is None and config is None and not modifiers:
        from .library import attention_op
        o, lse = attention_op(q, k, v, bool(causal), None if scale is None else float(scale), variant,
                              causal_align, layout, return_lse)
        return (o, lse) if return_lse else o
    o, lse = _attention(q, k, v, causal=causal, scale=scale, variant=variant, causal_align=causal_align,
                        layout=layout, return_lse=return_lse, out=out, config=config, window=tuple(window),
                        softcap=float(softcap), alibi_slopes=alibi_slopes, seqused_k=seqused_k,
                        num_splits=num_splits)
    return (o, lse) if return_lse else o


def _split_len(num_splits: int, arch: str, prob, cfg, device) -> int:
    """Keys per split (a multiple of cfg.block_n), or 0 for no split."""
    block_n = cfg.block_n
    if num_splits == 0:  # decide: split short queries over long keys until each SM has its share of programs
        if arch == "interpreter" or prob.seqlen_q > 16 or prob.seqlen_k < 4 * block_n:
            return 0
        programs = math.prod(prob.grid(cfg.block_m))
        sms = _kernels().device_facts(_index(device))[1]
        # a memory-bound loop: more programs keep more loads in flight.  2x SMs (run 20261129T151048)
        # against 4x (T151856), seqlen_k 128k: seqlen_q 16 went 209 -> 231 TFLOP/s, seqlen_q 1 stayed
        # at 16 (4.0 TB/s of K/V, 94-97% of the copy ceiling).  Rounded down, so the programs never
        # spill past per_sm * SMs into a last, nearly empty wave
        per_sm = cfg.split_per_sm or 4
        num_splits = min(per_sm * sms // programs, prob.seqlen_k // (4 * block_n))
    if num_splits <= 1:
        return 0
    return -(-(-(-prob.seqlen_k // num_splits)) // block_n) * block_n


def _pack_plan(prob, alibi_slopes):
    """Decoding with GQA (seqlen_q <= 16, several query heads per KV head): one program takes
    the whole group's rows, so each K/V tile is read once per group (not with ALiBi, whose
    slope is per head)."""
    if prob.seqlen_q <= 16 and prob.heads > prob.kv_heads and alibi_slopes is None:
        return dataclasses.replace(prob, pack_gqa=True)
    return prob


def _split_plan(num_splits: int, arch: str, prob, cfg, device, fixed: bool = False):
    """(config, keys per split): a split launch on a GPU runs the decode config (a few query
    rows: small blocks, the keys spread over programs) unless the caller fixed one."""
    split_len = _split_len(num_splits, arch, prob, cfg, device)
    if split_len and not fixed and arch != "interpreter":
        rows = prob.seqlen_q * (prob.heads // prob.kv_heads if prob.pack_gqa else 1)
        cfg = configs.decode_config(rows, prob.seqlen_k, prob.head_dim)
        split_len = _split_len(num_splits, arch, prob, cfg, device)
    return cfg, split_len


def _check_index(t, name: str, shape: tuple, device) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or tuple(t.shape) != shape or t.device != device:
        got = (tuple(t.shape), t.dtype, t.device) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be an int32 tensor of shape {shape} on {device}, got {got}")


def _band(causal: bool, window, align: int):
    """(upper edge on?, upper offset, lower offset or None) of the visible band around ``i + align``."""
    left, right = window
    if causal:
        right = 0 if right < 0 else min(right, 0)
    return right >= 0, (align + right if right >= 0 else 0), (align - left if left >= 0 else None)


@forward_only
def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                     cu_seqlens_k: torch.Tensor, max_seqlen_q: int, max_seqlen_k: int, *, causal: bool = False,
                     scale: float | None = None, variant: str = "auto", causal_align: str = "bottom_right",
                     return_lse: bool = False, window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                     alibi_slopes: torch.Tensor | None = None, config: configs.KernelConfig | None = None):
    """Attention over packed sequences of different lengths (``flash_attn_varlen_func``'s shape).

    ``q`` ``[total_q, heads, head_dim]``, ``k``/``v`` ``[total_k, kv_heads, head_dim]``;
    sequence b is rows ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` of q and
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` of k/v (int32, ``[batch + 1]``, starting at 0,
    non-decreasing, ending at the totals).  ``max_seqlen_q/k`` must be at least the
    longest sequence.  Masks and modifiers act per sequence, aligned as FlashAttention aligns
    them: ``causal_align="bottom_right"`` by default (query i of a sequence with ``n_q`` queries
    and ``n_k`` keys sees key j when ``j <= i + n_k - n_q``: its new queries are its last
    positions); ``"top_left"`` gives torch SDPA's ``j <= i``.  Returns ``o`` ``[total_q, heads, head_dim]`` (and LSE
    ``[heads, total_q]``).  Programs (or ``hopper``'s work items) past a sequence's end exit at
    once: no padded work beyond the last tile of each sequence.  ``auto`` picks the variant as
    :func:`attention` would for the longest sequences (``hopper`` on sm_90 at head_dim 64 and
    128); ``config`` overrides its config, as in :func:`attention`.  The cu_seqlens are checked on
    the host (one device-to-host copy of both).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 3:
            raise ValueError(f"{name} must be a 3-dimensional tensor [total, heads, head_dim], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    _check(q[None], k[None], v[None], causal_align, "bshd", variant, scale)
    _check_features(q[None], "bshd", window, softcap, alibi_slopes)
    if cu_seqlens_q.dim() != 1 or cu_seqlens_q.shape != cu_seqlens_k.shape:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must be 1-D of one length (batch + 1), got "
                         f"{tuple(cu_seqlens_q.shape)} and {tuple(cu_seqlens_k.shape)}")
    batch = cu_seqlens_q.shape[0] - 1
    _check_index(cu_seqlens_q, "cu_seqlens_q", (batch + 1,), q.device)
    _check_index(cu_seqlens_k, "cu_seqlens_k", (batch + 1,), q.device)
    both = torch.stack([cu_seqlens_q, cu_seqlens_k]).cpu().numpy()  # one device-to-host copy
    lengths = []  # (query rows, keys) per sequence, on the host
    for name, host, total, longest in (("cu_seqlens_q", both[0], q.shape[0], max_seqlen_q),
                                       ("cu_seqlens_k", both[1], k.shape[0], max_seqlen_k)):
        lengths.append(host[1:] - host[:-1])
        if batch < 0 or host[0] != 0 or host[-1] != total or (lengths[-1] < 0).any():
            raise ValueError(f"{name} must start at 0, never decrease and end at {total} (the packed length), "
                             f"got {host.tolist()}")
        if batch and int(lengths[-1].max()) > longest:
            raise ValueError(f"max_seqlen for {name} is {longest}, but a sequence has {int(lengths[-1].max())} rows")
    if v.shape[0] != k.shape[0]:
        raise ValueError(f"k and v must have the same packed length, got {k.shape[0]} and {v.shape[0]}")
    heads, kv_heads, head_dim = q.shape[1], k.shape[1], q.shape[2]
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((heads, q.shape[0]), dtype=torch.float32, device=q.device) if return_lse else None
    if batch == 0 or q.shape[0] == 0 or heads == 0:
        return (o, lse) if return_lse else o
    kernels = _kernels()
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    upper, causal_offset, window_offset = _band(causal, tuple(window), 0)
    prob = kernels.Problem(batch, heads, kv_heads, q.shape[0], k.shape[0], head_dim, upper, causal_offset,
                           scale * LOG2E, window_offset=window_offset, align_offset=0, softcap=float(softcap),
                           align_br=causal_align == "bottom_right", varlen=True)
    q4, k4, v4, o4 = q[None], k[None], v[None], o[None]
    name, cfg, prob, _ = _plan(prob, q4, k4, v4, o4, "bshd", variant, config, alibi_slopes, 1,
                               longest=(int(max_seqlen_q), int(max_seqlen_k)))
    with _on(q.device):
        kernels.launch(name, cfg, prob, q4, k4, v4, o4, lse, "bshd", alibi_slopes,
                       (cu_seqlens_q, cu_seqlens_k, None), grid_m=max(int(max_seqlen_q), 1), lengths=lengths)
    return (o, lse) if return_lse else o


def _attention(q, k, v, *, causal, scale, variant, causal_align, layout, return_lse, out, config,
               window=(-1, -1), softcap=0.0, alibi_slopes=None, seqused_k=None, num_splits=0):
    """The checked call: allocate, handle the edges, pick a kernel, launch.  Returns (o, lse or None)."""
    if layout == "bhsd":
        batch, heads, seqlen_q, head_dim = q.shape
        kv_heads, seqlen_k = k.shape[1], k.shape[2]
    else:
        batch, seqlen_q, heads, head_dim = q.shape
        seqlen_k, kv_heads = k.shape[1], k.shape[2]
    o = _output(q, k, v, out)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device) if return_lse else None
    if o.numel() == 0:
        return o, lse
    if seqlen_k == 0:
        o.zero_()
        if return_lse:
            lse.fill_(-math.inf)
        return o, lse

    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    align = 0 if causal_align == "top_left" else seqlen_k - seqlen_q
    upper, causal_offset, window_offset = _band(causal, window, align)
    prob = _kernels().Problem(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, upper, causal_offset,
                              scale * LOG2E, window_offset=window_offset, align_offset=align, softcap=softcap,
                              align_br=causal_align == "bottom_right", seqused=seqused_k is not None)
    name, cfg, prob, split_len = _plan(prob, q, k, v, o, layout, variant, config, alibi_slopes, num_splits)
    _run(name, cfg, prob, q, k, v, o, lse, layout, alibi_slopes, (None, None, seqused_k), split_len)
    return o, lse


def _plan(prob, q, k, v, o, layout, variant, config, alibi_slopes, num_splits, longest=None):
    """(variant, config, problem, keys per split) for a checked call: the variant (``auto``
    picks, falling back to ``tiled`` when the pick cannot take the call), its config, GQA
    packing for decoding and the key split (not for packed sequences, whose ``longest``
    query and key lengths stand for the shape)."""
    kernels = _kernels()
    arch = arch_of(q.device)
    seqlen_q, seqlen_k = longest or (prob.seqlen_q, prob.seqlen_k)
    shape = {"head_dim": prob.head_dim, "seqlen_q": seqlen_q, "seqlen_k": seqlen_k, "causal": bool(prob.causal),
             "varlen": prob.varlen}
    name = select_variant(arch, shape) if variant == "auto" else variant
    modifiers = prob.window_offset is not None or prob.softcap > 0 or alibi_slopes is not None
    cfg = config or configs.default_config(name, arch, prob.head_dim, prob.causal, seqlen_k, modifiers,
                                           per_sequence=prob.varlen or prob.seqused, seqlen_q=seqlen_q)
    reason = kernels.unsupported(name, cfg, prob, q, k, v, o, layout, alibi_slopes is not None)
    if reason and variant == "auto":
        name = "tiled"
        cfg = configs.default_config(name, arch, prob.head_dim, prob.causal)
    elif reason:
        raise ValueError(f"variant {name!r} cannot take this call: {reason}")
    split_len = 0
    if name != "hopper" and not prob.varlen:
        prob = _pack_plan(prob, alibi_slopes)
        cfg, split_len = _split_plan(num_splits, arch, prob, cfg, q.device, fixed=config is not None)
        if cfg.tma and kernels.unsupported(name, cfg, prob, q, k, v, o, layout):  # the decode table's TMA
            cfg = dataclasses.replace(cfg, tma=0)
    return name, cfg, prob, split_len


def describe(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
             variant: str = "auto", window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
             alibi_slopes: torch.Tensor | None = None) -> str:
    """What :func:`attention` runs for this call (bhsd, top-left): variant, config, and
    GQA packing / key split when used.  For benchmark ledgers."""
    batch, heads, seqlen_q, head_dim = q.shape
    upper, causal_offset, window_offset = _band(causal, tuple(window), 0)
    prob = _kernels().Problem(batch, heads, k.shape[1], seqlen_q, k.shape[2], head_dim, upper, causal_offset, 1.0,
                              window_offset=window_offset, softcap=float(softcap))
    name, cfg, prob, split_len = _plan(prob, q, k, v, q, "bhsd", variant, None, alibi_slopes, 0)
    extra = (" packed-gqa" if prob.pack_gqa else "") + (f" split {split_len}" if split_len else "")
    return f"{name} {cfg}{extra}"


def _run(name, cfg, prob, q, k, v, o, lse, layout, alibi, seqs, split_len, block_table=None) -> None:
    """Launch, directly or split over the keys with the partials merged by their LSE (a second
    kernel: merging inside the split launch, by the split that finished last, was slower,
    bench/ledger.csv runs 20261129T164118 and T163732, and again with counters that each launch
    leaves at zero (no zeroing kernel; commit 8cdbe9a, reverted): 1 query row 7.97 against 8.37
    TFLOP/s at 1k keys, within 0.1% from 8k (run 20261130T034023); so was stream-K, one program per
    SM dealing every block's key tiles in equal runs, 132 programs instead of 128 (commit 73c804e, reverted:
    10.83/41.48/130.84/481.23 us against the split's 8.22/37.83/126.14/479.66 at 1k/8k/32k/128k keys,
    run 20261130T040659, where one more SM's worth of runs bought nothing at 128k and the runs crossing
    blocks, each with its own prologue and a partial more to merge, cost the rest); so was launching
    the merge by programmatic dependent launch: by about 0.3 us a call released as the split launch ended (run
    20261129T180206), by 1.4 us at 1k keys and 0.3-0.6% from 8k released as the split programs
    started, the merge's programs then waiting resident beside them (sweep 20261129T205759))."""
    with _on(q.device):
        kernels = _kernels()
        if not split_len:
            kernels.launch(name, cfg, prob, q, k, v, o, lse, layout, alibi, seqs, block_table=block_table)
            return
        from .kernels import merge
        shape = (-(-prob.seqlen_k // split_len), prob.batch, prob.heads, prob.seqlen_q)
        o_parts = torch.empty((*shape, prob.head_dim), dtype=torch.float32, device=q.device)
        lse_parts = torch.empty(shape, dtype=torch.float32, device=q.device)
        kernels.launch(name, cfg, prob, q, k, v, o_parts, lse_parts, layout, alibi, seqs, split_len=split_len,
                       block_table=block_table)
        merge.launch(o_parts, lse_parts, o, lse, kernels.strides_bhsd(o, layout), prob.heads, prob.seqlen_q)


@forward_only
def attention_paged(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
                    cache_seqlens: torch.Tensor, *, causal: bool = False, scale: float | None = None,
                    causal_align: str = "bottom_right", layout: str = "bhsd", return_lse: bool = False,
                    window: tuple[int, int] = (-1, -1), softcap: float = 0.0,
                    alibi_slopes: torch.Tensor | None = None, num_splits: int = 0, variant: str = "auto",
                    config=None):
    """Attention against a paged KV cache (vLLM's and ``flash_attn_with_kvcache``'s layout).

    ``q``: ``[batch, heads, seqlen_q, head_dim]`` (or ``bshd``); ``k_cache``/``v_cache``:
    ``[num_pages, page_size, kv_heads, head_dim]``; ``block_table``: int32
    ``[batch, pages_per_seq]``, page ``block_table[b, n // page_size]`` holding keys
    ``n``; ``cache_seqlens``: int32 ``[batch]``, the keys in use.  ``page_size`` must be
    a multiple of 16.  Causal defaults to bottom-right: the new queries are the last
    positions of the cache (decode, or prefill with a cached prefix).  ``variant``: ``auto``,
    ``tiled`` or ``hopper``; ``auto`` takes the Gluon kernel on sm_90 for prefill (more than 16
    queries) when ``page_size`` is a multiple of its 128-key tile, else ``tiled``, where short
    queries split the keys as :func:`attention` does.
    """
    if variant not in ("auto", "tiled", "hopper"):
        raise ValueError(f"attention_paged runs variant 'auto', 'tiled' or 'hopper', got {variant!r}")
    _check(q, q, q, causal_align, layout, variant, scale)
    _check_features(q, layout, window, softcap, alibi_slopes)
    batch, heads = q.shape[0], (q.shape[1] if layout == "bhsd" else q.shape[2])
    seqlen_q, head_dim = (q.shape[2] if layout == "bhsd" else q.shape[1]), q.shape[3]
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if (not isinstance(t, torch.Tensor) or t.dim() != 4 or t.shape[3] != head_dim or t.dtype != q.dtype
                or t.device != q.device):
            raise ValueError(f"{name} must be [num_pages, page_size, kv_heads, {head_dim}] {q.dtype} on {q.device}, "
                             f"got {tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and "
                         f"{tuple(v_cache.shape)}")
    page, kv_heads = k_cache.shape[1], k_cache.shape[2]
    if page % 16 or page == 0:
        raise ValueError(f"k_cache must be a page pool [num_pages, page_size, kv_heads, head_dim] with page_size a "
                         f"multiple of 16, got shape {tuple(k_cache.shape)} (page_size {page}); a contiguous "
                         f"[batch, kv_heads, seqlen, head_dim] cache goes to fmha.attention (with seqused_k)")
    if kv_heads == 0 or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    if block_table.dim() != 2 or block_table.shape[0] != batch:
        raise ValueError(f"block_table must be [batch={batch}, pages_per_seq], got {tuple(block_table.shape)}")
    _check_index(block_table, "block_table", tuple(block_table.shape), q.device)
    _check_index(cache_seqlens, "cache_seqlens", (batch,), q.device)
    if batch:
        _kernels().guards.check_pages(block_table, cache_seqlens, k_cache.shape[0], page)
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty((batch, heads, seqlen_q), dtype=torch.float32, device=q.device) if return_lse else None
    if o.numel() == 0 or block_table.shape[1] == 0:
        o.zero_()
        if lse is not None:
            lse.fill_(-math.inf)
        return (o, lse) if return_lse else o
    kernels = _kernels()
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    seqlen_k = block_table.shape[1] * page
    align = 0 if causal_align == "top_left" else seqlen_k - seqlen_q
    upper, causal_offset, window_offset = _band(causal, tuple(window), align)
    prob = kernels.Problem(batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, upper, causal_offset,
                           scale * LOG2E, window_offset=window_offset, align_offset=align, softcap=float(softcap),
                           align_br=causal_align == "bottom_right", seqused=True, page=page)
    seqs = (None, None, cache_seqlens)
    name, cfg, prob, split_len = _plan(prob, q, k_cache, v_cache, o, layout, variant, config, alibi_slopes,
                                       num_splits)
    if name == "hopper":  # the page pools as they are: the kernel reads them through one descriptor each
        _run(name, cfg, prob, q, k_cache, v_cache, o, lse, layout, alibi_slopes, seqs, 0, block_table)
        return (o, lse) if return_lse else o
    block_n = cfg.block_n
    while page % block_n:  # a key tile must not straddle two pages
        block_n //= 2
    cfg = dataclasses.replace(cfg, block_n=block_n)
    if split_len:
        split_len = -(-split_len // page) * page
    kv = (k_cache, v_cache) if layout == "bshd" else (k_cache.permute(0, 2, 1, 3), v_cache.permute(0, 2, 1, 3))
    _run(name, cfg, prob, q, *kv, o, lse, layout, alibi_slopes, seqs, split_len, block_table)
    return (o, lse) if return_lse else o


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.numel() == 0 or b.numel() == 0:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False

    def span(t):
        lo = t.data_ptr()
        hi = lo + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) * t.element_size()
        return lo, hi + t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def _output(q, k, v, out):
    if out is None:
        return torch.empty_like(q, memory_format=torch.contiguous_format)
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"out must match q's shape, dtype and device {tuple(q.shape)}, {q.dtype}, "
                         f"{q.device}; got {tuple(out.shape)}, {out.dtype}, {out.device}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if _overlaps(out, t):
            raise ValueError(f"out overlaps {name}: the kernel reads {name} while writing out")
    return out
