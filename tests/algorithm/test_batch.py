"""Batched SpS: per-row cache lengths give the single-row logits, and greedy rows equal greedy ArS."""
import pytest
import torch

import specrepro as sr
import helpers
from helpers import EOS, tiny_llama
from specrepro.algorithm.sampling import SamplingConfig
from specrepro.stats.exact import chisquare_fit, exact_joint, truncate_outcome
from specrepro.algorithm.batch import batch_rejection_step, speculative_generate_batch
from specrepro.engines.batch import BatchLeanRunner
from specrepro.engines.lean import LeanRunner


def llama(seed, layers=2):
    # peaked distributions (LM head x 4): the draft gets some tokens right
    return helpers.llama(seed, vocab=40, layers=layers, window=256, logit_scale=4)


def test_batch_runner_rows_match_single_runner():
    model = llama(0)
    g = torch.Generator().manual_seed(0)
    seqs = [torch.randint(0, 40, (n,), generator=g) for n in (9, 4, 12)]
    batch = BatchLeanRunner(model, 3, capacity=4)
    padded = torch.zeros(3, 12, dtype=torch.long)
    for b, s in enumerate(seqs):
        padded[b, : len(s)] = s
    batch.forward(padded[:, :3])
    batch.rollback(torch.tensor([2, 3, 1]))  # ragged lengths
    out = batch.forward(torch.stack([padded[0, 2:5], padded[1, 3:6], padded[2, 1:4]]))
    for b, start in enumerate((2, 3, 1)):
        single = LeanRunner(model)
        ref = single.forward(padded[b, : start + 3])[start:]
        torch.testing.assert_close(out[b], ref, atol=1e-5, rtol=1e-5)
    assert batch.lengths.tolist() == [5, 6, 4]


def test_batch_rejection_step_greedy_and_bonus():
    eye = torch.eye(5)
    drafted = torch.tensor([[1, 2], [1, 2]])
    p = eye[drafted]  # one-hot draft rows
    q = torch.stack([eye[[1, 2, 3]], eye[[1, 4, 0]]])  # row 0 agrees on both; row 1 rejects at t=1
    n, nxt = batch_rejection_step(drafted, p, q, torch.Generator().manual_seed(0))
    assert n.tolist() == [2, 1] and nxt.tolist() == [3, 4]


def test_greedy_batch_equals_greedy_ars_per_row():
    target, draft = llama(0), llama(1, layers=1)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, 40, (n,), generator=g) for n in (1, 7, 3)]
    outs = speculative_generate_batch(target, draft, prompts, max_new_tokens=15, lookahead=3, temperature=0)
    for prompt, out in zip(prompts, outs):
        ref = sr.autoregressive_generate(target, prompt, 15, temperature=0)
        assert torch.equal(out.tokens, ref.tokens)
        assert len(out.tokens) == 15 and sum(out.accepted) + out.target_calls >= 15


def test_sampled_batch_runs_with_eos_and_budget():
    target, draft = llama(0), llama(1, layers=1)
    prompts = [torch.tensor([0, 5, 6]), torch.tensor([0])]
    outs = speculative_generate_batch(
        target, draft, prompts, max_new_tokens=12, lookahead=4, eos_token_id=1,
        generator=torch.Generator().manual_seed(0),
    )
    for out in outs:
        assert 1 <= len(out.tokens) <= 12 and int(out.tokens.max()) < 40
        assert 1 not in out.tokens[:-1].tolist()  # generation stops at EOS


def _resample_from_q(drafted, p, q, generator=None):
    """Deliberately wrong: at a rejection, samples from q instead of the normalised (q - p)+."""
    b, k = drafted.shape
    q_x = q[:, :k].gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
    p_x = p.gather(-1, drafted.unsqueeze(-1)).squeeze(-1)
    accept = torch.rand(b, k, generator=generator) * p_x < q_x
    n = accept.long().cumprod(1).sum(1)
    return n, torch.multinomial(q[torch.arange(b), n], 1, generator=generator).squeeze(-1)


BATCH_CONFIGS = [(1, 1.0, None), (3, 1.0, None), (2, 0.7, 3)]  # (lookahead, temperature, top_k)
BATCH_ALPHA = 0.01 / len(BATCH_CONFIGS)


def _batch_fit(k, temperature, top_k, seed, n=4000):
    """Many identical rows in one batch are independent samples: the first two tokens' joint law is q's."""
    target, draft = tiny_llama(0), tiny_llama(1)
    prompt = torch.tensor([0, 3])
    outs = speculative_generate_batch(target, draft, [prompt] * n, max_new_tokens=k + 1, lookahead=k,
                                      temperature=temperature, top_k=top_k, eos_token_id=EOS,
                                      generator=torch.Generator().manual_seed(seed))
    sampling = SamplingConfig(temperature, top_k)
    outcomes = [truncate_outcome(o.tokens, 2, EOS) for o in outs]
    return chisquare_fit(outcomes, exact_joint(target, prompt, 2, sampling, EOS))


@pytest.mark.parametrize("k, temperature, top_k", BATCH_CONFIGS)
def test_sampled_batch_rows_have_the_target_distribution(k, temperature, top_k):
    result = _batch_fit(k, temperature, top_k, seed=k)
    assert result.pvalue > BATCH_ALPHA and result.cells >= 5, result


def test_batch_harness_rejects_a_wrong_rejection_step(monkeypatch):
    import specrepro.algorithm.batch

    monkeypatch.setattr(specrepro.algorithm.batch, "batch_rejection_step", _resample_from_q)
    result = _batch_fit(2, 1.0, None, seed=9)
    assert result.pvalue < BATCH_ALPHA, result
