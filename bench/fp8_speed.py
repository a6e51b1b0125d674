"""Float8 K/V against bfloat16, same call otherwise: time (CUDA-graph replays) and the error against the
dequantized inputs.

`PYTHONPATH=src python3 bench/fp8_speed.py`: GQA 32/8, D=128; decoding (1 and 4 query rows against 8k-32k
keys) and one causal 4k prefill.  K and V are quantized per (batch, KV head) to e4m3 with FlashAttention-3's
descale factors; the bf16 call gets the original K/V.  Prints a table (microseconds, the speed ratio,
and the max error of the float8 call against `tiled` on the dequantized K/V).
"""
import torch
from triton.testing import do_bench_cudagraph

import fmha

CASES = [(1, 8192, 1), (8, 8192, 1), (8, 32768, 1), (4, 32768, 4), (1, 4096, 4096)]  # (batch, keys, query rows)


def quantized(t: torch.Tensor):
    scale = (t.float().abs().amax(dim=(2, 3)) / 448).clamp_min(1e-6)
    return (t.float() / scale[:, :, None, None]).to(torch.float8_e4m3fn), scale


def main():
    torch.manual_seed(0)
    print("case | bf16 us | float8 us | float8 speed | max error against the dequantized inputs")
    for batch, keys, rows in CASES:
        q = torch.randn(batch, 32, rows, 128, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(batch, 8, keys, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        (k8, ks), (v8, vs) = quantized(k), quantized(v)
        causal = rows > 16
        bf16 = lambda: fmha.attention(q, k, v, causal=causal)  # noqa: E731
        fp8 = lambda: fmha.attention(q, k8, v8, causal=causal, k_descale=ks, v_descale=vs)  # noqa: E731
        dequant = [(t.float() * s[:, :, None, None]).to(torch.bfloat16) for t, s in ((k8, ks), (v8, vs))]
        err = (fp8().float() - fmha.attention(q, *dequant, causal=causal, variant="tiled").float()).abs().max()
        t16, t8 = (do_bench_cudagraph(f, rep=200) * 1e3 for f in (bf16, fp8))
        print(f"B{batch} rows {rows} keys {keys} | {t16:.1f} | {t8:.1f} | {t16 / t8:.2f}x | {err.item():.2e}")


if __name__ == "__main__":
    main()
