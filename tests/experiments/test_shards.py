"""Shards: `reproduce --shard I/N` runs a deterministic share of the items; `--merge` writes what one run writes.
Also: results are keyed by the package's code, and --force recomputes items."""
import json

import pytest

from specrepro.experiments import records, reproduce
from specrepro.experiments.results import ResultsFile, ShardComplete, code_digest, parse_shard, read_csv, shard_of

# columns measured in wall time (and their confidence intervals): they differ between any two runs
TIMED = ("ms_per_token", "speedup", "total_seconds", "ms_per_loop", "p50_ms", "p90_ms", "p99_ms")


def test_parse_shard():
    assert parse_shard("0/2") == (0, 2) and parse_shard("3/4") == (3, 4)
    for bad in ("2/2", "-1/2", "1", "a/b", "1/0"):
        with pytest.raises(ValueError, match="0 <= I < N"):
            parse_shard(bad)


def test_compared_items_share_a_shard_and_shares_cover_everything():
    for n in (2, 3, 5):
        for item in ("news/xsum-1", "code/HumanEval/7"):
            assert len({shard_of(f"{item}/rep0/K{k}", n) for k in range(8)}) == 1
        assert shard_of("news/greedy/ArS/xsum-1/s0", n) == shard_of("news/greedy/SpS/xsum-1/s0", n)
        assert shard_of("costs/news", n) is None
    keys = [f"news/greedy/ArS/item{i}/s0" for i in range(200)]
    owners = [shard_of(k, 4) for k in keys]
    assert set(owners) == {0, 1, 2, 3} and min(owners.count(i) for i in range(4)) > 25  # roughly even


def test_results_file_in_a_shard(tmp_path):
    keys = [f"x/item{i}" for i in range(20)]
    shard = ResultsFile(tmp_path / "r.jsonl", shard=(1, 2))
    mine = [k for k in keys if shard_of(k, 2) == 1]
    assert 0 < len(mine) < len(keys)
    assert all((k in shard) == (k not in mine) for k in keys)  # foreign items look done; its own are to do
    for k in mine:
        shard.append({"key": k})
    assert all(k in shard for k in keys) and len(shard.values()) == len(mine)
    with pytest.raises(ShardComplete, match="another shard"):
        shard.records[next(k for k in keys if k not in mine)]
    with pytest.raises(KeyError):
        ResultsFile(tmp_path / "other.jsonl", shard=(1, 2)).records[mine[0]]  # its own, not done: a plain KeyError
    assert "costs/news" not in shard  # every shard measures costs


def test_values_do_not_depend_on_the_order_items_were_done(tmp_path):
    a, b = ResultsFile(tmp_path / "a.jsonl"), ResultsFile(tmp_path / "b.jsonl")
    keys = [f"news/item{i}/rep0/K{k}" for i in range(5) for k in range(3)]
    for k in keys:
        a.append({"key": k})
    for k in reversed(keys):
        b.append({"key": k})
    assert a.values() == b.values() == ResultsFile(tmp_path / "b.jsonl").values()


def test_results_are_keyed_by_the_code(monkeypatch):
    base = dict(reproduce.plan("smoke", ["02_lookahead_sweep"]))["02_lookahead_sweep"]["results_dir"]
    monkeypatch.setattr(records, "code_digest", lambda: "changed-code")  # the key is records.results_key
    assert dict(reproduce.plan("smoke", ["02_lookahead_sweep"]))["02_lookahead_sweep"]["results_dir"] != base
    assert len(code_digest()) == 12


def _rows(folder, name, drop=TIMED):
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_csv(folder / "figures" / f"{name}.csv")]


@pytest.mark.notebooks
@pytest.mark.slow
def test_two_shards_merged_equal_one_run(tmp_path):
    # the fewest items that still give each shard a share of each notebook: 2 chunks x 4 settings, 2 + 1 prompts
    jobs = [(["01_losslessness"], {"n_samples": 100, "chunk": 50}),
            (["03_table1"], {"n_news": 2, "n_code": 1, "news_max_new_tokens": 6, "code_max_new_tokens": 6})]
    single, sharded = tmp_path / "single", tmp_path / "sharded"
    for only, overrides in jobs:
        reproduce.run("smoke", only, overrides=overrides, output_root=single)
        for i in range(2):
            reproduce.run("smoke", only, overrides=overrides, output_root=sharded, shard=(i, 2))
    with pytest.raises(SystemExit, match="no shard folders"):
        reproduce.merge("smoke", ["01_losslessness"], output_root=tmp_path / "nothing")
    for only, overrides in jobs:
        reproduce.merge("smoke", only, overrides=overrides, output_root=sharded)
    # each shard did a real share of each notebook's items, and no shard wrote the summaries
    for name in ("losslessness", "table1"):
        counts = [sum(len(ResultsFile(p, shard=False)) for p in (sharded / "shards" / f"{i}-of-2" / "results").rglob(
            f"*/{name}*.jsonl")) for i in range(2)]
        assert all(c > 0 for c in counts), (name, counts)
    assert not (sharded / "shards" / "0-of-2" / "figures" / "losslessness.csv").exists()
    # the merged summaries equal the single run's (every column but wall times)
    assert _rows(sharded, "losslessness") == _rows(single, "losslessness")
    merged, one = _rows(sharded, "table1"), _rows(single, "table1")
    assert [r["n_generations"] for r in one] and len(merged) == len(one)
    for a, b in zip(merged, one):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == (pytest.approx(b[k], nan_ok=True) if isinstance(b[k], float) else b[k]), k
    # and the items themselves: the same tokens for every key
    def tokens(root):
        out = {}
        for p in (root / "results").rglob("table1*.jsonl"):
            out.update({r["key"]: r["tokens"] for r in ResultsFile(p, shard=False).values()})
        return out
    assert tokens(sharded) == tokens(single) and len(tokens(single)) > 0


@pytest.mark.notebooks
@pytest.mark.slow
def test_force_recomputes_items(tmp_path):
    overrides = {"n_samples": 100, "chunk": 50}
    reproduce.run("smoke", ["01_losslessness"], overrides=overrides, output_root=tmp_path)
    (results,) = list((tmp_path / "results").rglob("*.jsonl"))
    marker = {"key": "stale/item", "setting": "none"}
    ResultsFile(results, shard=False).append(marker)
    reproduce.run("smoke", ["01_losslessness"], overrides=overrides, output_root=tmp_path)  # finished: skipped
    assert "stale/item" in ResultsFile(results, shard=False)
    reproduce.run("smoke", ["01_losslessness"], force=True, overrides=overrides, output_root=tmp_path)
    fresh = ResultsFile(results, shard=False)
    assert "stale/item" not in fresh and len(fresh) == 2 * 4  # 2 chunks x the 4 smoke settings, all recomputed
    done = json.loads((tmp_path / "01_losslessness.done.json").read_text())
    assert done["params"]["n_samples"] == 100


def test_results_are_keyed_by_the_trained_drafts_named(tmp_path, monkeypatch):
    """A retrained or newly shipped draft recomputes the notebooks that name its kind, and only those."""
    shipped = tmp_path / "shipped"
    (shipped / "feature").mkdir(parents=True)
    monkeypatch.setenv("SPECREPRO_SHIPPED_DRAFTS", str(shipped))
    monkeypatch.setenv("SPECREPRO_HOME", str(tmp_path / "home"))

    def dirs():
        d = dict(reproduce.plan("cpu", ["02_lookahead_sweep", "04_drafts"]))
        return d["02_lookahead_sweep"]["results_dir"], d["04_drafts"]["results_dir"]

    (shipped / "feature" / "complete.json").write_text('{"weights_sha256": "aaa"}')
    sweep, drafts = dirs()
    assert dirs() == (sweep, drafts)
    (shipped / "feature" / "complete.json").write_text('{"weights_sha256": "bbb"}')  # a new feature draft ships
    assert dirs()[0] == sweep and dirs()[1] != drafts
    drafts = dirs()[1]
    trained = tmp_path / "home" / "drafts" / "heads-0123"  # one trained here, which load() would prefer
    trained.mkdir(parents=True)
    (trained / "complete.json").write_text('{"finished": true}')
    assert dirs()[0] == sweep and dirs()[1] != drafts
