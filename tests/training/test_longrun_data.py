"""What the long training run reads from its shards: trimming prompt positions that no labelled training window
reaches changes no window the trainer can draw."""
import torch

from specrepro.training.longrun import trim_prompts
from specrepro.training.trainer import window_starts


def shard(lengths_and_prompts, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens, mask, starts = [], [], [0]
    for n, prompt in lengths_and_prompts:
        tokens.append(torch.randint(100, (n,), generator=g))
        m = torch.zeros(n, dtype=torch.bool)
        m[prompt - 1 :] = prompt <= n  # positions whose next token the target wrote
        mask.append(m)
        starts.append(starts[-1] + n)
    t = torch.cat(tokens)
    return {"tokens": t, "gen_mask": torch.cat(mask), "starts": torch.tensor(starts),
            "hidden": torch.randn(len(t), 3, generator=g), "taps": torch.randn(len(t), 2, 3, generator=g)}


def windows(data, length):
    return {tuple(data["tokens"][s : s + length].tolist()) + tuple(data["hidden"][s : s + length].flatten().tolist())
            for s in window_starts(data, length).tolist()}


def test_trimming_keeps_every_labelled_window_and_drops_the_rest():
    data = shard([(40, 30), (12, 3), (50, 10), (25, 26), (30, 30)])  # the 4th and 5th wrote nothing
    length = 6
    cut = trim_prompts(data, length)
    assert windows(cut, length) == windows(data, length)
    # sequence 0 keeps 5 positions before its first label (29), sequence 2 from 4 on
    assert cut["starts"].tolist()[:2] == [0, 40 - 24] and len(cut["tokens"]) < len(data["tokens"])
    assert set(cut) == set(data) and cut["taps"].shape[1:] == (2, 3)
    assert int(cut["gen_mask"].sum()) == int(data["gen_mask"].sum())


def test_a_seqkd_draft_trains_on_native_shards_from_the_small_draft(smollm, tmp_path):
    """The sequence-level distillation draft: the small draft's shape continued on the target-written positions of
    shards the native pass built (tiny data and budget here), exported and loaded as a seqkd draft."""
    import json

    from safetensors.torch import load_file

    from specrepro.algorithm.sampling import SamplingConfig
    from specrepro.drafts import load
    from specrepro.drafts.shipped import shipped_root
    from specrepro.training.longrun import load_config, run

    model, tokenizer = smollm
    cfg = load_config(shipped_root() / "small" / "config.json")
    cfg.pop("version", None)
    cfg |= {"kind": "seqkd", "hard_weight": 0.5, "written_only": True, "text_data": False, "generator": "native",
            "gen_batch": 4, "shards": 2, "shard_size": 2, "shard_new_tokens": 6, "code_per_round": 3,
            "budget_minutes": 60, "max_steps": 2, "window": 16}
    out = run(cfg, export_dir=tmp_path / "art", work=tmp_path / "work", target=model, tokenizer=tokenizer,
              progress=False, continue_from=shipped_root() / "small")
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["text"]["positions"] == 0 and manifest["shards"]["target_written"] > 0
    assert json.loads((out / "complete.json").read_text())["steps"] == 2
    small = load_file(str(shipped_root() / "small" / "net.safetensors"))
    mine = load_file(str(out / "net.safetensors"))
    assert {k: v.shape for k, v in mine.items()} == {k: v.shape for k, v in small.items()}
    assert any(not torch.equal(mine[k], small[k]) for k in small)  # it trained
    draft = load("seqkd", target=model, path=out)
    tokens, rows = draft.propose(torch.tensor([1, 2, 3, 4]), 2, SamplingConfig(0.0))
    assert tokens.shape == (2,) and rows.shape[0] == 2
