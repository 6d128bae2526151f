"""tree_tau's summary: tau per setting with a bootstrap interval over prompts, and each setting's tau over the
best chain's, paired over the prompts both ran (synthetic records: the numbers are known)."""
import math

import pytest

from specrepro.experiments.tree_tau import summarise


def records(setting, per_item, nodes=1, draft="lookup", task="news", temperature=0.0):
    return [{"draft": draft, "task": task, "temperature": temperature, "setting": setting, "nodes": nodes,
             "item": f"p{i}", "tokens": tokens, "target_calls": calls} for i, (tokens, calls) in enumerate(per_item)]


def test_tau_best_chain_and_paired_ratio():
    chain2 = records("chain K=2", [(60, 40), (60, 30), (60, 50)])  # tau 180 / 120 = 1.5
    chain4 = records("chain K=4", [(60, 30), (60, 20), (60, 40)])  # tau 2.0, the best chain
    tree = records("tree 3x4", [(60, 20), (60, 20), (60, 20)], nodes=30)  # tau 3.0
    other = records("chain K=4", [(10, 10), (10, 10)], task="code")  # another group: never mixed in
    rows = {(r["task"], r["setting"]): r for r in summarise(chain2 + chain4 + tree + other)}
    t = rows[("news", "tree 3x4")]
    assert t["tau"] == pytest.approx(3.0) and t["best_chain"] == "chain K=4" and t["n_prompts"] == 3
    assert t["vs_best_chain"] == pytest.approx(1.5)
    assert t["vs_best_chain_ci_low"] <= 1.5 <= t["vs_best_chain_ci_high"]
    assert t["vs_best_chain_ci_high"] > t["vs_best_chain_ci_low"]  # the items differ: a real interval
    c = rows[("news", "chain K=2")]
    assert c["tau"] == pytest.approx(1.5) and c["vs_best_chain"] == pytest.approx(0.75)
    assert c["tau_ci_low"] < 1.5 < c["tau_ci_high"]
    assert rows[("news", "chain K=4")]["vs_best_chain"] == pytest.approx(1.0)
    assert rows[("code", "chain K=4")]["tau"] == pytest.approx(1.0)


def test_ratio_pairs_only_the_prompts_both_ran():
    chain = records("chain K=4", [(60, 30), (60, 30)])
    tree = records("tree 3x4", [(60, 20), (60, 20), (600, 1)], nodes=30)  # p2 has no chain run
    row = next(r for r in summarise(chain + tree) if r["setting"] == "tree 3x4")
    assert row["vs_best_chain"] == pytest.approx(1.5)  # p2 left out of the ratio
    assert row["tau"] == pytest.approx(720 / 41)  # but counted in the tree's own tau


def test_one_prompt_has_no_interval():
    row = summarise(records("chain K=4", [(60, 30)]))[0]
    assert row["tau"] == pytest.approx(2.0) and math.isnan(row["tau_ci_low"]) and math.isnan(row["tau_ci_high"])
