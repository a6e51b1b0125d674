"""Differential testing of the transformers integration: real model code against its own eager attention.

``python -m fmha model-check [--models llama doge ...]`` (default: every causal LM transformers builds from a
small config) builds each model type three times from one small config and one set of random weights (bfloat16):
with eager attention (the reference: the model's own definition), SDPA and fmha.  Each answers the same prompts
(two sequences, one left-padded) in prefill and in four cached decoding steps (``--compile BACKEND``: SDPA's and
fmha's models under ``torch.compile``); the largest difference from eager's logits over the real tokens, relative
to eager's largest, is each implementation's error.  fmha passes when its
error is at most twice SDPA's, or 0.05 (bfloat16's noise through two random layers) where that is more or SDPA is
not offered; a dropped window, a lost causal band or a bias left out moves the logits by 0.3-0.8.  A text sub-config
(``text_config``) takes the same sizes.  Where the small config does not answer, four layers (a hybrid's first
attention layer: Qwen3-Next's fourth), as many KV heads as heads (DeepSeek-V2) and the sizes alone are tried in
turn; a model type that places its kinds of layer by a setting of its own, or reads one with no default fit for
these sizes, gets it (:data:`OWN_SETTINGS`: hybrids one attention layer in two, Gemma 3n's text model two layers
that share the keys and values of the two before them, Dots1 its shared experts, DBRX its sizes under names of its
own).  A model type that none of these builds, whose eager code answers none of the prompts, or that stays large
(other sub-configs keeping their own sizes: BLT's 4.6 billion parameters, counted on the meta device first) is
skipped; one that builds with eager but not with fmha is an error.
"""
from __future__ import annotations

import copy
import dataclasses
import warnings

import torch

# two layers of 4 heads of 16 (2 KV heads), a window of 8 keys where a model has one; a mixture of experts with every
# expert taken (a near-tie in routing would send a token elsewhere under either attention's rounding); DeepSeek's
# latent attention with q/k heads of 32 and V's of 16, its sparse indexer picking 4 keys a row; rotary embeddings on 8
# of a head's 16 columns where a model names them so (GPT-J, CodeGen: theirs default to 64); an encoder-decoder's
# decoder (BART's, Whisper's, BigBird-Pegasus's causal LMs) as large as the rest, under its own names
SMALL = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256, sliding_window=8, pad_token_id=0,
             bos_token_id=1, eos_token_id=2, num_local_experts=2, num_experts=2, n_routed_experts=2,
             num_experts_per_tok=2, moe_intermediate_size=32, n_group=1, topk_group=1, first_k_dense_replace=1,
             qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, kv_lora_rank=32, q_lora_rank=32,
             index_topk=4, index_n_heads=2, index_head_dim=16, rotary_dim=8, decoder_layers=2, encoder_layers=2,
             decoder_attention_heads=4, encoder_attention_heads=4, decoder_ffn_dim=96, encoder_ffn_dim=96)
# where the first attention layer of a hybrid lies past two layers (Qwen3-Next's and Qwen3.5's fourth, RecurrentGemma's
# third), and where a model's KV heads are its heads (DeepSeek-V2's latent attention repeats none)
DEEPER = {**SMALL, "num_hidden_layers": 4}
SAME_HEADS = {**SMALL, "num_key_value_heads": SMALL["num_attention_heads"]}
# settings of a model type's own beside the sizes.  Where it places its kinds of layer, its first attention layer (or
# the first sharing another's keys and values) past two or four layers by default: hybrids get one attention layer in
# two (LFM2-MoE's other a convolution, Zamba 2's a Mamba block before its shared attention one, Kimi-Linear's latent
# attention after a linear one); GPT-Neo a global layer and a local one (its window the small one); Gemma 3n's last
# two of four layers read the keys and values of the two before them.  What its code reads with no default fit for these
# sizes: Dots1's shared experts; DBRX's sizes under names of its own (its FFN config's width, 2048 by default)
OWN_SETTINGS = {"jamba": dict(attn_layer_offset=1, attn_layer_period=2), "bamba": dict(attn_layer_indices=[1]),
                "granitemoehybrid": dict(layer_types=["linear_attention", "full_attention"]),
                "lfm2_moe": dict(layer_types=["conv", "full_attention"]),
                "kimi_linear": dict(layer_types=["linear_attention", "full_attention"]),
                "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=8),
                "zamba2": dict(layers_block_type=["mamba", "hybrid"]),
                "gemma3n_text": dict(num_kv_shared_layers=2, layer_types=["sliding_attention", "full_attention"] * 2),
                "dots1": dict(n_shared_experts=1),
                "dbrx": dict(d_model=64, n_heads=4, n_layers=2, max_seq_len=256,
                             attn_config=dict(kv_n_heads=2, clip_qkv=8.0, rope_theta=10000.0),
                             ffn_config=dict(ffn_hidden_size=96, moe_num_experts=2, moe_top_k=2, hidden_size=64))}
# where a model takes no more: the sizes alone, and as many KV heads as heads (DeepSeek's latent attention)
PLAIN = {**{k: SMALL[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads")}, "num_key_value_heads": 4}
FLOOR = 0.05
# parameters: past it a config kept its own sizes (sub-configs of their own: BLT's 4.6 billion, LongCat-Flash's 1.9),
# three builds of which would not fit a CI machine's memory; a multimodal model's vision tower (Gemma 3's 93M) does
LARGEST = 1_000_000_000


@dataclasses.dataclass
class Row:
    model: str
    verdict: str  # ok | off | skipped | error
    fmha: float = float("nan")  # relative error against eager's logits
    sdpa: float = float("nan")
    note: str = ""


def causal_lms() -> list[str]:
    """Every model type transformers maps to a causal LM."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    return list(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _config(model_type: str, sizes: dict):
    """The config of ``model_type`` at ``sizes``, its text sub-config (``text_config``: Emu3's causal LM is built from
    it) at those sizes too."""
    import transformers
    sizes = {**sizes, **OWN_SETTINGS.get(model_type, {})}
    cfg = transformers.AutoConfig.for_model(model_type, **sizes)
    if "text_config" in (getattr(cfg, "sub_configs", None) or {}):
        cfg = transformers.AutoConfig.for_model(model_type, **sizes, text_config=dict(sizes))
    return cfg


def _build(model_type: str, impl: str, device: str, sizes: dict):
    """The model of config ``sizes`` (:data:`SMALL` or another of the sizes :func:`check` tries) with attention
    ``impl``, random weights from one seed."""
    import transformers
    cfg = _config(model_type, sizes)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(copy.deepcopy(cfg), attn_implementation=impl,
                                                          dtype=torch.bfloat16)
    return model.to(device).eval()


def _parameters(model_type: str, sizes: dict) -> int | None:
    """How many parameters the model of config ``sizes`` has, built on the meta device (no memory taken); None where
    it does not build there."""
    import transformers
    try:
        cfg = _config(model_type, sizes)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(cfg)
    except Exception:
        return None
    return sum(p.numel() for p in model.parameters())


PARTS = ("prefill", "padded", "decode")


def _answer(model, part: str, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Logits over the real tokens: prefill without a mask, prefill with ``mask``, or four decoding steps through a
    cache after a prefill of all but the last four tokens."""
    import transformers
    with torch.no_grad():
        if part == "prefill":
            return model(ids).logits.float()
        if part == "padded":
            return model(ids, attention_mask=mask).logits.float()[mask.bool()]
        cache, cut = transformers.DynamicCache(config=model.config), ids.shape[1] - 4
        steps = [model(ids[:, :cut], attention_mask=mask[:, :cut], past_key_values=cache).logits[:, -1]]
        for t in range(cut, ids.shape[1] - 1):
            steps.append(model(ids[:, t:t + 1], attention_mask=mask[:, :t + 1], past_key_values=cache).logits[:, -1])
        return torch.stack(steps).float()


def _error(model, want: dict, ids, mask) -> float:
    """The largest relative difference from eager's answers ``want`` over the parts eager answered."""
    return max(((_answer(model, part, ids, mask) - w).abs().max() / w.abs().max()).item() for part, w in want.items())


def check(model_type: str, device: str = "cpu", compile_backend: str | None = None) -> Row:
    """One model type: fmha's and SDPA's errors against eager's logits, and the verdict.  ``compile_backend``: the
    SDPA and fmha models run under ``torch.compile`` with that backend ("eager": Dynamo's tracing alone), the eager
    reference as it is."""
    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, SMALL["vocab_size"], (2, 21), generator=g).to(device)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    for sizes in (SMALL, DEEPER, SAME_HEADS, PLAIN):
        want, left_out = {}, []
        count = _parameters(model_type, sizes)
        if count is not None and count > LARGEST:  # its sub-configs keep their own sizes: too large to check here
            why = f"{count / 1e6:.0f}M parameters at these sizes (its sub-configs keep their own)"
            continue
        try:
            eager = _build(model_type, "eager", device, sizes)
        except Exception as e:  # a config this small does not build: not fmha's to judge
            why = f"{type(e).__name__}: {str(e)[:100]}"
            continue
        for part in PARTS:
            try:
                want[part] = _answer(eager, part, ids, mask)
            except Exception:  # a part the model's own code does not answer at this size (Bloom's cached decoding)
                left_out.append(part)
        if want:
            break
        why = "eager answers none of " + ", ".join(PARTS)
    if not want:
        return Row(model_type, "skipped", note=why)
    errors = {}
    for impl in ("sdpa", "fmha"):
        try:
            model = _build(model_type, impl, device, sizes)
        except Exception as e:  # transformers does not offer SDPA for this model; or fmha's build fails
            if impl == "fmha":
                return Row(model_type, "error", note=f"fmha: {type(e).__name__}: {str(e)[:100]}")
            continue
        model.load_state_dict(eager.state_dict())
        if compile_backend:
            torch._dynamo.reset()
            model = torch.compile(model, backend=compile_backend)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                errors[impl] = _error(model, want, ids, mask)
        except Exception as e:
            if impl == "fmha":
                return Row(model_type, "error", sdpa=errors.get("sdpa", float("nan")),
                           note=f"{type(e).__name__}: {str(e)[:100]}")
    sdpa = errors.get("sdpa", float("nan"))
    bound = max(2 * sdpa, FLOOR) if "sdpa" in errors else FLOOR
    return Row(model_type, "ok" if errors["fmha"] <= bound else "off", errors["fmha"], sdpa,
               "without " + ", ".join(left_out) if left_out else "")


def run(model_types: list[str], device: str = "cpu", stream=None, compile_backend: str | None = None) -> list[Row]:
    """:func:`check` each model type, a line each as it ends."""
    import transformers
    transformers.logging.set_verbosity_error()
    rows = []
    for name in model_types:
        rows.append(check(name, device, compile_backend))
        r = rows[-1]
        if stream is not None:
            print(f"{r.model:24s} {r.verdict:8s} fmha {r.fmha:8.1e}  sdpa {r.sdpa:8.1e}  {r.note}", file=stream,
                  flush=True)
    return rows
