"""Differential testing: random problems with inputs chosen to hurt, every path against float64.

``python -m fmha fuzz --minutes 5`` draws problems over the entry points (``attention``,
``attention_varlen``, ``attention_paged``), variants and their table configs, dtypes, head dims, V
narrower than q/k (MLA's 192/128), lengths on and off every tile, layouts (bhsd, bshd,
transformers' transposed views, slices of one fused qkv tensor), GQA, both causal alignments, windows,
softcap, ALiBi in either of FlashAttention's forms, attention sinks (their gradient too, with the backward), key
padding, the key split and now and then a scale of 0 or below (:func:`scale_of`), and fills them with score
patterns that stress the online softmax and the pivots that stand in for the row max: scores rising along the
keys, one huge key late in the row, rows whose first visible key comes late, all-equal scores, inf or NaN in one
key, magnitudes near the dtype's limits.
Each answer (output poisoned with NaN first, and its LSE) is held against the float64 reference by
:mod:`fmha.verify`'s rule.  Some ``attention`` problems with finite inputs also take the backward, fast or
``deterministic`` (:data:`GRADS`), some of them under a random ``attn_mask`` (boolean, or a bias whose own
gradient is checked too) or with attention dropout (the reference given the pairs the call drew): dQ, dK and dV
against the float64 reference's, and a deterministic backward run twice gives the same bits.  A failure prints
as one JSON line: ``Problem(**json.loads(line))`` rebuilds it, which is how a failure becomes a named regression
test.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import random
import sys
import time
import warnings

import torch

from . import configs, plan, verify
from .api import attention, attention_paged, attention_varlen
from .checks import HEAD_DIMS, TUNED_HEAD_DIMS
from .kernels import dropout
from .kernels.hopper.resources import padded

PATTERNS = ("normal", "rising", "late_spike", "late_first", "equal", "inf_key", "nan_key", "extreme")
LAYOUTS = ("bhsd", "bshd", "hf-view", "fused-qkv")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclasses.dataclass(frozen=True)
class Problem:
    entry: str              # attention | varlen | paged
    variant: str
    config: dict | None     # KernelConfig fields, or None: the variant's table
    dtype: str
    layout: str             # one of LAYOUTS (varlen and paged: packed / page pools)
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    align: str
    window: tuple
    softcap: float
    alibi: bool
    seqused: bool           # attention: per-batch key lengths; varlen and paged always have them
    num_splits: int
    page: int               # paged: keys per page
    pattern: str
    seed: int
    head_dim_v: int = 0     # V's and O's head dim where it is smaller than q/k's (MLA's 192/128), else 0
    grad: str = ""          # attention: also the backward, "fast" or "deterministic" (:func:`_takes_grad`)
    attn_mask: bool = False  # attention: a random mask [batch, 1 or heads, seqlen_q, seqlen_k] too (:func:`_mask`)
    dropout: float = 0.0    # attention with the backward: attention dropout's probability (:func:`_run_grad`)
    sinks: bool = False     # learnable attention sinks: one float32 logit a head joins every row's softmax

    def __str__(self):
        return json.dumps(dataclasses.asdict(self))


def _length(rng: random.Random, top: int, tile: int) -> int:
    """A length in [1, top], half the time within 2 of a multiple of ``tile``."""
    if rng.random() < 0.5:
        return max(1, min(top, rng.randrange(tile, top + tile, tile) + rng.randint(-2, 2)))
    return rng.randint(1, top)


def _table_configs(variant: str, head_dim: int, causal: bool, head_dim_v: int = 0) -> list[dict]:
    if variant == "hopper":
        rows = [cfg.as_dict() for d, c, _, cfg in configs.HOPPER if d == padded(head_dim, 64) and c == causal]
        split = configs.hopper_config(head_dim, causal, 0, head_dim_v=head_dim_v)
        if split.split_qk:  # q/k 192 with a narrower V: its own row
            rows.append(split.as_dict())
        if head_dim in configs.NARROW_LONG_DIMS and not causal:  # long dense calls at 80 and 96: their own row
            rows.append(configs.HOPPER_NARROW_LONG.as_dict())
        return rows
    if variant == "tiled":  # every chip's rows (a caller may pass any): one stage, 8 and 16 warps among them
        rows = dict.fromkeys(cfg for arch, max_d, cfg in configs.TILED if arch != "interpreter" and head_dim <= max_d)
        return [cfg.as_dict() for cfg in rows]
    return []


GRADS = ("fast", "deterministic")


def _takes_grad(p: Problem) -> bool:
    """Whether ``p`` may take the backward too: an ``attention`` call autograd can record (no key padding, no
    forced key split, no fused projection's slices) with finite inputs that leave its gradients finite (no
    inf or NaN key, no magnitudes near the dtype's limits), on a variant the backward runs behind."""
    return (p.entry == "attention" and not p.seqused and not p.num_splits and p.layout != "fused-qkv"
            and p.pattern not in ("inf_key", "nan_key", "extreme") and p.variant in ("auto", "tiled", "hopper"))


def draw(rng: random.Random, on_gpu: bool, hopper: bool) -> Problem:
    """One random problem; on the CPU (the interpreter) small enough to run in a second.  Whether a problem
    that can takes the backward too, and whether one without a config takes a head dim off the usual ones (any
    other multiple of 8), are drawn from its own seed, so the rest of the draw stays as it was."""
    entry = rng.choices(["attention", "varlen", "paged"], [7, 2, 2])[0]
    head_dim = rng.choice(TUNED_HEAD_DIMS)
    narrower = [d for d in TUNED_HEAD_DIMS if d < head_dim]
    head_dim_v = rng.choice(narrower) if narrower and rng.random() < 0.15 else 0
    pattern = rng.choice(PATTERNS)
    kv_heads = rng.randint(1, 3)
    heads = kv_heads * rng.choice([1, 1, 2, 4])
    top = 2048 if on_gpu else 48
    decode = rng.random() < 0.2
    seqlen_q = rng.randint(1, 16) if decode else _length(rng, top, 64 if on_gpu else 16)
    seqlen_k = _length(rng, top, 128 if on_gpu else 16)
    causal, align = rng.random() < 0.5, rng.choice(["top_left", "bottom_right"])
    window = (rng.randint(-1, seqlen_k), rng.randint(-1, seqlen_k)) if rng.random() < 0.3 else (-1, -1)
    if pattern == "late_first":  # the first visible key of most rows lies many tiles in
        seqlen_k = max(seqlen_k, seqlen_q + rng.randint(1, top))
        causal, align, window = True, "bottom_right", (rng.randint(0, 40), -1)
    variants = ["auto", "auto", "tiled", "singlewave", "pipelined"]
    if on_gpu and hopper:
        variants += ["hopper", "hopper"]
    variant = rng.choice(variants if entry == "attention" else [v for v in variants if v in ("auto", "tiled",
                                                                                              "hopper")])
    table = _table_configs(variant, head_dim, causal, head_dim_v)
    config = rng.choice(table) if table and rng.random() < 0.6 else None
    page = rng.choice([128, 256] if variant == "hopper" else [16, 32, 64, 128])
    p = Problem(entry=entry, variant=variant, config=config, dtype=rng.choice(list(DTYPES)),
                layout=rng.choice(LAYOUTS), batch=rng.randint(1, 3), heads=heads, kv_heads=kv_heads,
                seqlen_q=seqlen_q, seqlen_k=seqlen_k, head_dim=head_dim, causal=causal, align=align,
                window=window, softcap=rng.uniform(1.0, 50.0) if rng.random() < 0.2 else 0.0,
                alibi=rng.random() < 0.15, seqused=rng.random() < 0.25,
                num_splits=rng.randint(1, 6) if rng.random() < 0.2 else 0, page=page, pattern=pattern,
                seed=rng.randrange(1 << 30), head_dim_v=head_dim_v)
    off = random.Random(p.seed + 1)  # a head dim off the usual ones, drawn apart so the rest stays as it was
    if p.config is None and off.random() < 0.2:
        d = off.choice([x for x in HEAD_DIMS if x not in TUNED_HEAD_DIMS])
        p = dataclasses.replace(p, head_dim=d, head_dim_v=off.choice([x for x in HEAD_DIMS if x < d])
                                if p.head_dim_v and d > min(HEAD_DIMS) else 0)
    own = random.Random(p.seed)
    if _takes_grad(p) and own.random() < 0.5:
        p = dataclasses.replace(p, grad=own.choice(GRADS), attn_mask=own.random() < 0.2)
        if p.variant in ("auto", "tiled") and own.random() < 0.25:  # (dropout runs on tiled)
            p = dataclasses.replace(p, dropout=own.choice([0.1, 0.5]))
    elif p.entry == "attention" and own.random() < 0.2:
        p = dataclasses.replace(p, attn_mask=True)
    if not p.dropout and random.Random(p.seed + 2).random() < 0.15:  # (SDPA's dropout knows no sinks)
        p = dataclasses.replace(p, sinks=True)
    if (p.attn_mask or p.dropout) and p.config:  # the table's row as the plan takes it beside a mask (boolean or a
        # bias) or dropout, whose tiles take shared memory
        widths = padded(p.head_dim, 16), plan.v_tile(p.head_dim, p.head_dim_v or p.head_dim)
        fitted = configs.fit_shared(configs.KernelConfig(**p.config), *widths, "bias" if p.attn_mask else False,
                                    dropout=bool(p.dropout))
        p = dataclasses.replace(p, config=fitted.as_dict())
    return p


def inputs(p: Problem):
    """q ``[B, H, Sq, D]``, k ``[B, KVH, Sk, D]`` and v ``[B, KVH, Sk, head_dim_v or D]`` (float32, bhsd, on
    the CPU) filled by ``p.pattern``; scores are ``q.k / sqrt(D)``."""
    g = torch.Generator().manual_seed(p.seed)
    b, h, kvh, sq, sk, d = p.batch, p.heads, p.kv_heads, p.seqlen_q, p.seqlen_k, p.head_dim
    q, k, v = (torch.randn(b, n, s, w, generator=g) for n, s, w in ((h, sq, d), (kvh, sk, d),
                                                                     (kvh, sk, p.head_dim_v or d)))
    u = torch.nn.functional.normalize(torch.randn(d, generator=g), dim=0)
    root = math.sqrt(d)
    if p.pattern == "rising":  # scores climb by about 60 over the row: a new max at every tile
        q = q + 3 * u
        k = 0.5 * k + (torch.arange(sk) / max(sk, 1))[:, None] * (20 * root) * u
    elif p.pattern == "late_spike":  # one key in the last quarter scores about 1000 above the rest
        q = q + 3 * u
        k[:, :, rng_index(g, sk, late=True)] += (1000 * root / 3) * u
    elif p.pattern == "equal":
        k = k[:, :, :1].expand_as(k).clone()
    elif p.pattern in ("inf_key", "nan_key"):
        k[rng_index(g, b), rng_index(g, kvh), rng_index(g, sk), rng_index(g, d)] = \
            math.inf if p.pattern == "inf_key" else math.nan
    elif p.pattern == "extreme":  # scores of 1e4 and more; values near the dtype's largest
        big = 60.0 if p.dtype == "float16" else 1e4
        q, k = q * big / 4, k * big / 4
        v = v * (torch.finfo(DTYPES[p.dtype]).max / (8 * max(sk, 1)))
    return q, k, v


def rng_index(g: torch.Generator, n: int, late: bool = False) -> int:
    lo = (3 * n) // 4 if late else 0
    return int(torch.randint(lo, max(n, lo + 1), (1,), generator=g))


def _place(t: torch.Tensor, layout: str, dtype, device) -> tuple[torch.Tensor, str]:
    """A bhsd tensor in ``layout``: the tensor passed and the ``layout=`` it is passed with."""
    t = t.to(dtype)
    if layout == "bhsd":
        return t.contiguous().to(device), "bhsd"
    if layout == "hf-view":  # bshd storage, passed as a bhsd view (transformers' q/k/v)
        return t.transpose(1, 2).contiguous().to(device).transpose(1, 2), "bhsd"
    return t.transpose(1, 2).contiguous().to(device), "bshd"


def _fused(q, k, v, dtype, device):
    """q, k, v as slices of one ``[B, S, H + 2 KVH, D]`` projection, passed as bshd."""
    h = q.shape[1]
    kvh = k.shape[1]
    buf = torch.cat([t.transpose(1, 2) for t in (q, k, v)], dim=2).to(dtype).to(device)
    return buf[:, :, :h], buf[:, :, h:h + kvh], buf[:, :, h + kvh:]


def run(p: Problem, device: str) -> None:
    """Run ``p`` and check it: raises AssertionError on a wrong answer, ValueError where the
    variant or config refuses the call."""
    dtype = DTYPES[p.dtype]
    q, k, v = inputs(p)
    g = torch.Generator().manual_seed(p.seed + 1)
    lengths = torch.randint(0, p.seqlen_k + 1, (p.batch,), generator=g, dtype=torch.int32)
    if p.entry == "attention" and not p.seqused:
        lengths.fill_(p.seqlen_k)
    slopes = (p.batch, p.heads) if p.seed >> 3 & 1 else (p.heads,)  # FlashAttention's two forms, by the seed
    mods = dict(window=tuple(p.window), softcap=p.softcap,
                alibi_slopes=torch.rand(slopes, generator=g).to(device) if p.alibi else None, scale=scale_of(p))
    if p.sinks:  # logits about the scores' own size, some rows' weight mostly the sink's
        mods["sinks"] = (2 * torch.randn(p.heads, generator=g)).to(device)
    cfg = configs.KernelConfig(**p.config) if p.config else None
    if p.grad:
        return _run_grad(p, q, k, v, g, dtype, device, mods, cfg)
    if p.entry == "varlen":
        return _run_varlen(p, q, k, v, lengths, g, dtype, device, mods, cfg)
    if p.entry == "paged":
        return _run_paged(p, q, k, v, lengths, g, dtype, device, mods, cfg)
    if p.layout == "fused-qkv" and p.seqlen_q == p.seqlen_k and not p.head_dim_v:
        qd, kd, vd = _fused(q, k, v, dtype, device)
        layout = "bshd"
    else:
        (qd, layout), (kd, _), (vd, _) = (_place(t, "bshd" if p.layout == "fused-qkv" else p.layout, dtype, device)
                                          for t in (q, k, v))
    out = torch.full_like(qd, math.nan)
    if p.head_dim_v:  # O as wide as V, in q's layout
        out = _place(torch.full((p.batch, p.heads, p.seqlen_q, p.head_dim_v), math.nan),
                     "bshd" if p.layout == "fused-qkv" else p.layout, dtype, device)[0]
    mask = _mask(p, g)
    _, lse = attention(qd, kd, vd, causal=p.causal, causal_align=p.align, layout=layout, variant=p.variant,
                       config=cfg, out=out, return_lse=True, num_splits=p.num_splits,
                       seqused_k=lengths.to(device) if p.seqused else None,
                       attn_mask=mask.to(device) if mask is not None else None, **mods)
    o = verify.to_bhsd(out, layout)
    qb, kb, vb = (t.to(dtype) for t in (q, k, v))
    for b, n in enumerate(lengths.tolist()):
        own = slice(b, b + 1)
        hidden = {} if mask is None else {"attn_mask": mask[own, :, :, :n].expand(1, p.heads, p.seqlen_q, n)}
        verify.check(o[own], qb[own], kb[own, :, :n], vb[own, :, :n], p.causal, p.align, lse=lse[own],
                     **verify.of_rows(mods, own), **hidden)


def scale_of(p: Problem) -> float | None:
    """``p``'s scale, by the seed: one problem in sixteen 0 (uniform weights) or -0.125 (the lowest score weighs most),
    as SDPA takes any float; else the default (None)."""
    if p.seed >> 5 & 15:
        return None
    return -0.125 if p.seed >> 9 & 1 else 0.0


def _mask(p, g):
    """``p``'s attn_mask, if it takes one: one for every head or one a head, about a third of the keys hidden;
    boolean, or (by the seed) a float32 bias, normal scores of scale 2 and ``-inf`` where it hides a key."""
    if not p.attn_mask:
        return None
    heads = p.heads if torch.rand(1, generator=g).item() < 0.5 else 1
    keep = torch.rand(p.batch, heads, p.seqlen_q, p.seqlen_k, generator=g) < 0.65
    if not p.seed >> 4 & 1:
        return keep
    return (torch.randn(keep.shape, generator=g) * 2).masked_fill(~keep, float("-inf"))


def _run_grad(p, q, k, v, g, dtype, device, mods, cfg):
    """``p``'s call recorded by autograd, its output checked, and its backward for a random dO: dQ, dK, dV
    against the float64 reference from that output (:func:`fmha.verify.check_grads`); ``deterministic``, a
    second backward gives the same bits.  With dropout the references take the pairs the call drew (its seed the
    first draw after ``torch.manual_seed(p.seed)``, :func:`fmha.kernels.dropout.factors`)."""
    (qd, layout), (kd, _), (vd, _) = (_place(t, p.layout, dtype, device) for t in (q, k, v))
    qd, kd, vd = (t.detach().requires_grad_(True) for t in (qd, kd, vd))
    deterministic = p.grad == "deterministic"
    mask = _mask(p, g)
    leaves = (qd, kd, vd)
    if p.sinks:
        mods = {**mods, "sinks": mods["sinks"].detach().clone().requires_grad_(True)}
        leaves += (mods["sinks"],)
    if mask is not None:
        mask = mask.to(device)
        if mask.dtype != torch.bool:  # a bias: its gradient too
            mask.requires_grad_(True)
            leaves += (mask,)
        mods = {**mods, "attn_mask": mask}

    def grads(do=None):
        torch.manual_seed(p.seed)  # (dropout's pairs: the same in a deterministic backward's second run)
        o, lse = attention(qd, kd, vd, causal=p.causal, causal_align=p.align, layout=layout, variant=p.variant,
                           config=cfg, return_lse=True, deterministic=deterministic, dropout_p=p.dropout, **mods)
        do = torch.randn(o.shape, generator=g).to(dtype).to(device) if do is None else do
        return torch.autograd.grad(o, leaves, do, allow_unused=True, materialize_grads=True), do, o.detach(), lse
    got, do, o, lse = grads()
    # the references take the mask as the kernels read it, [batch, heads, seqlen_q, seqlen_k], and the sinks' values
    ref = mods if mask is None else {**mods, "attn_mask": mask.detach().cpu().expand(p.batch, p.heads, p.seqlen_q,
                                                                                    p.seqlen_k)}
    if p.sinks:
        ref = {**ref, "sinks": mods["sinks"].detach()}
    if p.dropout:
        torch.manual_seed(p.seed)
        drawn = dropout.factors(dropout.draw_seed(qd.device), p.dropout, p.batch, p.heads, p.seqlen_q, p.seqlen_k)
        ref = {**ref, "dropout": drawn.cpu()}
    verify.check(verify.to_bhsd(o, layout), *(t.to(dtype) for t in (q, k, v)), p.causal, p.align, lse=lse, **ref)
    verify.check_grads(got[:3], qd, kd, vd, do, p.causal, p.align, layout, o=o, lse=lse, **ref)
    if p.sinks:
        verify.check_sinks_grad(got[3], qd, kd, vd, do, p.causal, p.align, layout, o=o, **ref)
    if len(got) > 3 + p.sinks:
        verify.check_mask_grad(got[3 + p.sinks], qd, kd, vd, do, p.causal, p.align, layout, o=o,
                               **{**mods, "attn_mask": mask.detach(), **({"dropout": ref["dropout"]} if p.dropout
                                                                         else {})})
    if deterministic:
        again, _, _, _ = grads(do)
        assert all(torch.equal(a, b) for a, b in zip(got, again)), "deterministic: two backward runs differ"


def _run_varlen(p, q, k, v, lengths, g, dtype, device, mods, cfg):
    lens_q = torch.randint(0, p.seqlen_q + 1, (p.batch,), generator=g).tolist()
    lens_k = lengths.tolist()
    qs = [q[b, :, :n].transpose(0, 1) for b, n in enumerate(lens_q)]
    ks = [k[b, :, :n].transpose(0, 1) for b, n in enumerate(lens_k)]
    vs = [v[b, :, :n].transpose(0, 1) for b, n in enumerate(lens_k)]
    pq, pk, pv = (torch.cat(t).to(dtype).to(device) for t in (qs, ks, vs))
    cu = [torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32, device=device)
          for n in (lens_q, lens_k)]
    o, lse = attention_varlen(pq, pk, pv, *cu, max(max(lens_q), 1), max(max(lens_k), 1), causal=p.causal,
                              causal_align=p.align, variant=p.variant, config=cfg, return_lse=True, **mods)
    for b in range(p.batch):
        rows = slice(int(cu[0][b]), int(cu[0][b + 1]))
        if rows.start == rows.stop:
            continue
        seq = [t.transpose(0, 1)[None] for t in (o[rows], qs[b].to(dtype), ks[b].to(dtype), vs[b].to(dtype))]
        verify.check(*seq, p.causal, p.align, lse=lse[None, :, rows], **verify.of_rows(mods, slice(b, b + 1)))


def _run_paged(p, q, k, v, lengths, g, dtype, device, mods, cfg):
    pages_per_seq = -(-p.seqlen_k // p.page) + 1  # one spare page each
    num_pages = p.batch * pages_per_seq
    perm = torch.randperm(num_pages, generator=g)
    pools = []
    for t in (k, v):
        d = t.shape[-1]
        padded = torch.nn.functional.pad(t, (0, 0, 0, pages_per_seq * p.page - p.seqlen_k), value=math.nan)
        pages = padded.view(p.batch, p.kv_heads, pages_per_seq, p.page, d).permute(0, 2, 3, 1, 4)
        pool = torch.empty(num_pages, p.page, p.kv_heads, d)
        pool[perm] = pages.reshape(num_pages, p.page, p.kv_heads, d)
        pools.append(pool.to(dtype).to(device))
    table = perm.view(p.batch, pages_per_seq).to(torch.int32).to(device)
    qd, layout = _place(q, "bshd" if p.layout == "bshd" else "bhsd", dtype, device)
    o, lse = attention_paged(qd, *pools, table, lengths.to(device), causal=p.causal, causal_align=p.align,
                             layout=layout, variant=p.variant, config=cfg, return_lse=True,
                             num_splits=p.num_splits, **mods)
    o = verify.to_bhsd(o, layout)
    qb, kb, vb = (t.to(dtype) for t in (q, k, v))
    for b, n in enumerate(lengths.tolist()):
        own = slice(b, b + 1)
        verify.check(o[own], qb[own], kb[own, :, :n], vb[own, :, :n], p.causal, p.align, lse=lse[own],
                     **verify.of_rows(mods, own))


def fuzz(seconds: float | None, problems: int | None, seed: int, device: str, stream=sys.stdout) -> dict:
    """Draw and check problems until ``seconds`` pass or ``problems`` have run; failures (a wrong answer, or a
    call that raised anything but a refusal's ValueError) print as JSON lines on ``stream``, progress on
    stderr.  Returns the counts."""
    on_gpu = device == "cuda"
    hopper = on_gpu and torch.cuda.get_device_capability()[0] == 9
    rng = random.Random(seed)
    counts = collections.Counter()
    refused = collections.Counter()
    start = time.monotonic()
    while (problems is None or counts["run"] < problems) and (seconds is None or time.monotonic() - start < seconds):
        p = draw(rng, on_gpu, hopper)
        counts["run"] += 1
        try:
            with warnings.catch_warnings():  # inf and NaN inputs make NumPy (reference, interpreter) warn
                warnings.simplefilter("ignore", RuntimeWarning)
                run(p, device)
            counts["passed"] += 1
            counts["passed " + p.pattern] += 1
            if p.grad:
                counts["with the backward, " + p.grad] += 1
            if p.attn_mask:
                counts["with an attn_mask" + (", a bias" if p.seed >> 4 & 1 else "")] += 1
            if p.dropout:
                counts["with dropout"] += 1
            if p.sinks:
                counts["with sinks"] += 1
            if scale_of(p) is not None:
                counts["with a scale of 0 or below"] += 1
        except ValueError as e:  # the variant or config does not take this call: said, not wrong
            counts["refused"] += 1
            refused[str(e).split(":")[0][:80]] += 1
        except Exception as e:  # a wrong answer (AssertionError) or a call that crashed: the problem, and go on
            counts["failed"] += 1
            error = " ".join(str(e).split())[:300]
            if not isinstance(e, AssertionError):
                error = f"{type(e).__name__}: {error}"
            print(json.dumps({"problem": dataclasses.asdict(p), "error": error}), file=stream, flush=True)
        if counts["run"] % 25 == 0:
            print(f"fuzz: {counts['run']} problems, {counts['failed']} failed, {time.monotonic() - start:.0f} s",
                  file=sys.stderr, flush=True)
    counts["seconds"] = round(time.monotonic() - start)
    counts.update({"refused: " + why: n for why, n in refused.most_common(6)})
    return dict(counts)
