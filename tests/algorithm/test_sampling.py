import math

import pytest
import torch

from specrepro.algorithm.sampling import SamplingConfig, logits_to_probs, sample


def test_temperature_one_is_softmax():
    logits = torch.randn(3, 11)
    assert torch.allclose(logits_to_probs(logits), logits.softmax(-1), atol=1e-6)


def test_temperature_scales_logits():
    logits = torch.randn(11)
    assert torch.allclose(logits_to_probs(logits, temperature=0.5), (logits / 0.5).softmax(-1), atol=1e-6)


def test_greedy_is_one_hot_at_argmax():
    logits = torch.tensor([[0.1, 2.0, -1.0], [3.0, 3.0, 0.0]])
    probs = logits_to_probs(logits, temperature=0)
    assert probs.tolist() == [[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]  # first index wins a tie


def test_top_k_keeps_k_largest_renormalised():
    logits = torch.tensor([1.0, 4.0, 3.0, 2.0, 0.0])
    probs = logits_to_probs(logits, top_k=2)
    expected = torch.zeros(5)
    expected[[1, 2]] = torch.tensor([4.0, 3.0]).softmax(-1)
    assert torch.allclose(probs, expected, atol=1e-6)


def test_top_p_keeps_smallest_set_reaching_p():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs_in.log()
    # cumulative mass before each token: 0, .5, .8, .95 -> keep tokens 0, 1 at top_p=0.8 (mass .8 reached)
    assert (logits_to_probs(logits, top_p=0.8) > 0).tolist() == [True, True, False, False]
    assert (logits_to_probs(logits, top_p=0.81) > 0).tolist() == [True, True, True, False]
    kept = logits_to_probs(logits, top_p=0.81)
    assert torch.allclose(kept[:3], probs_in[:3] / probs_in[:3].sum(), atol=1e-6)


def test_top_p_always_keeps_the_top_token():
    logits = torch.tensor([[0.0, 5.0, 1.0]])
    assert logits_to_probs(logits, top_p=1e-9).tolist() == [[0.0, 1.0, 0.0]]


def test_top_p_handles_rows_independently_and_unsorted_input():
    logits = torch.tensor([[0.0, 2.0, 1.0], [2.0, 0.0, 1.0]])
    kept = logits_to_probs(logits, top_p=0.5) > 0
    assert kept.tolist() == [[False, True, False], [True, False, False]]


def test_top_k_then_top_p_as_hf_orders_them():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0])
    probs = logits_to_probs(logits, temperature=2.0, top_k=3, top_p=0.6)
    scaled = (logits[:3] / 2.0).softmax(-1)  # after temperature and top-k: ~.51, .31, .19
    assert (probs > 0).tolist() == [True, True, False, False]
    assert math.isclose(probs.sum().item(), 1.0, rel_tol=1e-6)
    assert torch.allclose(probs[:2], scaled[:2] / scaled[:2].sum(), atol=1e-6)


def test_probs_are_float32_from_half_logits():
    assert logits_to_probs(torch.randn(7, dtype=torch.bfloat16)).dtype == torch.float32


def test_sample_is_reproducible_with_generator():
    probs = torch.rand(4, 100).softmax(-1)
    a = sample(probs, torch.Generator().manual_seed(7))
    b = sample(probs, torch.Generator().manual_seed(7))
    assert a.shape == (4,) and torch.equal(a, b)


def test_sample_never_picks_zero_probability():
    probs = torch.tensor([0.0, 0.5, 0.0, 0.5]).expand(2000, 4)
    assert set(sample(probs, torch.Generator().manual_seed(0)).tolist()) == {1, 3}


def test_sample_matches_the_distribution_and_handles_edges():
    """Inverse-CDF sampling: frequencies follow p (chi-square, alpha 0.001), a one-hot row gives its token,
    zero-mass tokens at either end are never drawn, and batch shapes are kept."""
    from scipy.stats import chisquare

    g = torch.Generator().manual_seed(3)
    p = torch.tensor([0.0, 0.05, 0.0, 0.15, 0.3, 0.5, 0.0])
    counts = torch.bincount(sample(p.expand(40000, 7), g), minlength=7)
    assert counts[[0, 2, 6]].sum() == 0
    nonzero = p > 0
    assert chisquare(counts[nonzero].numpy(), (p[nonzero] * 40000).numpy()).pvalue > 0.001
    one_hot = torch.nn.functional.one_hot(torch.tensor([5, 49151, 0]), 49152).float()
    assert sample(one_hot, g).tolist() == [5, 49151, 0]
    assert sample(torch.rand(2, 3, 10).softmax(-1), g).shape == (2, 3)
    # unnormalised rows are sampled in proportion to their mass
    twice = torch.tensor([0.0, 2.0, 6.0])
    counts = torch.bincount(sample(twice.expand(20000, 3), g), minlength=3)
    assert counts[0] == 0 and abs(counts[2] / 20000 - 0.75) < 0.02


def _long_row_distribution() -> torch.Tensor:
    """1,000 tokens with mass at both ends, in runs and alone, and a flat stretch."""
    p = torch.zeros(1000)
    p[[0, 254, 255, 256, 257, 511, 768, 990, 999]] = torch.tensor([1.0, 2.0, 3.0, 3.0, 2.0, 1.0, 2.0, 1.0, 5.0])
    p[300:400] = 0.02  # a flat stretch
    return p / p.sum()


def test_sample_on_a_long_row_matches_the_distribution_and_a_wrong_one_is_rejected():
    """Over 1,000 tokens: frequencies follow p (chi-square over the cells with mass, alpha 0.01 / 2 for the two
    checks), zero-mass tokens are never drawn; the same check rejects draws from a p with token 255's mass moved
    to its neighbour 256, what an inverse CDF off by one would draw."""
    from scipy.stats import chisquare

    p, n, alpha = _long_row_distribution(), 60000, 0.01 / 2
    cells = p > 0
    expected = (p[cells].double() / p[cells].double().sum() * n).numpy()

    def counts_of(dist, seed):
        g = torch.Generator().manual_seed(seed)
        draws = torch.cat([sample(dist.expand(3000, 1000), g) for _ in range(n // 3000)])
        return torch.bincount(draws, minlength=1000).double()

    counts = counts_of(p, 11)
    assert counts[p == 0].sum() == 0
    assert chisquare(counts[cells].numpy(), expected).pvalue > alpha
    wrong = p.clone()
    wrong[256] += wrong[255]
    wrong[255] = 0
    assert chisquare(counts_of(wrong, 12)[cells].numpy(), expected).pvalue < alpha


def test_sample_at_a_cumulative_edge_takes_the_first_token_above_u(monkeypatch):
    """u * total exactly at a token's cumulative mass: the first token whose mass ends above it; u rounded onto
    the total: the last token with mass, even with hundreds of empty tokens after it; u = 0: the first with mass."""
    p = torch.zeros(700)
    p[[255, 256]] = 0.5
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full((a[0], a[1]), 0.5, dtype=torch.float64))
    assert sample(p).tolist() == 256
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(a[0], a[1], dtype=torch.float64))
    assert sample(p).tolist() == 256
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(a[0], a[1], dtype=torch.float64))
    assert sample(p).tolist() == 255


def test_sample_when_u_times_total_rounds_onto_the_total(monkeypatch):
    """A uniform so close to 1 that u * total is the total: the last token with mass, not one past it."""
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(a[0], a[1], dtype=torch.float64))
    assert sample(torch.tensor([0.2, 0.8, 0.0, 0.0])).tolist() == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(temperature=float("inf")), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=-0.2), "top_p"),
    ],
)
def test_bad_sampling_settings_name_the_problem(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


def _top_p_by_full_sort(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """The nucleus the textbook way: sort every row, drop a token once the mass before it reaches top_p."""
    probs = logits.softmax(-1)
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    drop_sorted = (ordered.cumsum(-1) - ordered) >= top_p
    drop_sorted[..., 0] = False
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


@pytest.mark.parametrize("scale", [0.05, 1.0, 4.0, 20.0])  # near-uniform rows need the head to grow
@pytest.mark.parametrize("top_p", [1e-6, 0.5, 0.8, 0.95, 0.999, 1 - 1e-9])
def test_top_p_from_the_head_equals_a_full_sort(scale, top_p):
    gen = torch.Generator().manual_seed(int(scale * 100) + int(top_p * 1000))
    logits = torch.randn(6, 5000, generator=gen) * scale
    logits[2] *= 0.01  # one flat row in a batch of peaked ones: only it needs a long head
    probs = logits_to_probs(logits, top_p=top_p)
    assert torch.equal(probs > 0, ~_top_p_by_full_sort(logits, top_p))
    assert torch.allclose(probs.sum(-1), torch.ones(6), atol=1e-5)


def test_top_p_mask_is_per_row_whatever_the_batch():
    """A row's nucleus does not depend on the rows beside it (the head grows for the whole batch)."""
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 3000, generator=gen) * torch.tensor([[8.0], [0.01], [2.0], [30.0]])
    batch = logits_to_probs(logits, temperature=0.8, top_p=0.95)
    for i in range(4):
        assert torch.equal(batch[i], logits_to_probs(logits[i], temperature=0.8, top_p=0.95))


DRAW_CONFIGS = [SamplingConfig(1.0, None, 0.8), SamplingConfig(0.7, None, 0.95), SamplingConfig(1.3, None, 0.5),
                SamplingConfig(1.0), SamplingConfig(0.8, 5, 0.9), SamplingConfig(0.0)]


@pytest.fixture
def torch_draw(monkeypatch):
    """draw's torch path, whether or not an earlier test in this process loaded the native module (whose one-call
    draw, tests/engines/test_native_sampling.py, agrees but for float32 rounding at a boundary)."""
    from specrepro.engines import native

    monkeypatch.setattr(native, "loaded", lambda: None)


@pytest.mark.parametrize("cfg", DRAW_CONFIGS, ids=str)
def test_draw_takes_the_token_sample_takes_from_the_same_uniform(cfg, torch_draw):
    """draw(logits) and sample(probs(logits)) from generators in the same state: the same token on every row,
    peaked and flat (a flat row's nucleus outgrows the 64-token head and goes through probs), and the two
    generators end in the same state (one uniform each, none for greedy)."""
    g = torch.Generator().manual_seed(5)
    for i in range(300):
        scale = [0.05, 1.0, 3.0, 8.0][i % 4]
        logits = torch.randn(3000, generator=g) * scale
        a, b = torch.Generator().manual_seed(i), torch.Generator().manual_seed(i)
        drawn = cfg.draw(logits, a)
        expected = logits.argmax() if cfg.greedy else sample(cfg.probs(logits), b)
        assert drawn.shape == () and int(drawn) == int(expected), (i, scale)
        assert torch.equal(a.get_state(), b.get_state())


def test_nucleus_draw_matches_the_nucleus_and_a_wrong_one_is_rejected(torch_draw):
    """Frequencies of nucleus_draw on one row follow probs() (chi-square over the kept tokens, alpha 0.01 / 2),
    nothing outside the nucleus is drawn; the same check rejects draws made at a slightly wrong temperature."""
    from scipy.stats import chisquare

    from specrepro.algorithm.sampling import nucleus_draw

    logits = torch.randn(500, generator=torch.Generator().manual_seed(1)) * 2.5
    q = logits_to_probs(logits, top_p=0.8)
    kept = q > 0
    n, alpha = 20000, 0.01 / 2
    g = torch.Generator().manual_seed(2)
    counts = torch.bincount(torch.stack([nucleus_draw(logits, 1.0, 0.8, g) for _ in range(n)]), minlength=500)
    assert counts[~kept].sum() == 0 and 1 < int(kept.sum()) < 64
    expected = (q[kept].double() / q[kept].double().sum() * n).numpy()
    assert chisquare(counts[kept].double().numpy(), expected).pvalue > alpha
    # a draw at temperature 1.15 instead of 1 (compared on the same cells, scaled to its draws there)
    off = SamplingConfig(1.15, None, 0.8)
    wrong = torch.bincount(torch.stack([off.draw(logits, g) for _ in range(n)]), minlength=500)
    seen = wrong[kept].double()
    assert chisquare(seen.numpy(), expected * float(seen.sum()) / n).pvalue < alpha
