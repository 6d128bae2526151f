"""Property-based tests of the rejection step and of logits_to_probs, over extreme distributions.

Deterministic for CI: derandomize=True replays the same examples on every run.
"""
import math

import numpy as np
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specrepro.algorithm.sampling import logits_to_probs
from specrepro.algorithm.speculative import rejection_step

SETTINGS = settings(max_examples=150, deadline=None, derandomize=True)

# weights from 0 to huge, with exact zeros and subnormal-ish tiny values, so rows are near one-hot,
# flat, or carry almost no mass on most tokens
weight = st.one_of(st.just(0.0), st.floats(1e-30, 1e-6), st.floats(1e-6, 1.0), st.floats(1.0, 1e30))


@st.composite
def distribution(draw, vocab):
    kind = draw(st.sampled_from(["random", "one_hot", "tiny_mass", "near_one"]))
    if kind == "one_hot":
        row = np.zeros(vocab)
        row[draw(st.integers(0, vocab - 1))] = 1.0
    elif kind == "tiny_mass":  # one token holds almost all; the rest share 1e-7 or so
        row = np.full(vocab, draw(st.floats(1e-12, 1e-7)) / vocab)
        row[draw(st.integers(0, vocab - 1))] = 1.0
    elif kind == "near_one":  # two tokens, one with probability within float32 round-off of 1
        row = np.zeros(vocab)
        row[draw(st.integers(0, vocab - 1))] = 1.0
        row[draw(st.integers(0, vocab - 1))] += draw(st.floats(1e-9, 1e-6))
    else:
        row = np.array(draw(st.lists(weight, min_size=vocab, max_size=vocab)))
    assume(row.sum() > 0)
    return torch.tensor(row / row.sum(), dtype=torch.float32)


def _ulp_perturbed(row: torch.Tensor, seed: int) -> torch.Tensor:
    """row with every entry moved by at most one float32 ulp (p == q up to round-off)."""
    step = torch.from_numpy(np.random.default_rng(seed).integers(-1, 2, row.shape[0]).astype(np.float32))
    return torch.from_numpy(np.nextafter(row.numpy(), (row + step).numpy())).clamp_min(0)


@st.composite
def speculative_case(draw):
    vocab = draw(st.sampled_from([2, 3, 7, 50, 4096]))
    k = draw(st.integers(0, 4))
    q = torch.stack([draw(distribution(vocab)) for _ in range(k + 1)])
    p_rows = []
    for t in range(k):
        how = draw(st.sampled_from(["independent", "equal", "ulp"]))
        if how == "equal":
            p_rows.append(q[t].clone())
        elif how == "ulp":
            p_rows.append(_ulp_perturbed(q[t], draw(st.integers(0, 2**31))))
        else:
            p_rows.append(draw(distribution(vocab)))
    p = torch.stack(p_rows) if k else torch.zeros(0, vocab)
    # draft tokens are drawn from p: only tokens with p > 0 can occur
    tokens = [draw(st.sampled_from(torch.nonzero(p[t] > 0).flatten().tolist())) for t in range(k)]
    return torch.tensor(tokens, dtype=torch.long), p, q, draw(st.integers(0, 2**32))


@SETTINGS
@given(speculative_case())
def test_rejection_step_emits_a_token_the_target_allows(case):
    tokens, p, q, seed = case
    k = tokens.shape[0]
    for _ in range(3):
        n, token = rejection_step(tokens, p, q, torch.Generator().manual_seed(seed))
        token = int(token)
        assert 0 <= n <= k and 0 <= token < q.shape[1]
        assert q[n, token] > 0, (n, token)  # never a token the target gives probability 0
        if n < k:
            residual = (q[n] - p[n]).clamp_min(0)
            if residual.sum() > 0:  # a rejection samples from (q - p)+ ...
                assert residual[token] > 0
            # ... or, when q == p up to round-off leaves it empty, from q (checked above)
        seed += 1


@SETTINGS
@given(speculative_case())
def test_accept_probability_stays_in_unit_interval(case):
    tokens, p, q, _ = case
    rows = torch.arange(tokens.shape[0])
    p_x, q_x = p[rows, tokens], q[rows, tokens]
    accept = torch.minimum(torch.ones(()), q_x / p_x)
    assert torch.all((accept >= 0) & (accept <= 1)) and not torch.isnan(accept).any()
    # a token with q(x) >= p(x) is always accepted: r * p_x >= q_x never holds for r in [0, 1)
    sure = q_x >= p_x
    if sure.any():
        for seed in range(5):
            n, _ = rejection_step(tokens, p, q, torch.Generator().manual_seed(seed))
            first_unsure = next((i for i in range(len(tokens)) if not sure[i]), len(tokens))
            assert n >= first_unsure


# logits: ordinary, huge (float32 range), -inf (masked by the model), heavy ties
logit = st.one_of(st.floats(-30, 30, width=32), st.floats(allow_nan=False, allow_infinity=False, width=32), st.just(-math.inf),
                  st.sampled_from([0.0, 1.0, 5.0]))


@st.composite
def logits_case(draw):
    vocab = draw(st.integers(1, 64))
    row = draw(st.lists(logit, min_size=vocab, max_size=vocab))
    assume(any(math.isfinite(x) for x in row))  # a row with no finite logit is no distribution at all
    temperature = draw(st.sampled_from([0, 1e-3, 0.3, 0.7, 1.0, 1.5, 10.0]))
    top_k = draw(st.one_of(st.none(), st.integers(1, vocab + 2)))
    top_p = draw(st.one_of(st.none(), st.sampled_from([1e-6, 0.1, 0.5, 0.9, 0.95, 1.0])))
    return torch.tensor(row, dtype=torch.float32), temperature, top_k, top_p


@SETTINGS
@given(logits_case())
def test_logits_to_probs_is_a_proper_distribution(case):
    logits, temperature, top_k, top_p = case
    probs = logits_to_probs(logits, temperature, top_k, top_p)
    assert probs.dtype == torch.float32 and probs.shape == logits.shape
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    assert abs(float(probs.sum()) - 1) <= 1e-5
    assert (probs[logits == -math.inf] == 0).all() or temperature == 0 and logits.max() == -math.inf
    if top_k is not None:
        kth = torch.topk(logits, min(top_k, logits.shape[0])).values[-1]
        assert (probs[logits < kth] == 0).all()  # zero outside the top k (ties at the k-th stay)
    if temperature == 0:
        assert int(probs.argmax()) == int(logits.argmax()) and probs.max() == 1


@SETTINGS
@given(logits_case())
def test_top_p_keeps_the_smallest_prefix_reaching_p(case):
    logits, temperature, _, top_p = case
    assume(temperature > 0 and top_p is not None)
    kept = logits_to_probs(logits, temperature, None, top_p) > 0
    full = logits_to_probs(logits, temperature)
    # every dropped token is no likelier than every kept one, and the kept mass reaches top_p (round-off aside)
    if (~kept).any():
        assert full[~kept].max() <= full[kept].min()
        assert float(full[kept].sum()) >= top_p - 1e-5
