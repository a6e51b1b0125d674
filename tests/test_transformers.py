"""A small transformers model built from a config (no download) runs with fmha as with SDPA."""
import copy

import pytest
import torch

from conftest import DEVICE
from fmha.verify import greedy_partings

transformers = pytest.importorskip("transformers")


def twins(cls, cfg):
    """The model of ``cfg`` with SDPA and with fmha, the same random weights, bfloat16, on DEVICE, in eval mode."""
    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    torch.manual_seed(0)
    ref, ours = (cls._from_config(copy.deepcopy(cfg), attn_implementation=name, dtype=torch.bfloat16)
                 for name in ("sdpa", "fmha"))
    assert ref.config._attn_implementation == "sdpa" and ours.config._attn_implementation == "fmha"
    ours.load_state_dict(ref.state_dict())
    return ref.to(DEVICE).eval(), ours.to(DEVICE).eval()


def assert_greedy_alike(got, want, ref, mask=None):
    """fmha's greedy tokens ``got`` are SDPA's ``want``, or part from them only where SDPA's model (``ref``) rates
    both tokens within one bfloat16 step of each other (:func:`fmha.verify.greedy_partings`; past the first, the
    continuations differ).  ``mask``: the prompt's attention mask."""
    if torch.equal(got, want):
        return
    assert got.shape == want.shape, (got.shape, want.shape)
    for row, at, gap, step in greedy_partings(got, want, ref, mask):
        assert gap <= step, (row, at, gap, step)


@pytest.fixture(scope="module")
def models():
    return twins(transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=101, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128))


def test_greedy_partings_tell_a_tie_from_a_wrong_token(models):
    """:func:`fmha.verify.greedy_partings`: nothing where the tokens agree; where one row's token is swapped for the
    one SDPA's model rates lowest, that row, that place, and a gap far past one bfloat16 step."""
    ref, _ = models
    ids = torch.randint(0, 101, (2, 9), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    with torch.no_grad():
        want = ref.generate(ids, max_new_tokens=4, do_sample=False)
        at = ids.shape[1] + 2
        worst = ref(want[1:, :at]).logits[0, -1].argmin()
    assert greedy_partings(want, want.clone(), ref) == []
    got = want.clone()
    got[1, at] = worst
    [(row, place, gap, step)] = greedy_partings(got, want, ref)
    assert (row, place) == (1, at) and gap > 10 * step > 0, (gap, step)


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


def test_a_decoding_step_reads_q_k_v_as_they_lie_and_returns_a_contiguous_output(monkeypatch):
    """One new token a sequence without a mask: q (a transposed view of the projection's ``[batch, 1, heads, dim]``)
    and the cache's bhsd K/V go to fmha as bhsd, and the output is the ``[batch, 1, heads, dim]`` tensor
    transformers reshapes without a copy; SDPA's values."""
    import types

    import fmha
    import fmha.integrations.transformers as fmha_hf
    g = torch.Generator().manual_seed(3)
    query = torch.randn(2, 1, 4, 32, generator=g).to(DEVICE, torch.bfloat16).transpose(1, 2)
    key, value = (torch.randn(2, 2, 37, 32, generator=g).to(DEVICE, torch.bfloat16) for _ in range(2))
    layouts, real = [], fmha.attention
    monkeypatch.setattr(fmha, "attention", lambda *a, **kw: layouts.append(kw.get("layout", "bhsd")) or real(*a, **kw))
    module = types.SimpleNamespace(is_causal=True, training=False)
    out, _ = fmha_hf.attention_forward(module, query, key, value, None, scaling=0.2)
    assert layouts == ["bhsd"] and out.shape == (2, 1, 4, 32) and out.is_contiguous()
    want = torch.nn.functional.scaled_dot_product_attention(
        query.float(), key.float().repeat_interleave(2, 1), value.float().repeat_interleave(2, 1), scale=0.2)
    torch.testing.assert_close(out.float(), want.transpose(1, 2), atol=2e-2, rtol=0)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padded_batch_runs_as_packed_sequences(models, monkeypatch, side):
    """A padded batch carries a padding mask: the integration runs the real tokens as packed
    sequences (never SDPA), and each sequence's logits equal those of the sequence run alone."""
    import fmha.integrations.transformers as fmha_hf
    from transformers.integrations import sdpa_attention
    varlen_calls, sdpa_calls = [], []
    real_varlen = fmha_hf.fmha.attention_varlen
    monkeypatch.setattr(fmha_hf.fmha, "attention_varlen",
                        lambda *a, **kw: varlen_calls.append(kw) or real_varlen(*a, **kw))
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", lambda *a, **kw: sdpa_calls.append(kw))
    _, ours = models
    ids = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    mask = torch.ones_like(ids)
    pad = slice(0, 5) if side == "left" else slice(11, 16)
    mask[0, pad] = 0
    with torch.no_grad():
        b = ours(ids, attention_mask=mask).logits
        assert len(varlen_calls) == 2 and not sdpa_calls  # one per layer
        alone = [ours(ids[0:1, 5:] if side == "left" else ids[0:1, :11]).logits, ours(ids[1:2]).logits]
    real = b[0, 5:] if side == "left" else b[0, :11]
    torch.testing.assert_close(real.float(), alone[0][0].float(), atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(b[1].float(), alone[1][0].float(), atol=3e-2, rtol=3e-2)


def test_only_padding_masks_are_unpadded():
    """key_padding recognises causal + one run of real keys per sequence (left or right), with the
    layer's window; a hole in the middle, a mask off the band, or a float mask goes to SDPA; the band
    alone, every key real (a decode step's all-ones mask), needs no gathering."""
    from fmha.integrations.transformers import key_padding
    q, k = 6, 6
    causal = torch.ones(q, k, dtype=torch.bool).tril()
    valid = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    mask = (causal[None] & valid[:, None, :])[:, None]
    found = key_padding(mask, q, k, True, (-1, -1))
    assert torch.equal(found.valid, valid) and not found.all_rows and found.used is None
    windowed = mask & (torch.arange(k)[None, :] >= torch.arange(q)[:, None] - 2)
    assert torch.equal(key_padding(windowed, q, k, True, (2, -1)).valid, valid)
    assert key_padding(windowed, q, k, True, (-1, -1)) is None
    holes = valid.clone()
    holes[0, 3] = False
    assert key_padding((causal[None] & holes[:, None, :])[:, None], q, k, True, (-1, -1)) is None
    assert key_padding(torch.ones(2, 1, q, k, dtype=torch.bool), q, k, True, (-1, -1)) is None  # not causal
    assert key_padding(mask.float(), q, k, True, (-1, -1)) is None
    band = key_padding(causal[None, None].expand(2, 1, q, k), q, k, True, (-1, -1))
    assert band.valid is None and band.used is None
    assert key_padding(torch.ones(2, 1, 1, k, dtype=torch.bool), 1, k, False, (-1, -1)).valid is None  # decoding
    assert key_padding(windowed[:1].expand(2, 1, q, k), q, k, True, (2, -1)).valid is not None  # sequence 0's padding


def test_a_masks_verdict_lives_as_long_as_the_mask(models, monkeypatch):
    """key_padding reads a mask once (every layer passes the same) and keeps its verdict, device tensors included,
    only while the mask lives: after generate() with a static cache (whose masks hide the slots not yet written, so
    each verdict holds the real keys and their lengths), nothing of its forwards is held."""
    import gc

    import fmha.integrations.transformers as fmha_hf
    from fmha.integrations.transformers import key_padding
    _, ours = models
    fmha_hf._seen.clear()
    q = k = 6
    mask = (torch.ones(q, k, dtype=torch.bool).tril()[None] & torch.tensor([[0, 1, 1, 1, 1, 1]], dtype=torch.bool)
            [:, None, :])[:, None]
    found = key_padding(mask, q, k, True, (-1, -1))
    monkeypatch.setattr(fmha_hf, "_structure", None)  # a second reading would fail: the verdict is kept
    assert key_padding(mask, q, k, True, (-1, -1)) is found and len(fmha_hf._seen) == 1
    del mask, found
    gc.collect()
    assert not fmha_hf._seen
    monkeypatch.undo()
    read = []
    monkeypatch.setattr(fmha_hf, "key_padding", lambda *a: read.append(key_padding(*a)) or read[-1])
    ids = torch.randint(1, 101, (1, 12), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    with torch.no_grad():
        ours.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, min_new_tokens=3, do_sample=False,
                      cache_implementation="static")
    assert any(r is not None and r.used is not None for r in read)  # verdicts with device tensors were made
    read.clear()
    gc.collect()
    assert not fmha_hf._seen and not fmha_hf._packed


@pytest.mark.parametrize("q_len,k_len", [(5, 8), (9, 4), (6, 6)])
@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_a_bidirectional_padding_mask_keeps_every_query_row(q_len, k_len, left):
    """A mask with no band (cross-attention to a padded encoder, or a padded encoder's own attention): every
    query row sees the same real keys, and nothing ties a query row to a key column, so every row is computed
    (as SDPA computes it), whatever the lengths and wherever the padding lies."""
    import fmha.integrations.transformers as fmha_hf

    class Module(torch.nn.Module):
        is_causal = False
    g = torch.Generator().manual_seed(q_len * k_len + left)
    q = torch.randn(2, 4, q_len, 32, generator=g).to(torch.bfloat16).to(DEVICE)
    k, v = (torch.randn(2, 2, k_len, 32, generator=g).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    valid = torch.ones(2, k_len, dtype=torch.bool)
    real = [k_len, max(1, k_len // 2 - 1)]  # sequence 1 shorter than the queries where k_len allows
    for b, n in enumerate(real):
        valid[b] = torch.arange(k_len) >= k_len - n if left else torch.arange(k_len) < n
    mask = valid[:, None, None, :].expand(2, 1, q_len, k_len).to(DEVICE)
    got, _ = fmha_hf.attention_forward(Module(), q, k, v, mask, scaling=32 ** -0.5)
    want = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float().repeat_interleave(2, 1),
                                                            v.float().repeat_interleave(2, 1), attn_mask=mask)
    torch.testing.assert_close(got.float(), want.transpose(1, 2), atol=2e-2, rtol=2e-2)


def test_an_encoder_decoder_with_padded_sources_matches_sdpa():
    """transformers' BART, a padded source batch (one source shorter than the target): the encoder's own
    attention and the decoder's cross-attention take the padding masks with no band; the decoder's last hidden
    states equal SDPA's."""
    ref, ours = twins(transformers.BartForConditionalGeneration, transformers.BartConfig(
        vocab_size=101, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64))
    g = torch.Generator().manual_seed(13)
    src, tgt = (torch.randint(4, 101, (2, n), generator=g).to(DEVICE) for n in (8, 6))
    mask = torch.ones_like(src)
    mask[1, 3:] = 0
    with torch.no_grad():
        want, got = (m(input_ids=src, attention_mask=mask, decoder_input_ids=tgt, output_hidden_states=True)
                     .decoder_hidden_states[-1] for m in (ref, ours))
    torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=1e-2)


def test_head_dims_fmha_does_not_take_run_sdpa_said_once(monkeypatch):
    """A model whose head dim fmha does not take (12: not a multiple of 8) runs SDPA, with one warning, and its
    generations are SDPA's; with attention sinks (SDPA has none) it is refused by name."""
    import warnings

    import fmha.integrations.transformers as fmha_hf
    monkeypatch.setattr(fmha_hf, "_warned", set())
    ref, ours = twins(transformers.LlamaForCausalLM, transformers.LlamaConfig(
        vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2))
    ids = torch.randint(1, 101, (2, 7), generator=torch.Generator().manual_seed(14)).to(DEVICE)
    with warnings.catch_warnings(record=True) as said, torch.no_grad():
        warnings.simplefilter("always")
        got = ours.generate(ids, max_new_tokens=3, do_sample=False)
    assert_greedy_alike(got, ref.generate(ids, max_new_tokens=3, do_sample=False), ref)
    assert [str(w.message) for w in said if "head dims" in str(w.message)] == [
        f"fmha does not take this model's head dims ({fmha_hf.head_dims_reason(12, 12)}): it runs on torch SDPA"]
    q = torch.zeros(1, 4, 3, 12, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(NotImplementedError, match="SDPA has no attention sinks"):
        fmha_hf.attention_forward(ours.model.layers[0].self_attn, q, q[:, :2], q[:, :2], None,
                                  s_aux=torch.zeros(4, device=DEVICE))


@pytest.mark.parametrize("q", [1, 3])
def test_a_static_cache_mask_reads_its_queries_as_the_last_real_keys(q):
    """A static cache's mask: the real keys a prefix, the slots after them unused, the q queries each
    sequence's last real keys (not the last key columns).  Read as such (``used``: seqused_k), never
    as queries at unused slots, whose output would be zeros; with left padding too (``last``, packed)."""
    from fmha.integrations.transformers import key_padding
    k = 10
    ends = torch.tensor([6, 9])
    j = torch.arange(k)
    pos = ends[:, None] - q + torch.arange(q)[None, :]  # each query's position: the sequence's last real keys
    used_mask = (j[None, None, :] <= pos[..., None]) & (j[None, None, :] < ends[:, None, None])
    found = key_padding(used_mask[:, None], q, k, q > 1, (-1, -1))
    assert found.all_rows and torch.equal(found.used, ends.to(torch.int32))
    left = used_mask & (j[None, None, :] >= torch.tensor([0, 2])[:, None, None])  # sequence 1 starts at key 2
    found = key_padding(left[:, None], q, k, q > 1, (-1, -1))
    assert found.all_rows and found.used is None and torch.equal(found.valid, left.any(1))
    off = used_mask.clone()
    off[0, :, 2] = False  # a hole among sequence 0's real keys: not this structure
    assert key_padding(off[:, None], q, k, q > 1, (-1, -1)) is None


def test_phi_2s_head_dim_runs_fmha(monkeypatch):
    """Phi-2's head dim (80, a multiple of 8 off the powers of two) runs fmha, not SDPA, and generates SDPA's
    tokens."""
    import warnings

    import fmha.integrations.transformers as fmha_hf
    ref, ours = twins(transformers.PhiForCausalLM, transformers.PhiConfig(
        vocab_size=101, hidden_size=160, intermediate_size=192, num_hidden_layers=2, num_attention_heads=2,
        partial_rotary_factor=0.4, max_position_embeddings=128))
    calls = []
    real = fmha_hf.fmha.attention
    monkeypatch.setattr(fmha_hf.fmha, "attention", lambda q, *a, **kw: calls.append(q.shape[-1]) or real(q, *a, **kw))
    ids = torch.randint(1, 101, (1, 9), generator=torch.Generator().manual_seed(15)).to(DEVICE)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        with torch.no_grad():
            got = ours.generate(ids, max_new_tokens=3, do_sample=False)
    assert calls and set(calls) == {80}
    assert_greedy_alike(got, ref.generate(ids, max_new_tokens=3, do_sample=False), ref)


def test_a_mask_is_read_once_a_forward():
    """Every layer passes the same mask: its verdict is read on the host once, and again once the mask
    changes in place."""
    from fmha.integrations import transformers as fmha_hf
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool).tril()
    first = fmha_hf.key_padding(mask, 4, 4, True, (-1, -1))
    assert fmha_hf.key_padding(mask, 4, 4, True, (-1, -1)) is first
    mask[0, 0, :, 0] = False  # the first key of sequence 0 now padding
    again = fmha_hf.key_padding(mask, 4, 4, True, (-1, -1))
    assert again is not first and not again.valid[0, 0]
    with torch.inference_mode():  # no version counter to tell a change in place: read every time
        frozen = torch.ones(2, 1, 4, 4, dtype=torch.bool).tril()
        assert fmha_hf.key_padding(frozen, 4, 4, True, (-1, -1)).valid is None  # the band alone
        frozen[0, 0, :, 0] = False
        assert not fmha_hf.key_padding(frozen, 4, 4, True, (-1, -1)).valid[0, 0]


def test_static_cache_generation_matches_sdpa(models, monkeypatch):
    """generate() with a static cache: its prefill and decode masks (the unused slots after the real keys)
    run fmha with seqused_k, no SDPA and no gathers, and the tokens are SDPA's.  (SDPA skips the prefill's
    mask for its top-left is_causal; read bottom-right, the prompt's queries would see the empty slots.)"""
    from fmha import forward
    used = []  # fmha's kernels' calls, with seqused_k or not: observed where they run (generate() compiles a
    dense = forward.dense  # static cache's decoding on a GPU, and a spy inside torch.cond would break it)
    monkeypatch.setattr(forward, "dense", lambda *a, **kw: used.append(kw.get("seqused_k") is not None) or
                        dense(*a, **kw))
    ref, ours = models
    ids = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(5)).to(DEVICE)
    with torch.no_grad():
        want = ref.generate(ids, max_new_tokens=5, do_sample=False, cache_implementation="static",
                            attention_mask=torch.ones_like(ids))
        got = ours.generate(ids, max_new_tokens=5, do_sample=False, cache_implementation="static",
                            attention_mask=torch.ones_like(ids))
    assert_greedy_alike(got, want, ref)
    # every layer of the prefill and the 4 decode steps runs fmha (none SDPA, none gathered), the first 4 with
    # the cache's lengths; eagerly, the last step fills every slot: the band alone.  On a GPU generate() compiles
    # the decoding steps into CUDA graphs, whose replays call no Python: each call seen ran with the lengths
    if DEVICE == "cpu":
        assert len(used) == 2 * 5 and all(used[:8])
    else:
        assert len(used) >= 4 and all(used)


def test_other_masks_go_to_sdpa(monkeypatch):
    import fmha.integrations.transformers as fmha_hf
    from transformers.integrations import sdpa_attention
    sdpa_masks = []
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward",
                        lambda module, q, k, v, mask, **kw: sdpa_masks.append(mask) or (q.transpose(1, 2), None))
    q = torch.randn(1, 2, 5, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16).to(DEVICE)
    mask = torch.rand(1, 1, 5, 5, generator=torch.Generator().manual_seed(1)).to(DEVICE) > 0.5
    module = torch.nn.Module()
    fmha_hf.attention_forward(module, q, q, q, mask)
    assert len(sdpa_masks) == 1 and sdpa_masks[0] is mask


SMALL = dict(vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


def assert_logits_alike(got, want, mask=None):
    """Logits the same to bfloat16's noise (1e-2 of the largest, up to 7e-2 where a mixture of experts routes a token
    otherwise; SDPA's own differ from eager's as much; a window lost or a band dropped moves them by 0.3-0.8), over
    the real tokens of ``mask``."""
    keep = slice(None) if mask is None else mask.bool()
    got, want = got.float()[keep], want.float()[keep]
    assert (got - want).abs().max() <= 0.1 * want.abs().max(), ((got - want).abs().max(), want.abs().max())


@pytest.mark.parametrize("cls,cfg", [
    ("Doge", dict(sliding_window=8)),  # its own additive mask, built from what the mask function gives
    ("Doge", dict(sliding_window=None)),  # SDPA's own mask skip drops the causal band here: eager is the reference
    ("Phimoe", dict(sliding_window=8)),
    ("Qwen2Moe", dict(use_sliding_window=True, sliding_window=8, max_window_layers=2)),  # sliding, then full
    ("Qwen2Moe", dict(use_sliding_window=True, sliding_window=8, max_window_layers=0)),  # every layer full
], ids=str)
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_layers_that_do_not_name_their_window_keep_their_mask(cls, cfg, compiled):
    """Models whose attention calls name no ``sliding_window``, so that their window lives in their mask alone,
    which fmha's mask function leaves out where the band is all there is (Doge also adds a bias of its own to that
    mask, None or not): fmha gives the eager model's logits past the window, and full-attention layers keep every
    key, with or without padding, eagerly and under ``torch.compile`` (where the window was lost: 0.34-0.56 off)."""
    config = getattr(transformers, f"{cls}Config")(**SMALL, **cfg)
    ref, ours = twins(getattr(transformers, f"{cls}ForCausalLM"), config)
    if compiled:
        torch._dynamo.reset()
        ours = torch.compile(ours, backend="eager")
    eager = getattr(transformers, f"{cls}ForCausalLM")._from_config(copy.deepcopy(config), attn_implementation="eager",
                                                                    dtype=torch.bfloat16)
    eager.load_state_dict(ref.state_dict())
    eager = eager.to(DEVICE).eval()
    ids = torch.randint(3, 101, (2, 21), generator=torch.Generator().manual_seed(21)).to(DEVICE)
    padded = torch.ones_like(ids)
    padded[1, :5] = 0
    with torch.no_grad():
        for mask in (None, padded):
            assert_logits_alike(ours(ids, attention_mask=mask).logits, eager(ids, attention_mask=mask).logits, mask)


def test_head_dims_fmha_does_not_take_keep_their_window():
    """A sliding-window model whose head dim fmha does not take runs SDPA with its window: the mask fmha's mask
    function left out (the band is all there is) comes back as the band, window included."""
    ref, ours = twins(transformers.MistralForCausalLM, transformers.MistralConfig(**{**SMALL, "head_dim": 12},
                                                                                  sliding_window=4))
    ids = torch.randint(3, 101, (2, 21), generator=torch.Generator().manual_seed(22)).to(DEVICE)
    with torch.no_grad(), pytest.warns(UserWarning, match="head dims"):
        assert_logits_alike(ours(ids).logits, ref(ids).logits)


def test_a_position_bias_runs_sdpa_said_once():
    """T5's relative positions come as ``position_bias``, an additive bias on every score, which fmha does not take:
    those calls run SDPA (which adds it to the mask), with one warning, and give SDPA's hidden states, padded or
    not; dropping the bias moved them by 6e-2 at initialization."""
    import warnings

    import fmha.integrations.transformers as fmha_hf
    cfg = transformers.T5Config(vocab_size=101, d_model=64, d_kv=16, d_ff=96, num_layers=2, num_heads=4,
                                decoder_start_token_id=0)
    ref, ours = twins(transformers.T5Model, cfg)
    ids = torch.randint(3, 101, (2, 21), generator=torch.Generator().manual_seed(23)).to(DEVICE)
    padded = torch.ones_like(ids)
    padded[1, 15:] = 0
    fmha_hf._warned.discard("position bias (an additive bias on every score)")
    with warnings.catch_warnings(record=True) as said, torch.no_grad():
        warnings.simplefilter("always")
        for mask in (None, padded):
            kw = dict(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :9])
            assert_logits_alike(ours(**kw).last_hidden_state, ref(**kw).last_hidden_state)
    assert [str(w.message) for w in said if "position bias" in str(w.message)] == [
        "fmha does not take this model's position bias (an additive bias on every score): it runs on torch SDPA"]


OWN_ATTENTION = {  # model name -> a small config's arguments
    "Bloom": dict(hidden_size=64, n_layer=2, n_head=4),
    "XGLM": dict(d_model=64, num_layers=2, attention_heads=4, ffn_dim=96),
    "Falcon": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4),
    "GPTJ": dict(n_embd=64, n_layer=2, n_head=4, rotary_dim=8, n_positions=64),
    "GPTNeo": dict(hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]], window_size=8,
                   max_position_embeddings=64),
    "Git": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96),
}


@pytest.mark.parametrize("name", list(OWN_ATTENTION))
def test_a_model_with_attention_of_its_own_gets_eager_masks(name):
    """Bloom and XGLM compute attention in their own code (with ALiBi, Bloom), asking transformers' mask interface
    only, and add what they get to their scores; Falcon, GPT-J, GPT-Neo and GIT pick an attention class of their own
    by the implementation's name (GIT's text layers beside vision layers on the interface).  With ``"fmha"`` each
    builds (the last four raised ``KeyError: 'fmha'``), gets eager's additive mask and gives eager's logits, padded or
    not, said once (a causal band fmha's mask function left out, or a boolean mask added as 0 and 1, gave them the
    wrong answer)."""
    import warnings

    import fmha.integrations.transformers as fmha_hf
    cls = getattr(transformers, f"{name}ForCausalLM")
    config = getattr(transformers, f"{name}Config")(vocab_size=101, **OWN_ATTENTION[name])
    fmha_hf.register()
    fmha_hf._interface.pop(type(config), None)
    torch.manual_seed(0)
    eager, ours = (cls._from_config(copy.deepcopy(config), attn_implementation=impl, dtype=torch.bfloat16)
                   for impl in ("eager", "fmha"))
    ours.load_state_dict(eager.state_dict())
    eager, ours = eager.to(DEVICE).eval(), ours.to(DEVICE).eval()
    ids = torch.randint(3, 101, (2, 21), generator=torch.Generator().manual_seed(24)).to(DEVICE)
    padded = torch.ones_like(ids)
    padded[1, :5] = 0
    with warnings.catch_warnings(record=True) as said, torch.no_grad():
        warnings.simplefilter("always")
        for mask in (None, padded):
            assert_logits_alike(ours(ids, attention_mask=mask).logits, eager(ids, attention_mask=mask).logits, mask)
    assert [str(w.message) for w in said if "its own code" in str(w.message)] == [
        f"{cls.__name__.replace('ForCausalLM', 'Model')} computes attention in its own code, not through "
        "transformers' attention interface: attn_implementation='fmha' runs none of it (its masks are eager's)"]


@pytest.mark.parametrize("given", ["none", "padded"])
def test_sparse_indices_pick_the_keys_each_row_takes(given):
    """Sparse attention (DeepSeek-V3.2, GLM-DSA, HY-V4): transformers hands every implementation but eager and SDPA
    the indexer's picks (``indices``, the keys each query row takes, -1 for none) beside a mask without them.  fmha
    joins them, as eager does, with the band its mask function left out or with the mask given: SDPA's answer on the
    joined mask (dense attention, the picks dropped, was 0.65 off eager on a DeepSeek-V3.2-shaped model).
    MiniMax-M3's block-sparse ``block_indices`` are refused by name."""
    import fmha.integrations.transformers as fmha_hf
    g = torch.Generator().manual_seed(25)
    q, k, v = (torch.randn(2, h, 9, 32, generator=g).to(torch.bfloat16).to(DEVICE) for h in (4, 2, 2))
    indices = torch.randint(0, 9, (2, 9, 3), generator=g)
    indices[:, :, 0] = 0  # every row keeps a key it sees
    indices[1, 4, 2] = -1
    module = torch.nn.Module()
    module.is_causal, module.num_key_value_groups = True, 2
    band = torch.ones(9, 9, dtype=torch.bool).tril()
    mask = None
    if given == "padded":
        mask = band[None, None].repeat(2, 1, 1, 1).to(DEVICE)
        mask[1, :, :, 1] = False
    got = fmha_hf.attention_forward(module, q, k, v, mask, scaling=0.2, indices=indices.to(DEVICE))[0]
    picked = torch.zeros(2, 1, 9, 9, dtype=torch.bool)
    for b in range(2):
        for i in range(9):
            picked[b, 0, i, [j for j in indices[b, i].tolist() if j >= 0]] = True
    joined = picked & (band if mask is None else mask.cpu())
    want = torch.nn.functional.scaled_dot_product_attention(q.float().cpu(), k.float().cpu(), v.float().cpu(),
                                                            attn_mask=joined, scale=0.2, enable_gqa=True)
    torch.testing.assert_close(got.float().cpu(), want.transpose(1, 2), atol=2e-2, rtol=2e-2)
    with pytest.raises(NotImplementedError, match="block_indices"):
        fmha_hf.attention_forward(module, q, k, v, mask, scaling=0.2, block_indices=torch.zeros(2, 1, 9, 1))


@pytest.fixture(scope="module")
def sliding_models():
    """A small Mistral (sliding window of 8 keys) with SDPA and with fmha, the same weights."""
    return twins(transformers.MistralForCausalLM, transformers.MistralConfig(
        vocab_size=101, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, sliding_window=8))


def test_sliding_window_decoding_asks_for_no_mask(sliding_models, monkeypatch):
    """Past the window, generate() (with its all-ones attention mask) still reaches fmha.attention with the
    layer's window and no mask: no unpadding, no SDPA; the tokens are SDPA's."""
    import fmha.integrations.transformers as fmha_hf
    from transformers.integrations import sdpa_attention
    calls, other = [], []
    real = fmha_hf.fmha.attention
    monkeypatch.setattr(fmha_hf.fmha, "attention", lambda *a, **kw: calls.append(kw) or real(*a, **kw))
    monkeypatch.setattr(fmha_hf.fmha, "attention_varlen", lambda *a, **kw: other.append("varlen"))
    monkeypatch.setattr(sdpa_attention, "sdpa_attention_forward", lambda *a, **kw: other.append("sdpa"))
    ref, ours = sliding_models
    ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(3)).to(DEVICE)
    with torch.no_grad():
        want = ref.generate(ids, max_new_tokens=6, do_sample=False)
        got = ours.generate(ids, max_new_tokens=6, do_sample=False)
    assert_greedy_alike(got, want, ref)
    assert not other
    assert len(calls) == 2 * 6 and all(c["window"] == (7, -1) for c in calls)


def test_compiled_layers_trace_whole(sliding_models):
    """Each decoder layer compiled with fullgraph=True (a graph break would raise): prefill and decoding
    past the window trace fmha's call through its custom op, and the tokens are SDPA's."""
    import torch._dynamo
    ref, ours = sliding_models
    compiled = copy.deepcopy(ours)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    for layer in compiled.model.layers:
        layer.forward = torch.compile(layer.forward, backend=backend, fullgraph=True)
    ids = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(4)).to(DEVICE)
    limit = torch._dynamo.config.recompile_limit
    torch._dynamo.config.recompile_limit = 64  # transformers' cache guards recompile the shared layer code
    try:
        with torch.no_grad():
            want = ref.generate(ids, max_new_tokens=6, do_sample=False)
            got = compiled.generate(ids, max_new_tokens=6, do_sample=False)
    finally:
        torch._dynamo.config.recompile_limit = limit
        torch._dynamo.reset()
    assert_greedy_alike(got, want, ref)
    assert graphs
    assert any("fmha.attention" in str(g.graph) for g in graphs)


def test_compiled_generation_with_a_mask_neither_breaks_nor_recompiles(models, monkeypatch):
    """The whole model under ``torch.compile``, generate() handed a tokenizer's mask (all ones, and a left-padded
    batch): the mask's structure is read on the device and picks fmha (the band alone) or SDPA with the mask
    through ``torch.cond``, so there is no graph break and no more graphs than SDPA's own; the tokens are the
    eager ones, and fmha ran for the all-ones mask."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from fmha import forward
    ref, ours = models
    ran = []
    dense = forward.dense
    monkeypatch.setattr(forward, "dense", lambda *a, **kw: ran.append(1) or dense(*a, **kw))
    ids = torch.randint(1, 101, (2, 12), generator=torch.Generator().manual_seed(6)).to(DEVICE)
    left = torch.ones_like(ids)
    left[1, :3] = 0  # sequence 1 left-padded
    found = {}
    for name, model in (("sdpa", ref), ("fmha", ours)):
        compiled = copy.deepcopy(model)
        graphs = []
        compiled.forward = torch.compile(compiled.forward, backend=lambda gm, ex: graphs.append(gm) or gm.forward)
        torch._dynamo.reset()
        counters.clear()
        ran.clear()
        try:
            with torch.no_grad():
                for mask in (torch.ones_like(ids), left):
                    got = compiled.generate(ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5,
                                            do_sample=False)
                    want = ref.generate(ids, attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False)
                    assert_greedy_alike(got, want, ref, mask)
                    if name == "fmha" and mask is not left:
                        assert ran  # the band alone ran fmha
        finally:
            torch._dynamo.reset()
        found[name] = (len(graphs), sum(counters["graph_break"].values()))
    assert found["fmha"][1] == 0 and found["fmha"][0] <= found["sdpa"][0], found


def test_inductor_compiles_a_masked_forward_and_generation(models):
    """The whole model compiled by inductor (``torch.compile``'s default backend), handed a mask: inductor lays out
    the tensors it computes as it likes (q after the rotary embedding came out bhsd where the trace had bshd), and
    the ``torch.cond`` branches assert the strides they were traced with, so the operands go in flat.  The logits
    are SDPA's, and generate() with a dynamic and a static cache gives SDPA's tokens, for a tokenizer's all-ones mask
    and a left-padded batch."""
    import torch._dynamo
    ref, ours = models
    ids = torch.randint(1, 101, (2, 12), generator=torch.Generator().manual_seed(9)).to(DEVICE)
    left = torch.ones_like(ids)
    left[1, :3] = 0
    compiled = copy.deepcopy(ours)
    compiled.forward = torch.compile(compiled.forward)
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            got = compiled(ids, attention_mask=torch.ones_like(ids)).logits.float()
            want = ref(ids, attention_mask=torch.ones_like(ids)).logits.float()
            assert (got - want).abs().max() <= 2e-2 * want.abs().max(), (got - want).abs().max()
            for mask in (torch.ones_like(ids), left):
                for cache in (None, "static"):
                    kw = dict(attention_mask=mask, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                              cache_implementation=cache)
                    assert_greedy_alike(compiled.generate(ids, **kw), ref.generate(ids, **kw), ref, mask)
    finally:
        torch._dynamo.reset()


def test_a_compiled_forward_with_a_mask_takes_new_lengths(models):
    """A compiled forward met again at another prompt length, where Dynamo traces the length as a symbol: the
    ``torch.cond`` branches read only tensors and plain values (``causal`` stayed a symbolic bool, ``length > 1``,
    which torch.cond refuses), no graph break, the logits SDPA's at every length, a left-padded row among them."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    ref, ours = models
    compiled = torch.compile(copy.deepcopy(ours).forward, backend="eager")
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch.no_grad():
            for n in (12, 20, 28):
                ids = torch.randint(1, 101, (2, n), generator=torch.Generator().manual_seed(n)).to(DEVICE)
                mask = torch.ones_like(ids)
                mask[1, :3] = 0
                got = compiled(ids, attention_mask=mask, use_cache=False).logits.float()
                want = ref(ids, attention_mask=mask, use_cache=False).logits.float()
                assert (got - want).abs().max() <= 2e-2 * want.abs().max(), (n, (got - want).abs().max())
    finally:
        torch._dynamo.reset()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])


def test_compiled_generation_with_a_static_cache_runs_fmha_with_its_lengths(models, monkeypatch):
    """The whole model under ``torch.compile`` with a static cache (generate()'s ``cache_implementation="static"``,
    whose mask hides the slots not yet written): the prefill's ``torch.cond`` reads the mask as a static cache's
    on the device and runs fmha with ``seqused_k``; a decoding step runs fmha with the mask itself and the keys
    up to its last real one, in a graph with no ``torch.cond`` (which would cost it its CUDA graph); no graph
    break; the tokens are SDPA's, the all-ones and a left-padded batch alike."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from fmha import forward
    ref, ours = models
    lengths = []
    dense = forward.dense
    masked = []
    monkeypatch.setattr(forward, "dense", lambda *a, **kw: lengths.append(kw.get("seqused_k")) or masked.append(
        kw.get("attn_mask") is not None) or dense(*a, **kw))
    ids = torch.randint(1, 101, (2, 12), generator=torch.Generator().manual_seed(9)).to(DEVICE)
    left = torch.ones_like(ids)
    left[1, :3] = 0
    compiled = copy.deepcopy(ours)
    graphs = []
    compiled.forward = torch.compile(compiled.forward, backend=lambda gm, ex: graphs.append(gm) or gm.forward)
    torch._dynamo.reset()
    counters.clear()
    try:
        with torch.no_grad():
            for mask in (torch.ones_like(ids), left):
                kw = dict(attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False,
                          cache_implementation="static")
                got = compiled.generate(ids, **kw)
                assert_greedy_alike(got, ref.generate(ids, **kw), ref, mask)
                if mask is not left:
                    assert any(t is not None for t in lengths), lengths  # fmha ran with the cache's lengths
    finally:
        torch._dynamo.reset()
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    assert any(masked), masked  # decoding steps ran fmha with the mask, in a graph without torch.cond
    assert any("fmha.attention" in str(g.graph) and "cond" not in str(g.graph) for g in graphs), [
        ("fmha.attention" in str(g.graph), "cond" in str(g.graph)) for g in graphs]


@pytest.mark.parametrize("backend", ["graphs", "inductor"])
def test_a_compiled_training_step_with_a_mask_has_no_graph_break(backend):
    """A training step of the compiled model handed a tokenizer's mask: ``torch.cond``'s branches both
    differentiate, no graph break, and the gradients are SDPA's within bfloat16 rounding; compiled by inductor too
    (whose branches' gradients must agree in strides: with the operands as they lay, q's did not).  (Fresh models:
    one that has run with ``output_hidden_states`` carries transformers' recording hooks, which break graphs.)"""
    import torch._dynamo
    from torch._dynamo.utils import counters
    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    cfg = transformers.LlamaConfig(vocab_size=101, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    models = {name: transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=name,
                                                               dtype=torch.bfloat16).to(DEVICE)
              for name in ("sdpa", "fmha")}
    models["fmha"].load_state_dict(models["sdpa"].state_dict())
    ids = torch.randint(1, 101, (2, 16), generator=torch.Generator().manual_seed(7)).to(DEVICE)
    grads, breaks = {}, {}
    for name, model in models.items():
        compiled = torch.compile(model, backend=(lambda gm, ex: gm.forward) if backend == "graphs" else backend)
        torch._dynamo.reset()
        counters.clear()
        try:
            compiled(ids, attention_mask=torch.ones_like(ids), labels=ids).loss.backward()
        finally:
            torch._dynamo.reset()
        grads[name] = [p.grad.float() for p in model.parameters()]
        breaks[name] = sum(counters["graph_break"].values())
    assert breaks == {"sdpa": 0, "fmha": 0}
    for a, b in zip(grads["sdpa"], grads["fmha"]):
        torch.testing.assert_close(b, a, atol=2e-2, rtol=5e-2)


@pytest.mark.parametrize("which", ["models", "sliding_models"])
def test_a_padded_batch_decodes_over_its_cache_in_place(which, request, monkeypatch):
    """generate() on a left-padded batch: the prompt runs as packed sequences, and each decoding step (one new
    token a sequence) runs fmha with transformers' mask as ``attn_mask``, the cache read where it lies, nothing
    gathered (the sliding model's window joins the mask); the tokens are SDPA's, or part from them at a bf16 tie."""
    import fmha.integrations.transformers as fmha_hf
    ref, ours = request.getfixturevalue(which)
    masked, packed = [], []
    real, real_varlen = fmha_hf.fmha.attention, fmha_hf.fmha.attention_varlen
    monkeypatch.setattr(fmha_hf.fmha, "attention",
                        lambda *a, **kw: masked.append(kw.get("attn_mask") is not None) or real(*a, **kw))
    monkeypatch.setattr(fmha_hf.fmha, "attention_varlen", lambda *a, **kw: packed.append(1) or real_varlen(*a, **kw))
    ids = torch.randint(1, 101, (2, 6), generator=torch.Generator().manual_seed(12)).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # (within the sliding model's 8-key window at every step)
    with torch.no_grad():
        want = ref.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
        got = ours.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False)
    assert_greedy_alike(got, want, ref, mask)
    assert len(packed) == 2 and masked == [True] * 6  # the prompt, then 3 steps of 2 layers


def test_a_padded_batch_trains_through_the_gathered_path(models, monkeypatch):
    """A left-padded batch (eager): the real tokens go through ``attention_varlen`` by index (made once a
    forward), and the gradients of a loss over the real tokens are SDPA's within bfloat16 rounding.  A padded
    query row sees no key: fmha gives it 0, as FlashAttention's unpadded path does, where SDPA (given
    transformers' mask) spreads it over every key; so no label is predicted from a padded position (the first
    real token's is, from the last pad: it is left out too)."""
    import fmha.integrations.transformers as fmha_hf
    ref, ours = models
    packed = []
    real = fmha_hf.fmha.attention_varlen
    monkeypatch.setattr(fmha_hf.fmha, "attention_varlen", lambda *a, **kw: packed.append(1) or real(*a, **kw))
    ids = torch.randint(1, 101, (2, 14), generator=torch.Generator().manual_seed(8)).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, 1:] = labels[:, 1:].masked_fill(mask[:, :-1] == 0, -100)  # predicted from a padded position
    grads = {}
    for name, model in (("sdpa", ref), ("fmha", ours)):
        trained = copy.deepcopy(model).train()
        trained(ids, attention_mask=mask, labels=labels).loss.backward()
        grads[name] = [p.grad.float() for p in trained.parameters()]
    assert len(packed) == 2  # one call a layer
    for a, b in zip(grads["sdpa"], grads["fmha"]):
        torch.testing.assert_close(b, a, atol=2e-2, rtol=5e-2)


def _packed_positions(rows):
    """position_ids of rows of packed sequences (transformers' padding-free format): each restarts at 0."""
    return torch.tensor([[p for n in lens for p in range(n)] for lens in rows]).to(DEVICE)


@pytest.mark.parametrize("which", ["models", "sliding_models"])
def test_padding_free_packed_sequences_run_as_varlen(which, request, monkeypatch):
    """Several sequences packed along each row, told apart by position_ids alone (``DataCollatorWithFlattening``):
    one ``attention_varlen`` call a layer over every token, its cu_seqlens where the positions restart; the
    logits equal SDPA's (given transformers' dense block-diagonal mask) and each sequence's run alone (a
    sliding window of 8 keys included), and a training step's gradients equal SDPA's."""
    import fmha.integrations.transformers as fmha_hf
    ref, ours = request.getfixturevalue(which)
    cu = []
    real = fmha_hf.fmha.attention_varlen
    monkeypatch.setattr(fmha_hf.fmha, "attention_varlen", lambda *a, **kw: cu.append(a[3].tolist()) or real(*a, **kw))
    rows = [[7, 12, 5], [20, 4]]
    ids = torch.randint(1, 101, (2, 24), generator=torch.Generator().manual_seed(11)).to(DEVICE)
    pos = _packed_positions(rows)
    with torch.no_grad():
        want = ref(ids, position_ids=pos, use_cache=False).logits
        got = ours(ids, position_ids=pos, use_cache=False).logits
    assert cu == [[0, 7, 19, 24, 44, 48]] * ours.config.num_hidden_layers
    torch.testing.assert_close(got.float(), want.float(), atol=3e-2, rtol=3e-2)
    with torch.no_grad():
        for r, lens in enumerate(rows):
            for start, n in zip([0, *torch.tensor(lens).cumsum(0).tolist()], lens):
                alone = ours(ids[r:r + 1, start:start + n], use_cache=False).logits[0]
                torch.testing.assert_close(got[r, start:start + n].float(), alone.float(), atol=3e-2, rtol=3e-2)
    grads = {}
    for name, model in (("sdpa", ref), ("fmha", ours)):
        trained = copy.deepcopy(model).train()
        trained(ids, position_ids=pos, labels=ids, use_cache=False).loss.backward()
        grads[name] = [p.grad.float() for p in trained.parameters()]
    for a, b in zip(grads["sdpa"], grads["fmha"]):
        torch.testing.assert_close(b, a, atol=2e-2, rtol=5e-2)


def test_packing_told_as_flash_attention_is_told(models, monkeypatch):
    """One row of packed sequences with FlashAttention's kwargs (``cu_seq_lens_q/k``, ``max_length_q/k``, as
    ``DataCollatorWithFlattening(return_flash_attn_kwargs=True)`` gives them): taken as they are (no read of the
    positions), the logits those of the positions' own reading."""
    import fmha.integrations.transformers as fmha_hf
    ref, ours = models
    seen = []
    real = fmha_hf.fmha.attention_varlen
    monkeypatch.setattr(fmha_hf.fmha, "attention_varlen", lambda *a, **kw: seen.append(a[3:7]) or real(*a, **kw))
    lens = [9, 3, 12]
    ids = torch.randint(1, 101, (1, 24), generator=torch.Generator().manual_seed(12)).to(DEVICE)
    pos = _packed_positions([lens])
    cu = torch.tensor([0, 9, 12, 24], dtype=torch.int64).to(DEVICE)
    with torch.no_grad():
        want = ours(ids, position_ids=pos, use_cache=False).logits
        seen.clear()
        got = ours(ids, position_ids=pos, use_cache=False, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=16,
                   max_length_k=16).logits  # (a bound: the positions' reading would say 12)
    assert [(a.tolist(), b.tolist(), c, d) for a, b, c, d in seen] == [([0, 9, 12, 24], [0, 9, 12, 24], 16, 16)] * 2
    assert torch.equal(got, want)


@pytest.mark.gpu
def test_a_padded_forward_waits_for_the_gpu_once(models):
    """A left-padded batch on the GPU: the mask is read twice a forward (the mask function's all-ones test,
    then the verdict with the counts the gathers need), and no layer waits for the GPU after that (torch's
    sync debug mode counts the waits; the gathers once waited four times a layer)."""
    import warnings
    ref, ours = models
    ids = torch.randint(1, 101, (2, 40), generator=torch.Generator().manual_seed(9)).to(DEVICE)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0
    with torch.no_grad():
        ours(ids, attention_mask=mask)  # compiled kernels, recorded calls
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                ours(ids, attention_mask=mask.clone())
            finally:
                torch.cuda.set_sync_debug_mode("default")
    waits = [w for w in seen if "called a synchronizing" in str(w.message)]
    assert len(waits) <= 2, [str(w.message)[:200] for w in waits]


def test_model_check_passes_real_models_and_catches_a_dropped_window(monkeypatch):
    """``python -m fmha model-check`` (:mod:`fmha.integrations.model_check`): Llama and Mistral pass (fmha's logits as
    close to eager's as SDPA's, in prefill, padded and cached decoding); with fmha's window dropped, Mistral (a window
    of 8 keys, 21 tokens) is off."""
    import fmha.integrations.transformers as fmha_hf
    from fmha.integrations import model_check
    rows = model_check.run(["llama", "mistral"], DEVICE)
    assert [r.verdict for r in rows] == ["ok", "ok"] and all(r.fmha <= 0.05 for r in rows), rows
    real = fmha_hf.fmha.attention
    monkeypatch.setattr(fmha_hf.fmha, "attention", lambda *a, **kw: real(*a, **{**kw, "window": (-1, -1)}))
    [row] = model_check.run(["mistral"], DEVICE)
    assert row.verdict == "off" and row.fmha > 0.2, row


def test_a_window_no_mask_holds_is_left_out_as_eager_leaves_it():
    """OLMoE's calls pass its config's ``sliding_window`` where the config has one, but its masks never hold a window
    (eager and SDPA see none): fmha computes what they compute, unpadded as padded (with the window applied where
    :func:`mask` left the mask out, the unpadded prefill was 0.5 off eager's logits and the padded one matched).
    Doge keeps its window in its masks alone, Mistral in both."""
    from transformers import DogeConfig, MistralConfig, OlmoeConfig

    import fmha.integrations.transformers as fmha_hf
    from fmha.integrations import model_check
    assert [fmha_hf._window_lives(c) for c in (OlmoeConfig, DogeConfig, MistralConfig)] == ["call", "mask", None]
    [row] = model_check.run(["olmoe"], DEVICE)
    assert row.verdict == "ok" and row.fmha <= 0.05, row


def test_model_check_skips_a_model_its_small_config_leaves_large(monkeypatch):
    """A model whose small config stays large (BLT's sub-configs keep their own sizes: 4.6 billion parameters) is
    skipped on its parameter count, taken on the meta device, before any weights are made; a text sub-config takes
    the small sizes (Emu3's causal LM, built from it, had 8.5 billion)."""
    from fmha.integrations import model_check
    llama = model_check._parameters("llama", model_check.SMALL)
    assert 10_000 < llama < model_check.LARGEST
    assert model_check._parameters("emu3", model_check.SMALL) < 10 * llama
    monkeypatch.setattr(model_check, "LARGEST", llama - 1)
    monkeypatch.setattr(model_check, "_build", lambda *a: pytest.fail("built with weights"))
    [row] = model_check.run(["llama"], DEVICE)
    assert row.verdict == "skipped" and f"{llama / 1e6:.0f}M parameters" in row.note, row


def test_model_check_compiles_the_models_it_checks(monkeypatch):
    """``model-check --compile eager``: SDPA's and fmha's models run under ``torch.compile``; Doge (a window its layers
    do not name) passes, as it did not while a compiled layer lost its window."""
    import fmha.integrations.transformers as fmha_hf
    from fmha.integrations import model_check
    calls = []
    real = fmha_hf.attention_forward

    def counted(*a, **kw):
        calls.append(torch.compiler.is_compiling())
        return real(*a, **kw)
    monkeypatch.setattr(fmha_hf, "attention_forward", counted)  # what check()'s register() registers
    try:
        [row] = model_check.run(["doge"], DEVICE, compile_backend="eager")
    finally:
        monkeypatch.undo()
        fmha_hf.register()
    assert row.verdict == "ok" and row.fmha <= 0.05, row
    assert any(calls), calls  # fmha called while compiling (Doge breaks its graph elsewhere: not every call)


def test_a_training_step_with_attention_dropout_runs_sdpa_said_once(monkeypatch):
    """GPT-2 trains with attention dropout by default (``attn_pdrop=0.1``), which fmha leaves to SDPA: its training
    steps run SDPA, with one warning, and from one seed give SDPA's loss and gradients exactly (they were refused);
    in eval mode (no dropout) fmha runs."""
    import warnings

    import fmha.integrations.transformers as fmha_hf
    cfg = transformers.GPT2Config(vocab_size=101, n_embd=64, n_layer=2, n_head=4, n_positions=64, attn_pdrop=0.1,
                                  resid_pdrop=0.0, embd_pdrop=0.0)
    ref, ours = twins(transformers.GPT2LMHeadModel, cfg)
    ids = torch.randint(3, 101, (2, 21), generator=torch.Generator().manual_seed(26)).to(DEVICE)
    fmha_hf._warned.discard("attention dropout")
    losses = []
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        for model in (ref, ours):
            model.train()
            for _ in range(2):
                torch.manual_seed(5)
                model.zero_grad()
                loss = model(ids, labels=ids).loss
                loss.backward()
            losses.append((loss.item(), [p.grad.clone() for p in model.parameters()]))
    assert losses[0][0] == losses[1][0]
    assert all(torch.equal(a, b) for a, b in zip(losses[0][1], losses[1][1]))
    assert [str(w.message) for w in said if "dropout" in str(w.message)] == [
        "fmha does not take this model's attention dropout: it runs on torch SDPA"]
    calls = []
    real = fmha_hf.fmha.attention
    monkeypatch.setattr(fmha_hf.fmha, "attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    with torch.no_grad():
        ours.eval()
        ours(ids)
    assert len(calls) == 2


def test_a_float32_model_runs_sdpa_said_once(monkeypatch):
    """A model left in float32 (``from_config``'s default) with ``"fmha"``: fmha computes in float16 and bfloat16 and
    refuses float32 rather than round it, so those calls run SDPA, said once, and give SDPA's logits (they raised
    mid-forward); under bf16 autocast fmha runs them."""
    import warnings

    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    cfg = transformers.LlamaConfig(**SMALL)
    torch.manual_seed(0)
    ref, ours = (transformers.LlamaForCausalLM._from_config(copy.deepcopy(cfg), attn_implementation=name)
                 .to(DEVICE).eval() for name in ("sdpa", "fmha"))
    ours.load_state_dict(ref.state_dict())
    ids = torch.randint(3, 101, (2, 21), generator=torch.Generator().manual_seed(27)).to(DEVICE)
    what = "torch.float32 q, k, v (fmha takes float16 and bfloat16: load the model in one, or run under autocast)"
    fmha_hf._warned.discard(what)
    with warnings.catch_warnings(record=True) as said, torch.no_grad():
        warnings.simplefilter("always")
        assert torch.equal(ours(ids).logits, ref(ids).logits)
    assert [str(w.message) for w in said if "float32" in str(w.message)] == [
        f"fmha does not take this model's {what}: it runs on torch SDPA"]
    calls = []
    real = fmha_hf.fmha.attention
    monkeypatch.setattr(fmha_hf.fmha, "attention", lambda *a, **kw: calls.append(a[0].dtype) or real(*a, **kw))
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        ours(ids)
    assert calls == [torch.bfloat16] * cfg.num_hidden_layers


def test_a_layer_saying_not_causal_under_causal_masks_runs_fmha_causal(monkeypatch):
    """BigBird-Pegasus's decoder layers say ``is_causal=False`` while the masks they get are causal (given whole:
    :func:`fmha.integrations.transformers._keeps_is_causal`): the band is read from the mask, so its prefill runs
    fmha causal rather than SDPA with the mask, and the model check still reads ``ok`` against eager."""
    import fmha.integrations.transformers as fmha_hf
    from fmha.integrations import model_check
    fmha_hf.register()
    ran = []
    real_sdpa, real_attention = fmha_hf._sdpa, fmha_hf.fmha.attention
    monkeypatch.setattr(fmha_hf, "_sdpa", lambda *a, **kw: ran.append("sdpa") or real_sdpa(*a, **kw))

    def attention(q, *a, **kw):
        ran.append(("fmha", kw.get("causal"), q.shape[1]))
        return real_attention(q, *a, **kw)
    monkeypatch.setattr(fmha_hf.fmha, "attention", attention)
    model = model_check._build("bigbird_pegasus", "fmha", DEVICE, model_check.SMALL)
    with torch.no_grad():
        model(torch.randint(3, 128, (2, 21), device=DEVICE))
    assert ran == [("fmha", True, 21)] * 2  # two decoder layers, bshd views of 21 rows, causal
    [row] = model_check.run(["bigbird_pegasus"], DEVICE)
    assert row.verdict == "ok", row


def test_model_check_reaches_the_attention_layers_of_hybrids_and_latent_attention(monkeypatch):
    """Hybrids whose two-layer configs hold no attention layer (Qwen3-Next's first is its fourth; Jamba places its own
    by a period and an offset), DeepSeek-V2's latent attention (its KV heads its heads) and BigBird-Pegasus's decoder
    (an encoder-decoder's, whose layers say ``is_causal=False`` under causal masks: the mask function kept its band,
    :func:`fmha.integrations.transformers._keeps_is_causal`; without, fmha ran the prefill unmasked, 0.21 off) and
    DBRX (its sizes under names of its own) are checked, not skipped: each ``ok``, with fmha's attention run in
    each."""
    import fmha.integrations.transformers as fmha_hf
    from fmha.integrations import model_check
    calls = []
    real = fmha_hf.attention_forward

    def counted(module, *args, **kwargs):
        calls.append(type(module).__name__)
        return real(module, *args, **kwargs)
    monkeypatch.setattr(fmha_hf, "attention_forward", counted)
    for model_type in ("qwen3_next", "jamba", "deepseek_v2", "bigbird_pegasus", "dbrx"):
        calls.clear()
        [row] = model_check.run([model_type], DEVICE)
        assert row.verdict == "ok", row
        assert calls, f"{model_type}: fmha never ran"
