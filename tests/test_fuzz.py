"""The fuzzer on the CPU: its problems pass, a wrong kernel is caught, a failure line rebuilds its problem."""
import io
import json
import random

import numpy as np
import pytest
import torch

from conftest import DEVICE
import fmha
from fmha import configs, fuzz, verify
from fmha.kernels.hopper.resources import padded


def test_drawn_problems_pass_and_cover_the_patterns():
    counts = fuzz.fuzz(None, 16, seed=5, device=DEVICE)
    assert counts["run"] == 16 and counts.get("failed", 0) == 0, counts
    assert sum(v for k, v in counts.items() if k.startswith("passed ")) == counts["passed"] >= 12
    drawn = [fuzz.draw(random.Random(s), False, False) for s in range(200)]
    assert {p.pattern for p in drawn} == set(fuzz.PATTERNS) and {p.entry for p in drawn} == {"attention", "varlen",
                                                                                              "paged"}
    assert {p.layout for p in drawn} == set(fuzz.LAYOUTS)
    assert all(p.head_dim_v < p.head_dim for p in drawn if p.head_dim_v)
    assert {p.entry for p in drawn if p.head_dim_v} == {"attention", "varlen", "paged"}
    more = [fuzz.draw(random.Random(s), False, False) for s in range(400)]
    assert {p.grad for p in more} == {"", *fuzz.GRADS} and all(fuzz._takes_grad(p) for p in more if p.grad)


def test_a_wrong_gradient_is_caught(monkeypatch):
    """Backward problems (fast and deterministic) pass; a backward whose dK is 1% too large fails each of them."""
    from fmha import backward
    drawn = [fuzz.draw(random.Random(s), False, False) for s in range(400)]
    grads = [next(p for p in drawn if p.grad == kind) for kind in fuzz.GRADS]
    for p in grads:
        fuzz.run(p, DEVICE)
    real = backward.dense

    def off_by_a_little(*args, **kwargs):
        dq, dk, dv, dsinks, dmask = real(*args, **kwargs)
        return dq, dk * 1.01, dv, dsinks, dmask
    monkeypatch.setattr(backward, "dense", off_by_a_little)
    for p in grads:
        with pytest.raises(AssertionError, match="dk"):
            fuzz.run(p, DEVICE)


def test_problems_with_dropout_pass_and_other_pairs_are_caught(monkeypatch):
    """Backward problems with attention dropout pass against the reference of the pairs the call drew; handed other
    pairs (the drawn ones reversed along the keys), the reference fails them."""
    from fmha.kernels import dropout
    drawn = [fuzz.draw(random.Random(s), False, False) for s in range(800)]
    dropped = [p for p in drawn if p.dropout][:3]
    assert len(dropped) == 3 and all(p.grad for p in dropped)
    for p in dropped:
        fuzz.run(p, DEVICE)
    real = dropout.factors
    monkeypatch.setattr(dropout, "factors", lambda *a: real(*a).flip(-1))
    for p in dropped:
        with pytest.raises(AssertionError):
            fuzz.run(p, DEVICE)


def test_problems_with_sinks_pass_and_wrong_sinks_are_caught(monkeypatch):
    """Problems with attention sinks pass on each entry point, forward and backward (the sinks' gradient against the
    float64 reference's); a backward whose sinks' gradient is 5% off, or a call that drops the sinks, fails them."""
    from fmha import backward
    drawn = [fuzz.draw(random.Random(s), False, False) for s in range(400)]
    forward = [next(p for p in drawn if p.sinks and not p.grad and p.entry == e) for e in ("attention", "varlen",
                                                                                            "paged")]
    grads = [p for p in drawn if p.sinks and p.grad][:2]
    assert len(grads) == 2
    for p in forward + grads:
        fuzz.run(p, DEVICE)
    real = backward.dense

    def off(*args, **kwargs):
        dq, dk, dv, dsinks, dmask = real(*args, **kwargs)
        return dq, dk, dv, dsinks * 1.05, dmask
    monkeypatch.setattr(backward, "dense", off)
    for p in grads:
        with pytest.raises(AssertionError, match="sinks' gradient"):
            fuzz.run(p, DEVICE)
    monkeypatch.undo()
    for name in ("attention", "attention_varlen", "attention_paged"):
        call = getattr(fuzz, name)
        monkeypatch.setattr(fuzz, name, lambda *a, sinks=None, call=call, **kw: call(*a, **kw))
    for p in forward:
        with pytest.raises(AssertionError):
            fuzz.run(p, DEVICE)


def test_problems_with_a_narrower_v_pass():
    """V narrower than q/k (MLA's shapes): O as wide as V, each entry that takes them against float64; the
    seed's one-warp variants refuse them (a ValueError, counted by the fuzzer as refused)."""
    drawn = [fuzz.draw(random.Random(s), False, False) for s in range(400)]
    mla = [p for p in drawn if p.head_dim_v and p.variant in ("auto", "tiled")][:10]
    assert {p.entry for p in mla} == {"attention", "varlen", "paged"}
    for p in mla:
        fuzz.run(p, DEVICE)
    seed = next(p for p in drawn if p.head_dim_v and p.variant == "singlewave" and not p.attn_mask)
    with pytest.raises(ValueError, match="V head dim"):
        fuzz.run(seed, DEVICE)


def test_a_masked_problem_draws_the_config_the_plan_takes():
    """A problem with an attn_mask and a table row draws the row as the plan takes it beside a mask
    (``configs.fit_shared``: ``tiled``'s 128 x 128 row in two stages), not the row itself, whose three stages
    with the mask's tiles would not fit sm_90 (the plan refuses a caller's config there)."""
    drawn = [fuzz.draw(random.Random(s), True, True) for s in range(3000)]
    masked = [p for p in drawn if p.attn_mask and p.config]
    assert any(p.config["block_m"] * p.config["block_n"] >= 128 * 128 for p in masked)
    for p in masked:
        cfg = fmha.KernelConfig(**p.config)
        widths = padded(p.head_dim, 16), fmha.plan.v_tile(p.head_dim, p.head_dim_v or p.head_dim)
        assert configs.fit_shared(cfg, *widths, True) == cfg, p


def test_problems_with_an_attn_mask_pass_and_a_dropped_mask_is_caught(monkeypatch):
    """Problems with a random mask (boolean or a bias) run on ``tiled`` (``auto`` picks it) against float64, forward
    and (some) backward, a bias's gradient too; the seed's one-warp variants refuse them; a call that drops the mask
    fails each of them."""
    drawn = [fuzz.draw(random.Random(s), False, False) for s in range(400)]
    masked = [p for p in drawn if p.attn_mask and not p.grad and p.variant in ("auto", "tiled")][:4]
    masked += [p for p in drawn if p.attn_mask and p.grad][:3]
    assert len(masked) == 7 and sum(bool(p.grad) for p in masked) == 3
    for p in masked:
        fuzz.run(p, DEVICE)
    refused = next(p for p in drawn if p.attn_mask and p.variant == "pipelined")
    with pytest.raises(ValueError, match="attn_mask runs on the tiled variant"):
        fuzz.run(refused, DEVICE)
    real = fuzz.attention
    monkeypatch.setattr(fuzz, "attention", lambda *a, attn_mask=None, **kw: real(*a, **kw))
    for p in masked:
        with pytest.raises(AssertionError):
            fuzz.run(p, DEVICE)


def test_a_wrong_answer_is_reported_as_a_problem_that_rebuilds(monkeypatch):
    real = fuzz.attention

    def off_by_a_little(*args, **kwargs):  # a kernel whose output is 1% too large
        o, lse = real(*args, **kwargs)
        if "out" not in kwargs:  # a backward problem: its gradients follow
            return o * 1.01, lse
        kwargs["out"].mul_(1.01)
        return o, lse

    monkeypatch.setattr(fuzz, "attention", off_by_a_little)
    stream = io.StringIO()
    counts = fuzz.fuzz(None, 12, seed=2, device=DEVICE, stream=stream)
    assert counts.get("failed", 0) >= 2, counts
    assert all(json.loads(line)["problem"]["entry"] == "attention" for line in stream.getvalue().splitlines())
    line = json.loads(stream.getvalue().splitlines()[0])
    problem = fuzz.Problem(**line["problem"])
    assert problem.entry == "attention" and "error" in line["error"] or "non-finite" in line["error"]
    with pytest.raises(AssertionError):
        fuzz.run(problem, DEVICE)
    monkeypatch.setattr(fuzz, "attention", real)
    fuzz.run(problem, DEVICE)  # the right kernel passes the same problem


def test_a_crash_is_reported_and_the_run_goes_on(monkeypatch):
    """A call that raises (a kernel that does not fit the GPU's shared memory, say) is a failed problem whose
    line names the error; the problems after it still run."""
    real = fuzz.run
    calls = []

    def crash_first(p, device):
        calls.append(p)
        if len(calls) == 1:
            raise RuntimeError("out of resource: shared memory")
        return real(p, device)
    monkeypatch.setattr(fuzz, "run", crash_first)
    stream = io.StringIO()
    counts = fuzz.fuzz(None, 3, seed=5, device=DEVICE, stream=stream)
    assert counts["run"] == 3 and counts["failed"] == 1 and len(calls) == 3, counts
    line = json.loads(stream.getvalue())
    assert line["error"] == "RuntimeError: out of resource: shared memory"
    assert str(fuzz.Problem(**line["problem"])) == str(calls[0])


def test_a_gradient_is_judged_against_the_output_the_forward_stored():
    """A problem the CPU fuzzer drew: rising scores with one key 50 high, so each row's probability sits on one
    key and ``dO . (V - O)`` cancels; dQ then follows the forward's O (one bfloat16 unit off where P was rounded
    before P V), times K. Judged against the exactly rounded O it failed (0.64 against a bound of 0.22); against
    the O the forward stored, as every flash backward takes it, it passes (the backward agrees with float64's
    from that O to 0.02). A wrong backward on ordinary problems still fails: ``test_a_wrong_gradient_is_caught``."""
    p = fuzz.Problem(entry="attention", variant="tiled", config=None, dtype="bfloat16", layout="bhsd", batch=1,
                     heads=6, kv_heads=3, seqlen_q=22, seqlen_k=8, head_dim=96, causal=True, align="bottom_right",
                     window=(2, 2), softcap=0.0, alibi=False, seqused=False, num_splits=0, page=16, pattern="rising",
                     seed=787726347, grad="fast")
    fuzz.run(p, DEVICE)


def test_a_gradient_is_judged_with_its_scores_computed_again(monkeypatch):
    """A problem the CPU fuzzer drew: one key about 1000 above the rest in float16, so each row's P sits on it. The
    backward computes the scores again and P from the forward's stored LSE; 1000 summed in another order moves P by
    about 1e-3, and dV (P^T dO) followed: 0.0039 off where PyTorch's autograd, which keeps its P, is exact and one
    unit is 0.0031. The yardstick now holds the same backward in float32 from the stored O and LSE beside PyTorch's,
    and it passes; a dV 1% off still fails."""
    from fmha import backward
    p = fuzz.Problem(entry="attention", variant="tiled", config=dict(
        configs.KernelConfig(64, 32, 4, 2).as_dict()), dtype="float16", layout="hf-view", batch=2, heads=1,
        kv_heads=1, seqlen_q=1, seqlen_k=48, head_dim=192, causal=True, align="bottom_right", window=(-1, -1),
        softcap=0.0, alibi=False, seqused=False, num_splits=0, page=16, pattern="late_spike", seed=331267612,
        grad="deterministic")
    fuzz.run(p, DEVICE)
    real = backward.dense

    def off_by_a_little(*args, **kwargs):
        dq, dk, dv, dsinks, dmask = real(*args, **kwargs)
        return dq, dk, dv * 1.01, dsinks, dmask
    monkeypatch.setattr(backward, "dense", off_by_a_little)
    with pytest.raises(AssertionError, match="dv"):
        fuzz.run(p, DEVICE)



def test_an_lse_whose_scores_cancel_is_judged_by_what_float32_accumulation_costs(monkeypatch):
    """Scores of 1e7 that cancel to tens (``extreme``: one key visible to the first causal rows): float32 sums
    leave a few tenths there in any kernel, which the LSE's yardstick allows (one float32 unit of the row's largest
    ``scale * sum |q k|``); an LSE 1e-2 off on ordinary inputs still fails."""
    fuzz.run(fuzz.Problem(
        entry="paged", variant="tiled", config={"block_m": 128, "block_n": 64, "num_warps": 8, "num_stages": 2},
        dtype="bfloat16", layout="fused-qkv", batch=2, heads=6, kv_heads=3, seqlen_q=32, seqlen_k=30, head_dim=96,
        causal=True, align="top_left", window=(-1, -1), softcap=0.0, alibi=False, seqused=False, num_splits=0,
        page=128, pattern="extreme", seed=3377674), DEVICE)
    real = fmha.api.attention

    def off(*args, **kwargs):
        o, lse = real(*args, **kwargs)
        return o, lse + 1e-2
    monkeypatch.setattr(fuzz, "attention", off)
    with pytest.raises(AssertionError, match="LSE off by"):
        verify.check_lse(torch.tensor([1.0, float("nan")]), np.array([1.0, 2.0]))  # NaN where the reference is finite
    with pytest.raises(AssertionError, match="LSE off by"):
        fuzz.run(fuzz.Problem(
            entry="attention", variant="tiled", config=None, dtype="float16", layout="bhsd", batch=1, heads=2,
            kv_heads=1, seqlen_q=9, seqlen_k=20, head_dim=64, causal=False, align="top_left", window=(-1, -1),
            softcap=0.0, alibi=False, seqused=False, num_splits=0, page=16, pattern="normal", seed=1), DEVICE)
