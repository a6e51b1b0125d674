"""A small transformers model built from a config (no download) runs with fmha as with SDPA."""
import copy

import pytest
import torch

from conftest import DEVICE

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def models():
    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="sdpa",
                                                     torch_dtype=torch.bfloat16)
    ours = transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation="fmha",
                                                      torch_dtype=torch.bfloat16)
    assert ref.config._attn_implementation == "sdpa" and ours.config._attn_implementation == "fmha"
    ours.load_state_dict(ref.state_dict())
    return ref.to(DEVICE).eval(), ours.to(DEVICE).eval()


def test_hidden_states_match_sdpa(models, monkeypatch):
    import fmha.integrations.transformers as fmha_hf
    calls = []
    real = fmha_hf.fmha.attention
    monkeypatch.setattr(fmha_hf.fmha, "attention", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    ref, ours = models
    ids = torch.randint(0, 101, (2, 37), generator=torch.Generator().manual_seed(1)).to(DEVICE)
    with torch.no_grad():
        a = ref(ids, output_hidden_states=True).hidden_states
        b = ours(ids, output_hidden_states=True).hidden_states
    assert len(calls) == 2 and all(c["causal"] and c["layout"] == "bshd" for c in calls)  # one per layer
    for x, y in zip(a, b):
        torch.testing.assert_close(y.float(), x.float(), atol=3e-2, rtol=3e-2)
    assert not torch.equal(a[-1], a[0])


def test_decode_with_cache_matches_sdpa(models):
    ref, ours = models
    ids = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        ga = ref.generate(ids, max_new_tokens=5, do_sample=False)
        gb = ours.generate(ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(ga, gb)


def test_padding_goes_to_sdpa_with_the_mask(models, monkeypatch):
    """A padded batch carries a real mask: the integration hands it to SDPA with that mask (never
    fmha without it), and each sequence's logits equal those of the sequence run alone."""
    import fmha.integrations.transformers as fmha_hf
    from transformers.integrations import sdpa_attention
    fmha_calls, sdpa_masks = [], []
    real_fmha, real_sdpa = fmha_hf.fmha.attention, sdpa_attention.sdpa_attention_forward
    monkeypatch.setattr(fmha_hf.fmha, "attention", lambda *a, **kw: fmha_calls.append(kw) or real_fmha(*a, **kw))
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda m, q, k, v, mask, **kw: sdpa_masks.append(mask) or real_sdpa(m, q, k, v, mask, **kw))
    ref, ours = models
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    with torch.no_grad():
        b = ours(ids, attention_mask=mask).logits
        assert not fmha_calls and len(sdpa_masks) == 2 and all(m is not None for m in sdpa_masks)
        alone = [ours(ids[i:i + 1, 5 * (i == 0):]).logits for i in range(2)]  # no padding: fmha
    assert len(fmha_calls) == 4
    torch.testing.assert_close(b[0, 5:].float(), alone[0][0].float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(b[1].float(), alone[1][0].float(), atol=3e-2, rtol=3e-2)
