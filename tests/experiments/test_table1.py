"""Table 1 with several drafts: one shared ArS baseline, one SpS row per draft, result files keyed by the
draft (so runs resume), a per-draft item limit, and the sandbox column of the HumanEval rows."""
import pytest
import torch

from specrepro.experiments import reproduce
from specrepro.experiments import table1 as t1
from specrepro.experiments.results import ResultsFile, read_csv
from specrepro.experiments.workloads import code_items, make_draft, news_items
from specrepro.tasks.sandbox import sandbox_info

pytestmark = pytest.mark.slow

SETTINGS = {"news": {"greedy": {"temperature": 0.0}}, "humaneval": {"greedy": {"temperature": 0.0}}}


@pytest.fixture(scope="module")
def workload(smollm):
    target, tokenizer = smollm
    drafts = {"lookup": make_draft("lookup", target), "truncated:2": make_draft("truncated:2", target)}
    return target, tokenizer, drafts, news_items(tokenizer, 2), code_items(tokenizer, 1)


def run(workload, folder, drafts=None, **kw):
    target, tokenizer, all_drafts, news, code = workload
    drafts = all_drafts if drafts is None else drafts
    with torch.inference_mode():
        return t1.run_table1(target, drafts, tokenizer, news, code, SETTINGS, folder, lookahead=3,
                             news_max_new_tokens=5, code_max_new_tokens=5, **kw)


def test_two_drafts_share_one_ars_baseline_and_keep_their_own_files(workload, tmp_path, monkeypatch):
    rows = run(workload, tmp_path, draft_items={"truncated:2": 1})
    assert [(r["benchmark"], r["method"], r["draft"]) for r in rows] == [
        (b, m, d) for b in ("news", "humaneval") for m, d in (("ArS", ""), ("SpS", "lookup"), ("SpS", "truncated:2"))]
    by = {(r["benchmark"], r["draft"]): r for r in rows}
    # the ArS items are run once, whatever the number of drafts; each draft's SpS items go to its own file
    assert len(ResultsFile(tmp_path / "table1-ArS.jsonl")) == 3
    assert len(ResultsFile(tmp_path / "table1-lookup.jsonl")) == 3
    assert len(ResultsFile(tmp_path / "table1-truncated_2.jsonl")) == 2  # draft_items: the first item of each row
    assert by[("news", "")]["n_items"] == 2 and by[("news", "lookup")]["n_pairs"] == 2
    assert by[("news", "truncated:2")]["n_items"] == 1 and by[("news", "truncated:2")]["n_pairs"] == 1
    for r in rows:
        if r["method"] == "SpS":  # float32 greedy: SpS emits greedy ArS's tokens with either draft
            assert r["identical_text"] == 1.0 and r["speedup"] > 0
            if r["n_pairs"] > 1:
                assert r["speedup_ci_low"] <= r["speedup"] <= r["speedup_ci_high"]
            assert r["benchmark"] == "humaneval" or r["paper_speedup"] > 0
        else:
            assert r["speedup"] == 1.0
        # the HumanEval rows name the containment their verdicts ran under; news runs no code
        assert r.get("sandbox") == (sandbox_info().level if r["benchmark"] == "humaneval" else None)
    # a rerun with one of the drafts resumes from the same files: nothing is generated again
    monkeypatch.setattr(t1, "generate_item", lambda *a, **k: pytest.fail("a finished item was generated again"))
    again = run(workload, tmp_path, drafts={"lookup": workload[2]["lookup"]})
    assert [r["draft"] for r in again] == ["", "lookup"] * 2
    assert again[0]["ms_per_token"] == rows[0]["ms_per_token"]


def test_a_bare_draft_is_named_draft(workload, tmp_path):
    rows = run(workload, tmp_path, drafts=workload[2]["lookup"])
    assert {r["draft"] for r in rows} == {"", "draft"} and (tmp_path / "table1-draft.jsonl").exists()


@pytest.mark.parametrize("drafts, items, match", [
    ({}, None, "at least one draft"),
    (None, {"small": 3}, "not run"),
    (None, {"lookup": 0}, "positive integer"),
])
def test_bad_drafts_are_refused(workload, tmp_path, drafts, items, match):
    with pytest.raises(ValueError, match=match):
        run(workload, tmp_path, drafts=drafts, draft_items=items)


def test_summary_pairs_each_draft_with_the_shared_ars():
    def rec(method, item, seconds, draft=None):
        r = {"benchmark": "news", "decoding": "greedy", "method": method, "item": item, "sample": 0,
             "tokens": [1, 2, 3, 4], "n_tokens": 4, "loop_seconds": [seconds], "target_calls": 2, "score": 0.1}
        return {**r, "draft": draft} if draft else r
    records = [rec("ArS", f"n{i}", 0.4) for i in range(4)] + [rec("SpS", f"n{i}", 0.2, "a") for i in range(4)] + [
        rec("SpS", f"n{i}", 0.8, "b") for i in range(2)]
    rows = {r["draft"]: r for r in t1.summarise_table1(records, drafts=["b", "a"])}
    assert list(rows) == ["", "b", "a"]
    assert rows["a"]["speedup"] == pytest.approx(2.0) and rows["b"]["speedup"] == pytest.approx(0.5)
    assert rows["b"]["n_pairs"] == 2 and rows["a"]["n_pairs"] == 4
    # records of a run before drafts were named belong to a draft called "draft"
    assert [r["draft"] for r in t1.summarise_table1(records[:8])] == ["", "a"]
    assert [r["draft"] for r in t1.summarise_table1([{k: v for k, v in r.items() if k != "draft"}
                                                    for r in records[:8]])] == ["", "draft"]


@pytest.mark.notebooks
def test_notebook_runs_two_drafts_and_records_the_sandbox(tmp_path):
    overrides = {"drafts": ["truncated:4", "lookup@tune"], "draft_items": {"truncated:4": 1}, "n_news": 2,
                 "news_max_new_tokens": 4, "code_max_new_tokens": 4}
    reproduce.run("smoke", ["03_table1"], overrides=overrides, output_root=tmp_path)
    rows = read_csv(tmp_path / "figures" / "table1.csv")
    assert {(r["benchmark"], r["decoding"], r["method"], r["draft"]) for r in rows} == {
        (b, d, m, dr) for b in ("news", "humaneval") for d in ("greedy", "nucleus")
        for m, dr in (("ArS", None), ("SpS", "truncated:4"), ("SpS", "lookup@tune"))}
    assert {r["sandbox"] for r in rows if r["benchmark"] == "humaneval"} == {sandbox_info().level}
    assert {r["n_items"] for r in rows if r["benchmark"] == "news" and r["draft"] == "truncated:4"} == {1}
    import json
    meta = json.loads((tmp_path / "figures" / "table1.json").read_text())["meta"]
    assert meta["drafts"] == overrides["drafts"] and meta["sandbox"]["level"] == sandbox_info().level
    # the tuned row ran at the K chosen for each setting before any item, and says so
    tuned = meta["tuned_lookaheads"]["lookup@tune"]
    assert set(tuned) == {f"{b}/{d}" for b in ("news", "humaneval") for d in ("greedy", "nucleus")}
    for r in rows:
        if r["draft"] == "lookup@tune":
            assert int(r["lookahead"]) == tuned[f"{r['benchmark']}/{r['decoding']}"]["lookahead"]


def test_row_names_carry_a_k():
    assert t1.row_spec("feature:1024@tune") == ("feature:1024", "tune")
    assert t1.row_spec("lookup@2") == ("lookup", 2)
    assert t1.row_spec("model:/models/a@b") == ("model:/models/a@b", None)  # not a K: part of the spec
    assert t1.row_spec("datastore") == ("datastore", None)
    with pytest.raises(ValueError, match="names no draft"):
        t1.row_spec("@3")


def test_a_draft_at_its_own_k_keeps_separate_items(workload, tmp_path):
    lookaheads = {"lookup": 2, "truncated:2": {"news/greedy": 1}}
    rows = run(workload, tmp_path, lookaheads=lookaheads)
    k = {(r["benchmark"], r["draft"]): r["lookahead"] for r in rows}
    assert k == {("news", ""): 0, ("news", "lookup"): 2, ("news", "truncated:2"): 1,
                 ("humaneval", ""): 0, ("humaneval", "lookup"): 2, ("humaneval", "truncated:2"): 3}
    records = ResultsFile(tmp_path / "table1-lookup.jsonl").records
    assert all(key.endswith("/k2") and r["lookahead"] == 2 for key, r in records.items())
    assert all(max(r["proposed"]) <= 2 for r in records.values())
    for r in rows:
        if r["method"] == "SpS":
            assert r["identical_text"] == 1.0  # float32 greedy: exact at any K
    # the same drafts at the table's K run their own items: nothing read from the K = 2 ones
    again = run(workload, tmp_path, drafts={"lookup": workload[2]["lookup"]})
    assert [r["lookahead"] for r in again if r["method"] == "SpS"] == [3, 3]
    assert len(ResultsFile(tmp_path / "table1-lookup.jsonl")) == 6


@pytest.mark.parametrize("lookaheads, match", [
    ({"small": 2}, "not run"),
    ({"lookup": 0}, "must be an integer"),
    ({"lookup": {"news/greedy": "4"}}, "must be an integer"),
])
def test_bad_lookaheads_are_refused(workload, tmp_path, lookaheads, match):
    with pytest.raises(ValueError, match=match):
        run(workload, tmp_path, lookaheads=lookaheads)


def test_tuned_rows_get_a_k_per_setting(workload):
    target, tokenizer, drafts, _, _ = workload
    from specrepro.engines.lean import LeanRunner

    runner = LeanRunner(target, dtype=torch.float32)
    named = {"truncated:2@tune": drafts["truncated:2"], "lookup@2": drafts["lookup"], "lookup": drafts["lookup"]}
    lookaheads, chosen = t1.row_lookaheads(runner, named, SETTINGS, tokenizer, max_lookahead=3, reps=3)
    assert lookaheads["lookup@2"] == 2 and "lookup" not in lookaheads
    assert set(lookaheads["truncated:2@tune"]) == {"news/greedy", "humaneval/greedy"}
    for where, k in lookaheads["truncated:2@tune"].items():
        choice = chosen["truncated:2@tune"][where]
        assert k == choice["lookahead"] and 1 <= k <= 3
        assert choice["pilot_loops"] > 0 and set(choice["tau"]) == {1, 2, 3}
