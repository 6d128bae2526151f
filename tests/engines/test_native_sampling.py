"""The native module's one-call draw (native.cpp nucleus_sample, reached through sampling.native_draw and
SamplingConfig.draw): the token sample() takes from logits_to_probs' row at the same uniform, its distribution,
and the errors bad rows get."""
import math

import pytest
import torch

from specrepro.algorithm.sampling import SamplingConfig, logits_to_probs, native_draw, sample
from specrepro.engines import native

REASON = native.unavailable_reason(torch.bfloat16, "cpu")
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no native build here: {REASON}")


@pytest.fixture(scope="module")
def module():
    return native.load()


def rows(seed, n, vocab=3000):
    """Peaked, spread and flat rows (a flat row's nucleus outgrows the 64-token head many times over), some with
    masked (-inf) tokens."""
    g = torch.Generator().manual_seed(seed)
    for i in range(n):
        logits = torch.randn(vocab, generator=g) * [0.05, 1.0, 3.0, 8.0][i % 4]
        if i % 5 == 0:
            logits[torch.randperm(vocab, generator=g)[: vocab // 3]] = -math.inf
        yield i, logits


@pytest.mark.parametrize("temperature,top_p", [(1.0, 0.8), (0.7, 0.95), (1.3, 0.5), (1.0, 1.0), (0.4, 1.0),
                                               (1e-3, 0.9)])
def test_the_nucleus_kernel_takes_the_token_sample_takes(module, temperature, top_p):
    """From generators in the same state: the same token as sample(logits_to_probs(...)) on all but rows where a
    mass lies within float32 rounding of top_p or of the uniform (at most 1 in 100), and the same generator state
    after (one float64 uniform each). T = 1e-3 overflows float32 (the row is shifted first, as _tempered does)."""
    same = total = 0
    for i, logits in rows(7, 400):
        a, b = torch.Generator().manual_seed(i), torch.Generator().manual_seed(i)
        drawn = native_draw(logits, temperature, top_p, a)
        expected = sample(logits_to_probs(logits, temperature, None, top_p if top_p < 1 else None), b)
        assert drawn.shape == () and drawn.dtype == torch.long
        assert torch.equal(a.get_state(), b.get_state())
        same += int(drawn) == int(expected)
        total += 1
    assert same >= 0.99 * total, (same, total)


def test_the_nucleus_kernel_draws_the_nucleus_and_a_wrong_one_is_rejected(module):
    """Frequencies on one row follow logits_to_probs (chi-square over the kept tokens, alpha 0.01 / 4 for the four
    checks), nothing outside the nucleus is drawn; the same check rejects draws at a slightly wrong temperature.
    Then a nucleus of hundreds of tokens (past the first and second heads), and the whole row at top_p 1."""
    from scipy.stats import chisquare

    alpha, n = 0.01 / 4, 20000

    def counts(logits, temperature, top_p, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.bincount(torch.stack([native_draw(logits, temperature, top_p, g) for _ in range(n)]),
                              minlength=logits.shape[0]).double()

    def pvalue(seen, q, inside=True):
        cells = q > 0
        assert seen[~cells].sum() == 0 or not inside
        expected = q[cells].double() / q[cells].double().sum() * float(seen[cells].sum())
        return chisquare(seen[cells].numpy(), expected.numpy()).pvalue

    logits = torch.randn(500, generator=torch.Generator().manual_seed(1)) * 2.5
    q = logits_to_probs(logits, 0.9, None, 0.8)
    assert 1 < int((q > 0).sum()) < 64
    assert pvalue(counts(logits, 0.9, 0.8, 2), q) > alpha
    # drawn at T = 1.05, compared on T = 0.9's nucleus (scaled to the draws that fell there)
    assert pvalue(counts(logits, 1.05, 0.8, 3), q, inside=False) < alpha
    wide = torch.randn(2000, generator=torch.Generator().manual_seed(4)) * 0.3
    q = logits_to_probs(wide, 1.0, None, 0.4)
    assert int((q > 0).sum()) > 256
    # few draws a cell here: the cells are pooled into 40 bins of the CDF so each expects ~25+
    seen, cells = counts(wide, 1.0, 0.4, 5), q > 0
    bins = torch.arange(int(cells.sum())) * 40 // int(cells.sum())
    observed = torch.zeros(40, dtype=torch.float64).index_add_(0, bins, seen[cells])
    expected = torch.zeros(40, dtype=torch.float64).index_add_(0, bins, q[cells].double() / q[cells].sum() * n)
    assert seen[~cells].sum() == 0 and chisquare(observed.numpy(), expected.numpy()).pvalue > alpha
    small = torch.randn(50, generator=torch.Generator().manual_seed(6))
    assert pvalue(counts(small, 1.0, 1.0, 7), logits_to_probs(small, 1.0)) > alpha


def test_the_nucleus_kernel_at_the_edges(module):
    """u just below 1 takes the last token with mass (never a masked one after it); a one-hot row gives its token;
    one token alone; a tie keeps the lower index first."""
    logits = torch.tensor([0.0, 1.0, 2.0, -math.inf, -math.inf])
    assert module.nucleus_sample(logits, 1.0, 1.0, 1 - 2 ** -53) == 2
    assert module.nucleus_sample(logits, 1.0, 0.5, 1 - 2 ** -53) == 2
    assert module.nucleus_sample(torch.tensor([-math.inf, 5.0, -math.inf]), 1.0, 0.9, 0.7) == 1
    assert module.nucleus_sample(torch.tensor([3.0]), 2.0, 0.3, 0.5) == 0
    tie = torch.tensor([1.0, 4.0, 4.0, 0.0])  # top_p small: only the first of the tied top tokens stays
    assert {module.nucleus_sample(tie, 1.0, 0.01, u) for u in (0.0, 0.5, 0.99)} == {1}


@pytest.mark.parametrize("logits,args,message", [
    (torch.full((8,), float("nan")), (1.0, 0.9, 0.5), "NaN"),
    (torch.tensor([1.0, float("nan"), 0.5]), (1.0, 0.9, 0.5), "NaN"),
    (torch.full((8,), -math.inf), (1.0, 0.9, 0.5), "finite maximum"),
    (torch.tensor([1.0, math.inf]), (1.0, 0.9, 0.5), "finite maximum"),
    (torch.zeros(2, 8), (1.0, 0.9, 0.5), "one non-empty row"),
    (torch.zeros(0), (1.0, 0.9, 0.5), "one non-empty row"),
    (torch.zeros(8, dtype=torch.float64), (1.0, 0.9, 0.5), "float32"),
    (torch.zeros(8), (0.0, 0.9, 0.5), "temperature"),
    (torch.zeros(8), (1.0, 0.0, 0.5), "top_p"),
    (torch.zeros(8), (1.0, 0.9, 1.0), "u must be"),
])
def test_the_nucleus_kernel_refuses_bad_rows(module, logits, args, message):
    with pytest.raises(RuntimeError, match=message):
        module.nucleus_sample(logits, *args)


def test_draw_goes_through_the_kernel_once_the_module_is_loaded(module, monkeypatch):
    """SamplingConfig.draw without top-k: the kernel's token (its uniform) once the module is loaded, the torch
    path where it is not; top-k and greedy never reach it; a CUDA-side generator or row is left to torch."""
    calls = []
    real = module.nucleus_sample

    class Spy:
        def nucleus_sample(self, *args):
            calls.append(args[1:3])
            return real(*args)

    monkeypatch.setattr(native, "loaded", lambda: Spy())
    logits = torch.randn(1000, generator=torch.Generator().manual_seed(3)) * 2
    for cfg in (SamplingConfig(0.8, None, 0.9), SamplingConfig(1.0)):
        a, b = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
        assert int(cfg.draw(logits, a)) == int(native_draw(logits, cfg.temperature, cfg.top_p or 1.0, b))
    assert calls == [(0.8, 0.9), (0.8, 0.9), (1.0, 1.0), (1.0, 1.0)]
    SamplingConfig(0.8, 5, 0.9).draw(logits, torch.Generator().manual_seed(0))
    SamplingConfig(0.0).draw(logits)
    assert len(calls) == 4
    monkeypatch.setattr(native, "loaded", lambda: None)
    assert native_draw(logits, 1.0, 0.9) is None
