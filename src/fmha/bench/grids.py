"""Benchmark grids: (batch, heads, kv_heads, seqlen_q, seqlen_k, head_dim, causal) cells, and the
score modifiers a cell may carry (sliding window, softcap, ALiBi)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Cell:
    batch: int
    heads: int
    kv_heads: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    causal: bool
    window: int = -1   # keys this far back from the diagonal and no further (-1: no window)
    softcap: int = 0   # softcap * tanh(s / softcap) on the scores (0: off)
    alibi: int = 0     # 1: ALiBi slopes 2^(-8 (h + 1) / heads)
    layout: str = "contiguous"  # how q, k, v lie in memory (:mod:`.layouts`)
    head_dim_v: int = 0  # v's head dim when it differs from q/k's (MLA), else 0
    dropout: float = 0.0  # attention dropout's probability (training), else 0

    @property
    def features(self) -> str:
        """The modifiers and a layout other than contiguous, as the ledger's ``features`` column writes
        them ("" for none)."""
        parts = [f"window={self.window}"] if self.window >= 0 else []
        parts += [f"softcap={self.softcap}"] if self.softcap else []
        parts += ["alibi"] if self.alibi else []
        parts += [f"head_dim_v={self.head_dim_v}"] if self.head_dim_v else []
        parts += [f"dropout={self.dropout:g}"] if self.dropout else []
        return " ".join(parts + ([f"layout={self.layout}"] if self.layout != "contiguous" else []))

    @property
    def modified(self) -> bool:
        """True when the scores carry a window, softcap or ALiBi."""
        return self.window >= 0 or bool(self.softcap) or bool(self.alibi)

    def __str__(self):
        return (f"B{self.batch} H{self.heads}/{self.kv_heads} Sq{self.seqlen_q} Sk{self.seqlen_k} "
                f"D{self.head_dim}{' causal' if self.causal else ''}{' ' + self.features if self.features else ''}")


def default_grid() -> list[Cell]:
    """BENCH.md's grid: B*S = 16384, H*D = 2048, S 512..16k, D 64/128, causal off/on."""
    return [Cell(16384 // s, 2048 // d, 2048 // d, s, s, d, c)
            for d in (64, 128) for c in (False, True) for s in (512, 1024, 2048, 4096, 8192, 16384)]


def decode_grid() -> list[Cell]:
    """seqlen_q 1..16 against long KV (1k..128k), 32 query heads on 8 KV heads, D=128."""
    return [Cell(4, 32, 8, sq, sk, 128, False) for sq in (1, 4, 16) for sk in (1024, 8192, 32768, 131072)]


def extra_grid() -> list[Cell]:
    """Beyond the default grid: GQA (32 query heads on 8 KV heads), seqlen_q != seqlen_k,
    and one sequence of 128k (memory: no score matrix)."""
    cells = [Cell(4, 32, 8, 4096, 4096, 128, c) for c in (False, True)]
    cells += [Cell(2, 16, 16, 2048, 8192, 128, c) for c in (False, True)]
    cells += [Cell(1, 16, 16, 131072, 131072, 128, c) for c in (False, True)]
    return cells


def features_grid() -> list[Cell]:
    """Causal prefill with each modifier (Mistral-style windows, Gemma-style softcap, ALiBi), D=128, then two real
    models' sliding layers: Mistral-7B's (GQA 32/8, a 4096-key window, 16k tokens) and Gemma-2-9B's (16/8 heads of
    256, a 4096-key window and softcap 50, 8k tokens).  The SDPA backends take the window and ALiBi as an explicit
    mask, and no softcap."""
    return [Cell(1, 16, 16, 4096, 4096, 128, True, window=512), Cell(1, 16, 16, 4096, 4096, 128, True, window=2048),
            Cell(1, 32, 8, 4096, 4096, 128, True, window=1024), Cell(1, 16, 16, 4096, 4096, 128, True, softcap=30),
            Cell(1, 16, 16, 4096, 4096, 128, True, alibi=1),
            Cell(1, 32, 8, 16384, 16384, 128, True, window=4096),
            Cell(1, 16, 8, 8192, 8192, 256, True, window=4096, softcap=50)]


def windows_grid() -> list[Cell]:
    """Sliding windows of real models' widths, causal, 8k tokens: gpt-oss-20b's heads (64 on 8 KV heads of 64)
    with its 128-key window and wider ones, and a Mistral-shaped layer (32/8 heads of 128) with 256- to 4096-key
    windows: where a window is narrow, a key block's walk is a few query tiles."""
    return ([Cell(1, 64, 8, 8192, 8192, 64, True, window=w) for w in (128, 512, 2048)]
            + [Cell(1, 32, 8, 8192, 8192, 128, True, window=w) for w in (256, 1024, 4096)])


def dropout_grid() -> list[Cell]:
    """Attention dropout at 0.1 (a training step's, as BERT-style configs set it) on the default grid's shapes at
    1k and 4k tokens: what SDPA's flash and efficient backends take with ``dropout_p``."""
    return [Cell(16384 // s, 2048 // d, 2048 // d, s, s, d, c, dropout=0.1)
            for d in (64, 128) for c in (False, True) for s in (1024, 4096)]


def ragged_grid() -> list[Cell]:
    """Sequence lengths off the 128-key tile (1000, 3000, 9000), B*S about 16k, H*D = 2048:
    the last key tile of every sequence is part past its end."""
    return [Cell(16000 // s, 2048 // d, 2048 // d, s, s, d, c)
            for d in (64, 128) for c in (False, True) for s in (1000, 3000, 9000)]


def models_grid() -> list[Cell]:
    """Causal prefill at real models' head counts (Llama-3-8B's 32/8, Qwen2-7B's 28/4; D=128), batch 1-8
    at 16k-1k tokens, q/k/v as real programs pass them: contiguous, transformers' transposed views,
    slices of a fused qkv projection."""
    return [Cell(b, h, kvh, s, s, 128, True, layout=lay) for h, kvh in ((32, 8), (28, 4))
            for b, s in ((1, 16384), (2, 8192), (4, 4096), (8, 1024)) for lay in ("contiguous", "hf-view", "fused-qkv")]


def head_dims_grid() -> list[Cell]:
    """The head dims beside the default grid's 64 and 128 (32; 80 as in Phi-2 and StableLM; 96 as in Phi-3; 256
    as in Gemma 2 and 3): B*S = 16k at 1k-16k tokens, heads = 2048 // D, causal off and on."""
    return [Cell(16384 // s, 2048 // d, 2048 // d, s, s, d, c)
            for d in (32, 80, 96, 256) for c in (False, True) for s in (1024, 4096, 16384)]


def mla_grid() -> list[Cell]:
    """DeepSeek-V3's prefill attention on one GPU of eight (16 of its 128 heads): q/k head dim 192
    (128 + 64 rotary), v's 128, causal, B*S = 16k at 1k-16k tokens."""
    return [Cell(16384 // s, 16, 16, s, s, 192, True, head_dim_v=128) for s in (1024, 4096, 16384)]


def mla_decode_grid() -> list[Cell]:
    """DeepSeek-V3 decoding in MLA's absorbed form: one new token for 128 query heads against one latent KV
    head (q/k 576, V the latent's first 512 columns), batch 1-64 at 4k and 16k cached tokens."""
    return [Cell(b, 128, 1, 1, s, 576, False, layout="latent", head_dim_v=512) for b in (1, 16, 64)
            for s in (4096, 16384)]


def quick_grid() -> list[Cell]:
    """Tiny shapes the CPU interpreter runs in seconds (its times mean nothing)."""
    return [Cell(1, 2, 2, 33, 33, 32, False), Cell(1, 2, 1, 17, 40, 64, True), Cell(2, 2, 2, 16, 16, 64, True)]


def parse_fields(text: str | None, fields, kind: str, convert=int) -> dict[str, list]:
    """``"name=1,2 other=3"`` -> ``{"name": [1, 2], "other": [3]}``; every name must be in ``fields``."""
    out = {}
    for part in (text or "").split():
        key, _, vals = part.partition("=")
        if key not in fields:
            raise ValueError(f"unknown {kind} field {key!r}; fields: {sorted(fields)}")
        out[key] = [convert(x) for x in vals.split(",") if x]
    return out


def _value(cell: Cell, field: str) -> str:
    x = getattr(cell, field)
    return str(int(x)) if isinstance(x, (bool, int)) else f"{x:g}" if isinstance(x, float) else x


def where(cells: list[Cell], text: str | None) -> list[Cell]:
    """The cells whose fields take the listed values: ``"seqlen_q=1,4 causal=1 layout=hf-view"``."""
    keep = parse_fields(text, Cell.__dataclass_fields__, "cell", convert=str)
    return [c for c in cells if all(_value(c, key) in vals for key, vals in keep.items())]


def values(cells: list[Cell]) -> str:
    """What ``--where`` can select in ``cells``: each field's values, for an error message."""
    fields = {f: sorted({_value(c, f) for c in cells}, key=lambda x: (len(x), x)) for f in Cell.__dataclass_fields__}
    return "values here: " + " ".join(f"{f}={','.join(v)}" for f, v in fields.items())


GRIDS = {"default": default_grid, "decode": decode_grid, "extra": extra_grid, "features": features_grid,
         "windows": windows_grid, "dropout": dropout_grid,
         "ragged": ragged_grid, "models": models_grid, "head-dims": head_dims_grid, "mla": mla_grid,
         "mla-decode": mla_decode_grid,
         "quick": quick_grid}
