"""fmha computes no gradients: a call autograd records still runs its forward, and its backward
refuses loudly (eager, torch.compile, the transformers integration), never a silent zero."""
import pytest
import torch

import fmha
from conftest import DEVICE, check_against_reference, make_qkv, packed
from fmha.gradients import MESSAGE

REFUSAL = "fmha computes the attention forward only, without gradients"


def leaves(*tensors):
    return [t.detach().requires_grad_(True) for t in tensors]


@pytest.mark.parametrize("return_lse", [False, True])
def test_attention_output_refuses_its_backward(return_lse):
    q, k, v = leaves(*make_qkv(1, 2, 1, 17, 23, 32, torch.float16))
    result = fmha.attention(q, k, v, causal=True, return_lse=return_lse)
    o = result[0] if return_lse else result
    assert o.requires_grad and o.grad_fn is not None
    if return_lse:
        assert not result[1].requires_grad
    check_against_reference(o, q.detach(), k.detach(), v.detach(), True)  # the forward is still computed
    with pytest.raises(RuntimeError, match=REFUSAL):
        o.float().sum().backward()
    assert q.grad is None and k.grad is None and v.grad is None


def test_only_one_input_requiring_grad_is_enough():
    q, k, v = make_qkv(1, 2, 2, 9, 9, 32, torch.bfloat16)
    (v,) = leaves(v)
    with pytest.raises(RuntimeError, match=REFUSAL):
        fmha.attention(q, k, v).sum().backward()


def test_no_grad_and_inference_need_no_refusal():
    q, k, v = leaves(*make_qkv(1, 2, 2, 9, 9, 32, torch.float16))
    with torch.no_grad():
        assert fmha.attention(q, k, v).grad_fn is None
    with torch.inference_mode():
        assert fmha.attention(q, k, v).grad_fn is None
    plain = make_qkv(1, 2, 2, 9, 9, 32, torch.float16)
    assert fmha.attention(*plain).grad_fn is None


def test_varlen_and_paged_refuse_too():
    (q,), cu = (lambda x, c: ([x.requires_grad_(True)], c))(*packed([5, 7], 2, 32, torch.float16, 0))
    o = fmha.attention_varlen(q, q, q, cu, cu, 7, 7, causal=True)
    with pytest.raises(RuntimeError, match=REFUSAL):
        o.sum().backward()
    pool = torch.randn(2, 16, 2, 32, dtype=torch.float16, device=DEVICE, requires_grad=True)
    table = torch.tensor([[1, 0]], dtype=torch.int32, device=DEVICE)
    o = fmha.attention_paged(q[None, :3], pool, pool, table, torch.tensor([20], dtype=torch.int32, device=DEVICE),
                             layout="bshd")
    with pytest.raises(RuntimeError, match=REFUSAL):
        o.sum().backward()


def test_torch_compile_runs_the_forward_and_refuses_the_backward():
    q, k, v = leaves(*make_qkv(1, 2, 2, 17, 23, 64, torch.bfloat16))

    def block(q, k, v):
        return fmha.attention(q * 1.0, k, v, causal=True).float().sum()

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    loss = compiled(q, k, v)
    with torch.no_grad():
        torch.testing.assert_close(loss, block(q, k, v))
    with pytest.raises(RuntimeError, match=REFUSAL):
        loss.backward()


def test_transformers_training_step_fails_loudly():
    transformers = pytest.importorskip("transformers")
    import fmha.integrations.transformers as fmha_hf
    fmha_hf.register()
    cfg = transformers.LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM._from_config(cfg, attn_implementation="fmha",
                                                       torch_dtype=torch.bfloat16).to(DEVICE).train()
    ids = torch.randint(0, 50, (1, 12), generator=torch.Generator().manual_seed(0)).to(DEVICE)
    loss = model(ids, labels=ids).loss
    assert torch.isfinite(loss)
    with pytest.raises(RuntimeError, match=REFUSAL):
        loss.backward()


def test_message_names_the_alternatives():
    assert "scaled_dot_product_attention" in MESSAGE and "torch.no_grad()" in MESSAGE
