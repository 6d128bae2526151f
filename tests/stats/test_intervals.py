"""Bootstrap CIs and paired tests (specrepro.stats.intervals), and the Table 1 summary built on them."""
import math

import numpy as np
import pytest

from specrepro.experiments.table1 import code_similarity, summarise_table1
from specrepro.stats.intervals import mean_ci, paired_test, ratio_ci, speedup_ci


def test_mean_ci_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    runs = 300
    hits = 0
    for i in range(runs):
        x = rng.normal(2.0, 1.0, size=40)
        _, lo, hi = mean_ci(x, n_boot=500, seed=i)
        hits += lo <= 2.0 <= hi
    # percentile bootstrap at n = 40 slightly undercovers; a broken interval (too narrow or off-centre) fails
    assert 0.88 <= hits / runs <= 0.99


def test_mean_ci_is_reproducible_and_shrinks_with_more_items():
    rng = np.random.default_rng(1)
    small, large = rng.normal(size=10), rng.normal(size=1000)
    assert mean_ci(small) == mean_ci(small)
    _, lo_s, hi_s = mean_ci(small)
    _, lo_l, hi_l = mean_ci(large)
    assert hi_l - lo_l < (hi_s - lo_s) / 3
    assert math.isnan(mean_ci([1.0])[1]) and math.isnan(mean_ci([])[0])


def test_ratio_and_speedup_resample_items_in_pairs():
    # every item has ratio exactly 2: a paired bootstrap can only ever give 2
    num, den = [2.0, 8.0, 20.0, 4.0], [1.0, 4.0, 10.0, 2.0]
    point, lo, hi = ratio_ci(num, den)
    assert point == lo == hi == pytest.approx(2.0)
    # ArS 30 ms/token and SpS 20 ms/token on every prompt, whatever the prompt lengths: 1.5 exactly
    tokens = [10, 40, 25]
    sp, lo, hi = speedup_ci([0.03 * t for t in tokens], tokens, [0.02 * t for t in tokens], tokens)
    assert sp == pytest.approx(1.5) and lo == pytest.approx(1.5) and hi == pytest.approx(1.5)
    with pytest.raises(ValueError, match="paired"):
        ratio_ci([1, 2], [1])


def test_paired_test_finds_a_shift_and_not_identity():
    rng = np.random.default_rng(2)
    a = rng.normal(size=50)
    same = paired_test(a, a)
    assert same["wilcoxon_p"] == 1.0 and same["mean_difference"] == 0
    shifted = paired_test(a, a + 0.5 + 0.1 * rng.normal(size=50))
    assert shifted["wilcoxon_p"] < 1e-6 and shifted["difference_ci_low"] > 0


def test_code_similarity():
    canonical = "    return sorted(set(l))\n"
    assert code_similarity(canonical, canonical) == 1.0
    assert code_similarity("    x = 1\n    return x + 2\n", canonical) < 0.5


def record(bench, method, item, tokens, seconds, score=None, status=None, similarity=None):
    r = {"benchmark": bench, "decoding": "greedy", "method": method, "item": item, "sample": 0, "tokens": tokens,
         "n_tokens": len(tokens), "loop_seconds": [seconds], "target_calls": len(tokens) if method == "ArS" else 2}
    if score is not None:
        r["score"] = score
    if status is not None:
        r.update(status=status, similarity=similarity)
    return r


def test_table1_summary_has_cis_paired_tests_and_text_identity():
    records = []
    for i in range(6):
        toks = [i, i + 1, i + 2, i + 3]
        records += [record("news", "ArS", f"n{i}", toks, 0.4, score=0.1 * i),
                    record("news", "SpS", f"n{i}", toks, 0.2, score=0.1 * i),
                    record("humaneval", "ArS", f"h{i}", toks, 0.4, status="failed", similarity=0.2 + 0.05 * i),
                    record("humaneval", "SpS", f"h{i}", toks[:3] + [9], 0.2, status="passed" if i == 0 else "failed",
                           similarity=0.2 + 0.05 * i)]
    rows = {(r["benchmark"], r["method"]): r for r in summarise_table1(records, pass_k=(1,))}
    news = rows[("news", "SpS")]
    assert news["speedup"] == pytest.approx(2.0) and news["speedup_ci_low"] == pytest.approx(2.0)
    assert news["identical_text"] == 1.0 and news["quality_wilcoxon_p"] == 1.0 and news["n_items"] == 6
    assert news["result_ci_low"] <= news["result"] <= news["result_ci_high"]
    assert news["tau"] == pytest.approx(2.0)
    code = rows[("humaneval", "SpS")]
    assert code["identical_text"] == 0.0 and code["pass@1"] == pytest.approx(1 / 6)
    assert code["similarity"] == pytest.approx(np.mean([0.2 + 0.05 * i for i in range(6)]))
    assert code["pass_mean_difference"] == pytest.approx(1 / 6) and 0 < code["pass_wilcoxon_p"] <= 1
