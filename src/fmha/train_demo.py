"""``python -m fmha train-demo``: a small transformers causal LM trained twice from the same seed, once with
``attn_implementation="fmha"`` and once with ``"sdpa"``, on the same fixed token stream; the two loss
curves side by side (and plotted).

The stream is a fixed random Markov chain over the vocabulary (each token's successor drawn from a
few likely ones), so the loss falls well below ``log(vocab)`` as the model learns it.  Weights are
float32, the steps run under bfloat16 autocast (the usual mixed-precision recipe), AdamW.  The curves
agree to bfloat16 noise: the two runs differ only in how attention rounds.
"""
from __future__ import annotations

import copy
import math
import sys
import time

import torch

SIZES = {  # hidden, layers, heads, kv_heads, head_dim, sequence, batch
    "tiny": (64, 2, 2, 1, 32, 32, 4),     # the CPU interpreter, in a minute or two
    "small": (512, 4, 8, 2, 64, 512, 8),  # a GPU
    "real": (2048, 8, 16, 4, 128, 2048, 8),
}
VOCAB = 256


def token_stream(n: int, seed: int = 0) -> torch.Tensor:
    """``n`` tokens of a fixed random Markov chain: each token is followed by one of 4 likely successors."""
    g = torch.Generator().manual_seed(seed)
    successors = torch.randint(0, VOCAB, (VOCAB, 4), generator=g)
    out = torch.empty(n, dtype=torch.long)
    tok = 0
    for i in range(n):
        out[i] = tok
        tok = int(successors[tok, torch.randint(0, 4, (1,), generator=g)])
    return out


def build(size: str, device: str, seed: int):
    """The two models, same weights: ``{"sdpa": model, "fmha": model}``."""
    import transformers

    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    hidden, layers, heads, kv_heads, head_dim, _, _ = SIZES[size]
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 3,
                                   num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                                   head_dim=head_dim, max_position_embeddings=SIZES[size][5])
    torch.manual_seed(seed)
    models = {impl: transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=impl)
              for impl in ("sdpa", "fmha")}
    models["fmha"].load_state_dict(models["sdpa"].state_dict())
    return {impl: m.to(device).train() for impl, m in models.items()}


def train(model, stream: torch.Tensor, steps: int, size: str, device: str, lr: float = 3e-3,
          tick=lambda step, loss: None) -> list[float]:
    """``steps`` AdamW steps on consecutive windows of ``stream``; the loss of each."""
    *_, seqlen, batch = SIZES[size]
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    per_step = batch * seqlen
    for step in range(steps):
        start = step * per_step % (stream.numel() - per_step)
        ids = stream[start:start + per_step].view(batch, seqlen).to(device)
        with torch.autocast(device, dtype=torch.bfloat16):
            loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        tick(step, losses[-1])
    return losses


def run(steps: int, size: str, device: str, seed: int = 0, plot: str | None = None, stream=sys.stderr) -> dict:
    """Both runs; returns ``{"sdpa": losses, "fmha": losses, "max_diff": ..., "seconds": {...}}``."""
    models = build(size, device, seed)
    *_, seqlen, batch = SIZES[size]
    tokens = token_stream(max(4 * batch * seqlen, min(steps, 64) * batch * seqlen + 1), seed)
    out = {"seconds": {}}
    for impl, model in models.items():
        t0 = time.perf_counter()

        def tick(step, loss, impl=impl):
            stream.write(f"\r{impl}: step {step + 1}/{steps} loss {loss:.4f}")
            stream.flush()
        out[impl] = train(model, tokens, steps, size, device, tick=tick)
        out["seconds"][impl] = time.perf_counter() - t0
        stream.write("\n")
    diffs = [abs(a - b) for a, b in zip(out["fmha"], out["sdpa"])]
    out["max_diff"] = max(diffs)
    if plot:
        _plot(out, size, plot)
    return out


def _plot(out: dict, size: str, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    for impl, style in (("sdpa", "-"), ("fmha", "--")):
        ax.plot(out[impl], style, label=f'attn_implementation="{impl}"')
    ax.axhline(math.log(VOCAB), color="grey", lw=0.5)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(f"Llama-shaped LM ({size}), bf16 autocast, same seed: max |difference| {out['max_diff']:.3g}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
