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
