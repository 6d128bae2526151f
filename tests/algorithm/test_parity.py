"""Parity against independent references (minGPT's template): cached vs uncached logits, and greedy
SpS == greedy ArS == HF generate(do_sample=False) token for token, on tiny models and the real target."""
import pytest
import torch

import specrepro as sr
from helpers import EOS, tiny_llama
from specrepro.engines.runners import HFRunner

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarise in one sentence: The council voted on Tuesday to close the old bridge for repairs after "
    "engineers found cracks in two of its supports. Traffic will be diverted for three months.",
]


def chat_ids(tokenizer, text):
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, return_tensors="pt")
    return ids["input_ids"][0] if not isinstance(ids, torch.Tensor) else ids[0]


def cached_logits(model, ids, chunks, rollback_junk=True):
    runner = HFRunner(model)
    rows, start = [], 0
    for size in chunks:
        piece = ids[start : start + size]
        if rollback_junk:  # feed junk past the piece and roll it back, as a rejection does
            runner.forward(torch.cat([piece, piece.flip(0)]))
            runner.rollback(start + size)
            runner.rollback(start)
        rows.append(runner.forward(piece))
        start += size
    return torch.cat(rows)


def test_cached_logits_match_uncached_tiny():
    model = tiny_llama(3, vocab=11, layers=2)
    ids = torch.randint(0, 11, (20,), generator=torch.Generator().manual_seed(0))
    full = model(input_ids=ids[None]).logits[0]
    assert torch.allclose(cached_logits(model, ids, [5, 1, 4, 1, 1, 8]), full, atol=1e-5)


@pytest.mark.slow
def test_cached_logits_match_uncached_smollm(smollm):
    model, tokenizer = smollm
    ids = chat_ids(tokenizer, PROMPTS[0])
    with torch.inference_mode():
        full = model(input_ids=ids[None]).logits[0]
    assert torch.allclose(cached_logits(model, ids, [len(ids) - 6, 1, 3, 2]), full, atol=1e-4)


@pytest.mark.parametrize("k", [1, 2, 4, 7])
def test_greedy_parity_tiny(k):
    target, draft = tiny_llama(0, vocab=23, layers=2), tiny_llama(1, vocab=23)
    prompt = torch.tensor([0, 5, 9])
    ars = sr.autoregressive_generate(target, prompt, max_new_tokens=20, temperature=0)
    sps = sr.speculative_generate(target, draft, prompt, max_new_tokens=20, lookahead=k, temperature=0)
    hf = target.generate(prompt[None], max_new_tokens=20, do_sample=False, pad_token_id=EOS, eos_token_id=None)
    assert ars.tokens.tolist() == sps.tokens.tolist() == hf[0, len(prompt):].tolist()
    assert len(sps.tokens) == 20


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_parity_smollm(smollm, truncated_draft, prompt):
    model, tokenizer = smollm
    ids = chat_ids(tokenizer, prompt)
    eos = tokenizer.eos_token_id
    ars = sr.autoregressive_generate(model, ids, max_new_tokens=32, temperature=0, eos_token_id=eos)
    hf = model.generate(ids[None], max_new_tokens=32, do_sample=False, eos_token_id=eos)[0, len(ids):]
    assert ars.tokens.tolist() == hf.tolist()
    for k in (1, 3, 5):
        sps = sr.speculative_generate(model, truncated_draft, ids, max_new_tokens=32, lookahead=k, temperature=0, eos_token_id=eos)
        assert sps.tokens.tolist() == ars.tokens.tolist(), f"K={k}"
        assert sum(sps.accepted) > 0, "the draft never agreed: the acceptance path went untested"
        assert sps.target_calls < len(sps.tokens) or len(sps.tokens) < 4


@pytest.mark.slow
def test_hf_assisted_generation_accepts_our_draft(smollm, truncated_draft):
    model, tokenizer = smollm
    ids = chat_ids(tokenizer, PROMPTS[1])
    ours = sr.speculative_generate(model, truncated_draft, ids, max_new_tokens=24, lookahead=4, temperature=0)
    hf = model.generate(ids[None], assistant_model=truncated_draft, max_new_tokens=24, do_sample=False)
    assert hf[0, len(ids):].tolist() == ours.tokens.tolist()


def test_same_seed_same_tokens_other_seed_other_tokens():
    target, draft = tiny_llama(0, vocab=50, logit_scale=4), tiny_llama(1, vocab=50, logit_scale=4)
    prompt = torch.tensor([0, 7])
    run = lambda seed, fn, *a: fn(*a, prompt, max_new_tokens=30, generator=torch.Generator().manual_seed(seed)).tokens  # noqa: E731
    for fn, models in ((sr.autoregressive_generate, (target,)), (sr.speculative_generate, (target, draft))):
        assert torch.equal(run(5, fn, *models), run(5, fn, *models))
        assert not torch.equal(run(5, fn, *models), run(6, fn, *models))


def test_stats_are_consistent():
    target, draft = tiny_llama(0, vocab=9), tiny_llama(1, vocab=9)
    gen = sr.speculative_generate(target, draft, torch.tensor([0]), max_new_tokens=40, lookahead=3,
                                  generator=torch.Generator().manual_seed(0))
    assert len(gen.tokens) == 40
    assert len(gen.accepted) == len(gen.proposed) == gen.target_calls == len(gen.loop_seconds)
    assert all(0 <= a <= p <= 3 for a, p in zip(gen.accepted, gen.proposed))
    # every loop emits its accepted drafts plus one token (the last loop may be cut by the budget)
    assert sum(a + 1 for a in gen.accepted) >= len(gen.tokens) > sum(a + 1 for a in gen.accepted[:-1])
    assert gen.draft_calls == sum(gen.proposed)
    assert gen.tau == len(gen.tokens) / gen.target_calls
    # time to first token: the prompt pass plus the first loop, within the whole call
    assert 0 < gen.prefill_seconds < gen.first_token_seconds <= gen.seconds
    assert gen.first_token_seconds == gen.prefill_seconds + gen.loop_seconds[0]


def test_eos_inside_accepted_run_ends_generation():
    # a draft identical to the target accepts everything, so EOS arrives inside an accepted run
    target = tiny_llama(0, vocab=6)
    for seed in range(40):
        gen = sr.speculative_generate(target, target, torch.tensor([0]), max_new_tokens=30, lookahead=7,
                                      eos_token_id=EOS, generator=torch.Generator().manual_seed(seed))
        tokens = gen.tokens.tolist()
        if EOS in tokens:
            assert tokens.index(EOS) == len(tokens) - 1
            if gen.accepted[-1] > 0 and len(tokens) > 1:
                return
    pytest.fail("no run ended with an EOS inside an accepted draft run")


def test_max_new_tokens_is_never_exceeded():
    target, draft = tiny_llama(0, vocab=9), tiny_llama(0, vocab=9)  # same weights: all drafts accepted
    for n in range(0, 12):
        gen = sr.speculative_generate(target, draft, torch.tensor([0, 2]), max_new_tokens=n, lookahead=5)
        assert len(gen.tokens) == n
