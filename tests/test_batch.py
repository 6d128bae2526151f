"""Batched SpS: per-row cache lengths give the single-row logits, and greedy rows equal greedy ArS."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import specrepro as sr
from specrepro.batch import BatchLeanRunner, batch_rejection_step, speculative_generate_batch
from specrepro.lean import LeanRunner


def llama(seed, layers=2):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=0, eos_token_id=1, pad_token_id=1,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(4)  # peaked distributions: the draft gets some tokens right
    return model


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


def test_sampled_batch_rows_have_the_target_distribution():
    """Many identical rows in one batch are independent samples: the first two tokens' joint law is q's."""
    from scipy.stats import chisquare

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=5, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    target, draft = LlamaForCausalLM(config).eval(), LlamaForCausalLM(config).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(6)
        draft.lm_head.weight.mul_(6)
    prompt = torch.tensor([0, 3])
    n = 4000
    outs = speculative_generate_batch(target, draft, [prompt] * n, max_new_tokens=2, lookahead=2,
                                      generator=torch.Generator().manual_seed(0))
    pairs = torch.stack([o.tokens for o in outs])
    observed = torch.bincount(pairs[:, 0] * 5 + pairs[:, 1], minlength=25).double()
    with torch.no_grad():
        q1 = target(prompt.view(1, -1)).logits[0, -1].softmax(-1)
        q2 = torch.stack([target(torch.cat([prompt, torch.tensor([t])]).view(1, -1)).logits[0, -1].softmax(-1)
                          for t in range(5)])
    expected = (q1.view(5, 1) * q2).flatten().double() * n
    keep = expected > 5
    obs, exp = observed[keep], expected[keep]
    assert chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
