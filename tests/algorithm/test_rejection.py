"""One speculative step alone: the token it emits is distributed exactly as q (Theorem 1).

Family-wise significance 0.01 over the correct cases, Bonferroni-corrected; each wrong step must be
rejected at the same corrected level (the test's power), with fixed seeds so the outcome is fixed.
"""
import pytest
import torch

from specrepro import rejection_step
from specrepro.experiments import wrong as wrong_samplers
from specrepro.algorithm.sampling import sample
from specrepro.stats.exact import chisquare_fit

V = 8
N = 20_000
CASES = ["random", "p_equals_q", "disjoint", "q_one_hot", "p_one_hot", "q_has_zeros"]
ALPHA = 0.01 / len(CASES)


def distributions(case: str):
    g = torch.Generator().manual_seed(CASES.index(case))
    dirichlet = lambda: torch.distributions.Dirichlet(torch.ones(V)).sample()  # noqa: E731
    torch.manual_seed(CASES.index(case))
    p, q = dirichlet(), dirichlet()
    if case == "p_equals_q":
        p = q.clone()
    elif case == "disjoint":
        p = torch.cat([p[:4], torch.zeros(4)])
        q = torch.cat([torch.zeros(4), q[4:]])
    elif case == "q_one_hot":
        q = torch.nn.functional.one_hot(torch.tensor(5), V).float()
    elif case == "p_one_hot":
        p = torch.nn.functional.one_hot(torch.tensor(2), V).float()
    elif case == "q_has_zeros":
        q[[0, 3, 6]] = 0
    return p / p.sum(), q / q.sum(), g


def first_tokens(step, p, q, g, n=N):
    """The first emitted token of n single-draft steps (k = 1)."""
    qq = torch.stack([q, q])  # q at the draft position and at the bonus position
    out = []
    for _ in range(n):
        x = sample(p, g).view(1)
        accepted, nxt = step(x, p.view(1, V), qq, g)
        out.append(int(x) if accepted else int(nxt))
    return out


@pytest.mark.parametrize("case", CASES)
def test_one_step_emits_q(case):
    p, q, g = distributions(case)
    expected = {(i,): float(q[i]) for i in range(V) if q[i] > 0}
    result = chisquare_fit([(t,) for t in first_tokens(rejection_step, p, q, g)], expected)
    assert result.pvalue > ALPHA, result


@pytest.mark.parametrize(
    "wrong", [wrong_samplers.resample_from_q, wrong_samplers.unnormalised_residual, wrong_samplers.accept_ratio_inverted]
)
def test_wrong_steps_are_rejected(wrong):
    p, q, g = distributions("random")
    expected = {(i,): float(q[i]) for i in range(V)}
    result = chisquare_fit([(t,) for t in first_tokens(wrong, p, q, g)], expected)
    assert result.pvalue < ALPHA, result


def test_several_drafts_accept_prefix_and_stop_at_first_rejection():
    # q puts no mass on token 0: a draft of [1, 0, 1] with q(1) >= p(1) keeps exactly one token
    p = torch.tensor([[0.5, 0.5, 0.0]] * 3)
    q = torch.tensor([[0.0, 0.6, 0.4]] * 4)
    n, nxt = rejection_step(torch.tensor([1, 0, 1]), p, q, torch.Generator().manual_seed(0))
    assert n == 1
    assert int(nxt) in (1, 2)  # from (q - p)+ = [0, .1, .4], normalised


def test_all_accepted_samples_bonus_from_last_row():
    p = torch.tensor([[0.0, 1.0, 0.0]] * 2)
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    n, nxt = rejection_step(torch.tensor([1, 1]), p, q, torch.Generator().manual_seed(0))
    assert n == 2 and int(nxt) == 2


def test_no_drafts_is_a_plain_target_sample():
    q = torch.tensor([[0.0, 0.0, 1.0]])
    n, nxt = rejection_step(torch.empty(0, dtype=torch.long), None, q)
    assert n == 0 and int(nxt) == 2


def test_round_off_empty_residual_falls_back_to_q():
    # p slightly above q everywhere it matters (float noise) can reject with an all-zero residual
    q = torch.tensor([[0.5, 0.5], [0.5, 0.5]])
    p = torch.tensor([[0.5 + 1e-7, 0.5 + 1e-7]])
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        n, nxt = rejection_step(torch.tensor([0]), p, q, g)
        assert int(nxt) in (0, 1)


def test_chisquare_fit_flags_impossible_outcomes_and_pools_small_cells():
    from specrepro.stats.exact import chisquare_fit

    expected = {(0,): 0.5, (1,): 0.5, (2,): 0.0}
    assert chisquare_fit([(0,)] * 50 + [(1,)] * 49 + [(2,)], expected).pvalue == 0.0
    assert chisquare_fit([(0,)] * 50 + [(1,)] * 49 + [(3,)], expected).pvalue == 0.0
    fine = chisquare_fit([(0,)] * 50 + [(1,)] * 50, expected)
    assert fine.pvalue == 1.0 and fine.cells == 2
    skewed = {(i,): p for i, p in enumerate([0.6, 0.38, 0.01, 0.01])}
    result = chisquare_fit([(0,)] * 60 + [(1,)] * 38 + [(2,), (3,)], skewed)
    assert result.cells == 2 and result.pvalue > 0.9  # the two 1% cells pooled into the 38% cell


@pytest.mark.parametrize("seed", range(40))
def test_the_greedy_step_keeps_and_emits_what_rejection_step_does_on_one_hot_targets(seed):
    """greedy_step reads the target's logits, rejection_step its one-hot q: the same kept count and next token
    for any draft rows p (one-hot or not), ties in the logits included."""
    from specrepro.algorithm.sampling import logits_to_probs
    from specrepro.algorithm.speculative import greedy_step

    g = torch.Generator().manual_seed(seed)
    k = seed % 5
    logits = torch.randint(0, 3, (k + 1, V), generator=g).float()  # few values: ties between maxima
    best = logits.argmax(-1)
    drafted = torch.where(torch.rand(k, generator=g) < 0.7, best[:k], torch.randint(0, V, (k,), generator=g))
    p = torch.rand(k, V, generator=g) if seed % 2 else torch.nn.functional.one_hot(drafted, V).float()
    p[torch.arange(k), drafted] += 0.1  # each draft token has mass under p, as a drawn one does
    p = p / p.sum(-1, keepdim=True)
    n, token = greedy_step(drafted, logits)
    expected = rejection_step(drafted, p, logits_to_probs(logits, temperature=0), torch.Generator().manual_seed(seed))
    assert (n, int(token)) == (expected[0], int(expected[1]))
