"""LeanRunner against the HF reference: logits, hidden states, and whole generations token for token."""
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import specrepro as sr
from specrepro.drafts import ModelDraft
from specrepro.engines import kernels
from specrepro.engines.kernels import unavailable_reason
from specrepro.engines.lean import LeanRunner, attend, causal_mask
from specrepro.engines.runners import HFRunner

from helpers import llama, run_chunks


ONEDNN = pytest.param("onednn", marks=pytest.mark.skipif(
    unavailable_reason("onednn", torch.float32) is not None, reason="no oneDNN in this torch build"))


@pytest.mark.parametrize("backend", ["eager", ONEDNN])
@pytest.mark.parametrize("tied,kv_heads", [(False, 2), (True, 4), (False, 1)])
def test_lean_logits_match_hf_on_tiny_llama(tied, kv_heads, backend):
    model = llama(0, tied=tied, kv_heads=kv_heads)
    ids = torch.randint(0, 50, (30,), generator=torch.Generator().manual_seed(1))
    full = model(ids.view(1, -1)).logits[0]
    # capacity 4: the cache must grow on the way
    lean = LeanRunner(model, capacity=4, keep_hidden=True, backend=backend)
    assert lean.backend == backend
    hf = HFRunner(model, keep_hidden=True)
    for (start, end, lean_logits, lean_hidden), (_, _, hf_logits, hf_hidden) in zip(
        run_chunks(lean, ids), run_chunks(hf, ids)
    ):
        assert lean_logits.dtype == torch.float32 and lean_logits.shape == (end - start, 50)
        torch.testing.assert_close(lean_logits, hf_logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lean_logits, full[start:end], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lean_hidden, hf_hidden, atol=1e-5, rtol=1e-5)
    assert lean.capacity >= 30


def test_compiled_lean_runner_matches_eager():
    """compile=True (torch.compile of the block, dynamic shapes) gives the eager logits through chunks and rollbacks."""
    model = llama(0, kv_heads=2)
    ids = torch.randint(0, 50, (30,), generator=torch.Generator().manual_seed(1))
    eager = run_chunks(LeanRunner(model, capacity=64), ids)
    compiled = run_chunks(LeanRunner(model, capacity=64, compile=True), ids)
    for (_, _, a, _), (_, _, b, _) in zip(eager, compiled):
        torch.testing.assert_close(b, a, atol=1e-4, rtol=1e-4)


def test_linear_with_bias_and_fused_outputs_match_f_linear():
    """A fused Linear of several biased projections returns each projection's F.linear output."""
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(n, 16, generator=g), torch.randn(n, generator=g)) for n in (8, 4, 4)]
    weights[1] = (weights[1][0], None)  # a projection without a bias next to biased ones
    x = torch.randn(5, 16, generator=g)
    for backend in ("eager", "onednn"):
        if unavailable_reason(backend, torch.float32):
            continue
        outs = kernels.Linear(weights, torch.float32, backend)(x)
        assert [o.shape for o in outs] == [(5, 8), (5, 4), (5, 4)]
        for o, (w, b) in zip(outs, weights):
            torch.testing.assert_close(o, torch.nn.functional.linear(x, w, b), atol=1e-5, rtol=1e-5)


def test_inference_linear_packs_once_and_repacks_after_a_weight_update():
    """Drafting runs a draft's linears prepacked; the result is F.linear's, the pack is reused, an in-place
    weight update (a training step) is seen, and with autograd on it is plain F.linear with a gradient."""
    if unavailable_reason("onednn", torch.float32):
        pytest.skip("no oneDNN on this machine: inference_linear is F.linear")
    g = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16, generator=g)
    with torch.inference_mode():
        torch.testing.assert_close(kernels.inference_linear(layer, x), layer(x), atol=1e-5, rtol=1e-5)
        packed = layer._specrepro_packed
        kernels.inference_linear(layer, x)
        assert layer._specrepro_packed is packed  # reused
    with torch.no_grad():
        layer.weight.mul_(2.0)
        torch.testing.assert_close(kernels.inference_linear(layer, x), layer(x), atol=1e-5, rtol=1e-5)
    head = torch.randn(5, 16, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(kernels.inference_linear(layer, x, head), x @ head.T, atol=1e-5, rtol=1e-5)
    y = kernels.inference_linear(layer, x)
    y.sum().backward()
    assert layer.weight.grad is not None


def test_inference_linear_is_f_linear_where_onednn_cannot_serve_the_weight():
    """A weight dtype oneDNN is not wired for (float64) gets F.linear, decided once at (re)pack."""
    g = torch.Generator().manual_seed(1)
    layer = torch.nn.Linear(16, 8).double()
    x = torch.randn(3, 16, generator=g, dtype=torch.float64)
    with torch.inference_mode():
        torch.testing.assert_close(kernels.inference_linear(layer, x), layer(x))
        assert layer._specrepro_packed[2] is None
        torch.testing.assert_close(kernels.inference_linear(layer, x), layer(x))

def test_unavailable_backend_falls_back_to_eager_with_a_warning(monkeypatch):
    monkeypatch.setattr(kernels, "_probe_onednn", lambda dtype: "pretend this CPU has none")
    monkeypatch.setattr(kernels, "_probe_cache", {})
    model = llama(0)
    with pytest.warns(UserWarning, match="onednn.*pretend this CPU has none.*eager"):
        runner = LeanRunner(model, backend="onednn")
    assert runner.backend == "eager"
    ids = torch.tensor([0, 3, 4])
    torch.testing.assert_close(runner.forward(ids), LeanRunner(model).forward(ids))


def test_failing_compile_falls_back_to_eager_with_a_warning(monkeypatch):
    from specrepro.engines import lean

    def broken(*args):
        raise RuntimeError("no C++ compiler")

    model = llama(0)
    runner = LeanRunner(model, compile=True)
    runner._block.fn = broken
    ids = torch.tensor([0, 3, 4])
    with pytest.warns(UserWarning, match="torch.compile.*failed.*no C\\+\\+ compiler"):
        out = runner.forward(ids)
    torch.testing.assert_close(out, LeanRunner(model).forward(ids))
    assert runner._block.fn is lean._block


def test_bad_runner_settings_are_clear_errors():
    model = llama(0)
    with pytest.raises(ValueError, match="unknown linear backend 'mkl'"):
        LeanRunner(model, backend="mkl")
    with pytest.raises(TypeError, match="dtype must be a floating torch.dtype"):
        LeanRunner(model, dtype="bfloat16")
    with pytest.raises(ValueError, match="compile=True needs backend='eager'"):
        LeanRunner(model, compile=True, backend="onednn")


def test_causal_mask_block_over_prefix():
    mask = causal_mask(3, 2, "cpu")
    assert mask.tolist() == [[True, True, True, True, False], [True, True, True, True, True]]
    assert causal_mask(5, 1, "cpu") is None


def test_lean_refuses_non_llama_and_overflow():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=10, n_embd=8, n_layer=1, n_head=2, n_positions=16)).eval()
    with pytest.raises(TypeError, match="Llama"):
        LeanRunner(gpt2)
    runner = LeanRunner(llama(0, window=16))
    runner.forward(torch.zeros(16, dtype=torch.long))
    with pytest.raises(ValueError, match="context window"):
        runner.forward(torch.zeros(1, dtype=torch.long))


def test_lean_bf16_close_to_fp32():
    model = llama(0)
    ids = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(2))
    ref = LeanRunner(model).forward(ids)
    low = LeanRunner(model, dtype=torch.bfloat16).forward(ids)
    assert low.dtype == torch.float32
    assert (low - ref).abs().max() < 0.1 * ref.abs().max()
    assert next(model.parameters()).dtype == torch.float32  # the model itself is untouched


def test_bf16_runner_attends_in_float32_over_a_cache_of_bf16_values():
    """On CPU a bfloat16 runner keeps its cache in float32 (for attend's float32 products), holding the
    keys and values exactly as bfloat16 rounded them; attend matches float64 attention on those values."""
    model = llama(0)
    runner = LeanRunner(model, dtype=torch.bfloat16)
    ids = torch.randint(0, 50, (9,), generator=torch.Generator().manual_seed(4))
    runner.forward(ids)
    cached = runner.k_cache[..., : runner.length, :]
    assert runner.k_cache.dtype == runner.v_cache.dtype == torch.float32
    assert torch.equal(cached, cached.bfloat16().float()) and cached.abs().sum() > 0
    assert LeanRunner(model).k_cache.dtype == torch.float32

    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 3, 8, generator=g).bfloat16()
    k, v = (torch.randn(1, 2, 7, 8, generator=g).bfloat16().float() for _ in range(2))
    mask = causal_mask(4, 3, "cpu")
    out = attend(q, k, v, mask)
    assert out.dtype == torch.bfloat16
    qd, kd, vd = q.double().view(1, 2, 2, 3, 8), k.double().unsqueeze(2), v.double().unsqueeze(2)
    scores = (qd @ kd.transpose(-1, -2)) * 8**-0.5
    want = (torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ vd).view(1, 4, 3, 8)
    torch.testing.assert_close(out.double(), want, atol=1e-2, rtol=1e-2)

@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_generations_with_lean_runners_equal_hf(temperature):
    target, draft = llama(0, layers=2), llama(3, layers=1)
    prompt = torch.tensor([0, 5, 9, 12])
    kw = dict(max_new_tokens=20, temperature=temperature)

    def gen(fn, *models):
        return fn(*models, prompt, generator=torch.Generator().manual_seed(7), **kw)

    ars_hf = gen(sr.autoregressive_generate, target)
    ars_lean = gen(sr.autoregressive_generate, LeanRunner(target))
    assert torch.equal(ars_hf.tokens, ars_lean.tokens)
    sps_hf = gen(sr.speculative_generate, target, draft)
    sps_lean = gen(sr.speculative_generate, LeanRunner(target), ModelDraft(LeanRunner(draft)))
    sps_lean_runner_draft = gen(sr.speculative_generate, LeanRunner(target), LeanRunner(draft))  # via as_draft
    assert torch.equal(sps_hf.tokens, sps_lean.tokens)
    assert torch.equal(sps_hf.tokens, sps_lean_runner_draft.tokens)
    assert sps_hf.accepted == sps_lean.accepted
    if temperature == 0:
        assert torch.equal(sps_lean.tokens, ars_lean.tokens)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", ONEDNN])
def test_lean_matches_hf_on_real_target(smollm, backend):
    model, _ = smollm
    ids = torch.randint(0, model.config.vocab_size, (30,), generator=torch.Generator().manual_seed(0))
    lean, hf = LeanRunner(model, capacity=8, keep_hidden=True, backend=backend), HFRunner(model, keep_hidden=True)
    for (_, _, a, ha), (_, _, b, hb) in zip(run_chunks(lean, ids), run_chunks(hf, ids)):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(ha, hb, atol=1e-4, rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["eager", ONEDNN])
def test_greedy_sps_on_real_target_with_lean_runners(smollm, backend):
    from specrepro.experiments.workloads import truncated_draft

    model, tokenizer = smollm
    draft = truncated_draft(model, 4)
    prompt = tokenizer("def fibonacci(n):", return_tensors="pt").input_ids[0]
    kw = dict(max_new_tokens=16, temperature=0.0)
    ars = sr.autoregressive_generate(model, prompt, **kw)
    hf = model.generate(prompt.view(1, -1), max_new_tokens=16, do_sample=False)[0, prompt.shape[0]:]
    sps_hf = sr.speculative_generate(model, draft, prompt, lookahead=3, **kw)
    target = LeanRunner(model, backend=backend)
    ars_lean = sr.autoregressive_generate(target, prompt, **kw)
    sps_lean = sr.speculative_generate(target, LeanRunner(draft, backend=backend), prompt, lookahead=3, **kw)
    assert torch.equal(ars.tokens, hf)
    assert torch.equal(ars.tokens, ars_lean.tokens)
    assert torch.equal(ars.tokens, sps_hf.tokens)
    assert torch.equal(ars.tokens, sps_lean.tokens)
    assert sps_hf.accepted == sps_lean.accepted


def test_prefill_caches_like_forward():
    model = llama(0, tied=True)
    ids = torch.randint(0, 50, (12,), generator=torch.Generator().manual_seed(3))
    a, b = LeanRunner(model, keep_hidden=True), LeanRunner(model)
    a.prefill(ids[:9])
    assert a.length == 9 and a.hidden.shape == (9, 32)
    torch.testing.assert_close(a.forward(ids[9:]), b.forward(ids)[9:], atol=1e-5, rtol=1e-5)


# ---- FrozenRunner: the one-token step compiled by inductor with frozen weights (specrepro.engines.frozen)
# Compiling takes a minute or two on a 2-core CPU: one runner per dtype, reused by every check below.

@pytest.fixture(scope="module")
def frozen_pair():
    from specrepro.engines.frozen import FrozenRunner

    model = llama(3, vocab=64, tied=True)
    out = {}
    for dtype in (torch.float32, torch.bfloat16):
        out[dtype] = (LeanRunner(model, dtype=dtype, capacity=8), FrozenRunner(model, dtype=dtype, capacity=8))
    return model, out


def _steps(runner, ids, n, rollback_at=None):
    """Prompt, then n greedy one-token steps; at step rollback_at, roll back 3 positions first."""
    runner.reset()
    logits = runner.forward(ids)[-1]
    rows, toks = [], []
    for i in range(n):
        if i == rollback_at:
            runner.rollback(runner.length - 3)
        tok = int(torch.argmax(logits))
        toks.append(tok)
        logits = runner.forward(torch.tensor([tok]))[-1]
        rows.append(logits)
    return torch.stack(rows), toks


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_frozen_one_token_step_matches_the_eager_runner(frozen_pair, dtype, tol):
    """Every one-token pass within the dtype's round-off of the eager runner; greedy tokens equal; the cache
    grows past its capacity (a recompile) and a rollback leaves stale slots the mask must hide."""
    import warnings

    _, pairs = frozen_pair
    lean, frozen = pairs[dtype]
    ids = torch.tensor([0, 5, 9, 33, 2, 17])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no fallback to eager
        got, got_toks = _steps(frozen, ids, 14, rollback_at=7)
    want, want_toks = _steps(lean, ids, 14, rollback_at=7)
    assert frozen.capacity > 8 and frozen.compile_seconds is not None and not frozen._failed
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    if dtype == torch.float32:
        assert got_toks == want_toks


def test_frozen_step_hides_stale_slots_after_rollback(frozen_pair):
    """The deliberately wrong case the mask guards: stale keys after a rollback change the logits if read."""
    model, pairs = frozen_pair
    _, frozen = pairs[torch.float32]
    fresh = LeanRunner(model, dtype=torch.float32)
    frozen.reset()
    frozen.forward(torch.tensor([0, 5, 9, 33, 2, 17, 40, 41]))
    frozen.rollback(5)
    got = frozen.forward(torch.tensor([12]))
    fresh.forward(torch.tensor([0, 5, 9, 33, 2]))
    want = fresh.forward(torch.tensor([12]))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the same step with the stale slots visible (all 9 cached positions): clearly different logits
    fresh.reset()
    fresh.forward(torch.tensor([0, 5, 9, 33, 2, 17, 40, 41]))
    assert (fresh.forward(torch.tensor([12])) - want).abs().max() > 1e-3


def test_greedy_sps_with_a_frozen_target_equals_ars(frozen_pair):
    from specrepro.drafts.lookup import LookupDraft

    _, pairs = frozen_pair
    lean, frozen = pairs[torch.float32]
    ids = torch.tensor([0, 5, 9, 33, 5, 9, 33, 5])
    ars = sr.autoregressive_generate(lean, ids, 12, temperature=0)
    sps = sr.speculative_generate(frozen, LookupDraft(64), ids, 12, lookahead=3, temperature=0)
    assert torch.equal(ars.tokens, sps.tokens)


def test_frozen_runner_refuses_bias_projections():
    from specrepro.engines.frozen import FrozenRunner

    model = llama(0)
    model.model.layers[0].self_attn.q_proj.bias = torch.nn.Parameter(torch.zeros(32))
    with pytest.raises(TypeError, match="bias-free"):
        FrozenRunner(model)


def tiny_family(name, **kw):
    """A tiny random model of a transformers family with Llama's module names (2 heads of 8, 1 kv head)."""
    import transformers

    config = getattr(transformers, f"{name}Config")(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, pad_token_id=0, bos_token_id=0, eos_token_id=1, **kw)
    torch.manual_seed(0)
    return getattr(transformers, f"{name}ForCausalLM")(config).eval()


@pytest.mark.parametrize("name,kw,why", [
    ("Granite", {}, r"attention scores scaled by 1, not 1/sqrt\(8\)"),  # Granite's attention_multiplier
    ("Granite", dict(attention_multiplier=8 ** -0.5, embedding_multiplier=12.0), "embedding_multiplier = 12.0"),
    ("Granite", dict(attention_multiplier=8 ** -0.5, residual_multiplier=0.22), "residual_multiplier = 0.22"),
    ("Granite", dict(attention_multiplier=8 ** -0.5, logits_scaling=8.0), "logits_scaling = 8.0"),
    ("StableLm", {}, r"partial RoPE \(partial_rotary_factor = 0.25\)"),
    ("StableLm", dict(partial_rotary_factor=1.0), r"the final norm \(LayerNorm\) has a bias"),
    ("Cohere", {}, r"layer 0 has no post-attention norm \(a parallel residual\)"),
    ("Olmo", {}, r"the final norm \(OlmoLayerNorm\) has no weight of size 16"),
    ("Qwen3", {}, "layer 0 has modules the runner does not compute: k_norm, q_norm"),
])
def test_llama_lookalikes_the_runner_cannot_compute_exactly_are_refused_with_the_reason(name, kw, why):
    from specrepro.engines.lean import is_llama_like, llama_like_reason

    model = tiny_family(name, **kw)
    assert not is_llama_like(model)
    assert llama_like_reason(model) is not None and __import__("re").search(why, llama_like_reason(model))
    with pytest.raises(TypeError, match=why):
        LeanRunner(model)


@pytest.mark.parametrize("name,kw", [("Llama", {}), ("Qwen2", {}), ("Granite", dict(attention_multiplier=8 ** -0.5))])
def test_what_the_check_accepts_the_runner_computes_as_hf_does(name, kw):
    """A Granite whose multipliers are all 1 (attention 1/sqrt(head size)) is a Llama, and is accepted: its logits
    match HF's, as the refused variants' would not."""
    model = tiny_family(name, **kw)
    ids = torch.randint(0, 32, (12,), generator=torch.Generator().manual_seed(1))
    want = model(ids.view(1, -1)).logits[0]
    torch.testing.assert_close(LeanRunner(model).forward(ids), want, rtol=1e-4, atol=1e-4)
    if name == "Granite":  # the same weights with Granite's default attention multiplier (1): other logits
        other = tiny_family(name)
        assert not torch.allclose(other(ids.view(1, -1)).logits[0], want, atol=1e-3)
