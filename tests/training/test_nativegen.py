"""Batched native generation of target-written data (specrepro/training/nativegen.py): a sequence generated beside
others in one interleaved cache is bit for bit the sequence generated alone, and equals a plain one-sequence
LeanRunner loop; T = 1 is reproducible and samples from the rows it records; gen_mask, EOS and bad input."""
import math
import shutil

import pytest
import torch

from helpers import llama
from specrepro.engines import native
from specrepro.training import nativegen, shards
from specrepro.training.nativegen import generate_batched, make_runner

REASON = native.unavailable_reason(torch.bfloat16, "cpu") if shutil.which("g++") is None else None
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no native build here: {REASON}")

KEYS = ("tokens", "top_ids", "top_p", "rest", "hidden", "gen_mask")
VOCAB = 64


@pytest.fixture(scope="module")
def target():
    """A tiny Llama (GQA, two layers) whose weights spread the logits over several units, norms varied."""
    m = llama(0, vocab=VOCAB, layers=2, heads=4, kv_heads=2, hidden=64, window=256, initializer_range=0.2)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.5 * torch.randn_like(p))
    return m


def prompts(lengths=(1, 5, 30, 70, 12, 3, 40), seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, VOCAB, (k,), generator=g) for k in lengths]


def sequence(data, i):
    s0, s1 = int(data["starts"][i]), int(data["starts"][i + 1])
    return {k: data[k][s0:s1] for k in KEYS}


def assert_same(got, want, what):
    for k in KEYS:
        assert torch.equal(got[k], want[k]), f"{what}: {k} differs"


def batched(target, ps, sampled=False, **kw):
    """Several sequences a pass, prompts fed in chunks beside decoding rows, a cache small enough to compact."""
    kw = {"batch": 4, "max_rows": 16, "seed": 7} | kw
    return generate_batched(make_runner(target, capacity=160), ps, 24, sampled, **kw)


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "T=1"])
def test_each_sequence_of_a_batch_is_the_sequence_generated_alone(target, sampled):
    ps = prompts()
    stats = {}
    data = batched(target, ps, sampled, stats=stats)
    assert stats["compactions"] > 0 and stats["passes"] < stats["rows"]  # the cache was compacted; rows shared passes
    alone = generate_batched(make_runner(target), ps, 24, sampled, batch=1, seed=7)  # one live sequence a pass
    for i, p in enumerate(ps):
        assert_same(sequence(data, i), sequence(alone, i), f"sequence {i}")
        if not sampled:  # greedy: also a call of its own (a sampled sequence's generator follows its index)
            assert_same(sequence(data, i), generate_batched(make_runner(target), [p], 24, False), f"sequence {i} alone")
    wide = batched(target, ps, sampled, batch=7, max_rows=64)
    assert all(torch.equal(wide[k], data[k]) for k in KEYS)  # any B gives the same shard


def test_a_mask_that_shows_other_sequences_breaks_the_equality(target, monkeypatch):
    """The equality test above catches a wrong mask: here rows also see every other live sequence's slots."""
    ps = prompts()
    alone = [generate_batched(make_runner(target), [p], 24, False) for p in ps]

    def leaky(owner, row_seq, length):
        mask = (owner >= 0).view(1, -1).repeat(len(row_seq), 1)
        mask[:, length:] &= torch.ones(len(row_seq), len(row_seq), dtype=torch.bool).tril()
        return mask

    monkeypatch.setattr(nativegen, "visible", leaky)
    data = batched(target, ps)
    differ = [i for i in range(len(ps)) if not torch.equal(sequence(data, i)["top_p"], alone[i]["top_p"])]
    assert len(differ) >= len(ps) - 1  # (the first prompt's first pass may have had nobody else to see)


def reference_greedy(target, prompt, new_tokens, top_k=32):
    """The plain one-sequence loop: a fresh native runner, the prompt in one forward, then one token a forward."""
    runner = make_runner(target)
    logits, hidden = [runner.forward(prompt)], [runner.hidden]
    written = [int(logits[-1][-1].argmax())]
    while len(written) < new_tokens:
        logits.append(runner.forward(torch.tensor([written[-1]])))
        hidden.append(runner.hidden)
        written.append(int(logits[-1][-1].argmax()))
    probs = torch.cat(logits).softmax(-1)
    top_p, top_ids = probs.topk(top_k, -1)
    return {"tokens": torch.cat([prompt, torch.tensor(written[:-1])]), "top_ids": top_ids.int(), "top_p": top_p,
            "rest": (1 - top_p.sum(-1)).clamp_min(0), "hidden": torch.cat(hidden).half(),
            "gen_mask": torch.arange(len(prompt) + new_tokens - 1) >= len(prompt) - 1}


def test_greedy_equals_a_plain_one_sequence_runner_loop(target):
    """Exact: the native pass gives a row of a causal block the bits of a one-row pass (tests/engines/
    test_native_invariance.py), so the interleaved, masked, chunked batch must equal this loop bit for bit."""
    ps = prompts()
    data = batched(target, ps)
    for i, p in enumerate(ps):
        assert_same(sequence(data, i), reference_greedy(target, p, 24), f"sequence {i}")


def test_greedy_tokens_equal_hf_generate_on_the_rounded_float32_model(target):
    """HF's own generate on a float32 copy of the bfloat16-rounded weights: not the same arithmetic (the native
    pass rounds the activations entering each product to bfloat16), so tokens, not bits; at this size the
    logit gaps are wide enough that they agree (a near-tie would show up here as a first differing token)."""
    from transformers import LlamaForCausalLM

    copy = LlamaForCausalLM(target.config).eval()
    copy.load_state_dict({k: v.bfloat16().float() for k, v in target.state_dict().items()})
    ps = prompts()
    data = batched(target, ps)
    for i, p in enumerate(ps):
        hf = copy.generate(p.view(1, -1), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=1)[0]
        assert torch.equal(sequence(data, i)["tokens"], hf[:-1]), f"sequence {i}"


def test_sampled_is_reproducible_and_draws_from_the_rows_it_records(target):
    """Same seed, same shard; another seed, other tokens. Calibration: at target-written positions, how often
    the next token is the row's top token must match the rows' own top probability (z-test, two-sided,
    alpha = 0.001; the deliberately wrong sampler, greedy, on the same prompts must be rejected)."""
    ps = prompts(lengths=[3 + (7 * i) % 20 for i in range(24)], seed=3)
    kw = {"top_k": 8, "batch": 8, "max_rows": 64}
    a = generate_batched(make_runner(target), ps, 40, True, seed=1, **kw)
    b = generate_batched(make_runner(target), ps, 40, True, seed=1, **kw)
    assert all(torch.equal(a[k], b[k]) for k in KEYS)
    c = generate_batched(make_runner(target), ps, 40, True, seed=2, **kw)
    assert not torch.equal(a["tokens"], c["tokens"])
    same = generate_batched(make_runner(target), [ps[0]] * 4, 40, True, seed=1, **kw)  # one prompt 4 times
    texts = {tuple(sequence(same, i)["tokens"].tolist()) for i in range(4)}
    assert len(texts) == 4  # four samples, not one sample four times
    total = a["top_p"].sum(-1) + a["rest"]
    assert torch.allclose(total, torch.ones_like(total), atol=1e-5)  # rows are distributions
    assert (a["top_p"][:, :-1] >= a["top_p"][:, 1:]).all() and (a["rest"] > 0).any()

    def z(data):
        nxt = torch.cat([data["tokens"][1:], torch.zeros(1, dtype=torch.long)])
        last = torch.zeros(len(nxt), dtype=torch.bool)
        last[data["starts"][1:] - 1] = True  # a sequence's last position: its next token is not stored
        use = data["gen_mask"] & ~last
        hit = (nxt[use] == data["top_ids"][use, 0].long()).double()
        p = data["top_p"][use, 0].double()
        return float((hit.sum() - p.sum()) / (p * (1 - p)).sum().sqrt()), int(use.sum())

    crit = 3.29  # two-sided normal at alpha = 0.001
    score, n = z(a)
    assert n > 500 and abs(score) < crit, f"T=1 samples disagree with their rows: z = {score:.2f} over {n}"
    wrong, _ = z(generate_batched(make_runner(target), ps, 40, False, **kw))
    assert abs(wrong) > crit, f"greedy passed as T=1 (z = {wrong:.2f})"


def test_gen_mask_marks_exactly_the_target_written_positions(target):
    ps = prompts()
    data = batched(target, ps)
    for i, p in enumerate(ps):
        seq = sequence(data, i)
        assert torch.equal(seq["tokens"][: len(p)], p)
        want = torch.zeros(len(p) + 23, dtype=torch.bool)
        want[len(p) - 1:] = True  # from the prompt's last position: each next token the target wrote
        assert torch.equal(seq["gen_mask"], want)
        written = seq["gen_mask"].nonzero().flatten()[:-1]  # next tokens stored in the sequence
        assert torch.equal(seq["tokens"][written + 1], seq["top_ids"][written, 0].long())  # greedy: the top token


def test_eos_ends_a_sequence_and_nothing_after_it_is_stored(target):
    ps = prompts()
    free = batched(target, ps)
    eos = int(sequence(free, 2)["tokens"][len(ps[2]) + 5])  # the 6th token the target writes after prompt 2
    data = batched(target, ps, eos_token_id=eos)
    j = 0  # sequences that wrote fewer than 2 tokens are dropped, as generate_with_pass drops them
    for i, p in enumerate(ps):
        full = sequence(free, i)
        written = torch.cat([full["tokens"][len(p):], full["top_ids"][-1:, 0].long()])  # all 24 written tokens
        hits = (written == eos).nonzero().flatten()
        stop = int(hits[0]) + 1 if len(hits) else 24  # tokens written up to and including the first EOS
        if stop < 2:
            continue
        got = sequence(data, j)
        j += 1
        assert len(got["tokens"]) == len(p) + stop - 1, f"sequence {i}"
        for k in KEYS:
            assert torch.equal(got[k], full[k][: len(p) + stop - 1]), f"sequence {i}: {k}"
        if i == 2:
            assert stop <= 6  # its EOS, the 6th token, was written and ended it
    assert j == len(data["starts"]) - 1


def test_bad_input_is_refused_with_a_clear_error(target):
    runner = make_runner(target, capacity=64)
    with pytest.raises(ValueError, match="non-empty list"):
        generate_batched(runner, [], 8, False)
    with pytest.raises(ValueError, match="new_tokens"):
        generate_batched(runner, prompts(), 0, False)
    with pytest.raises(ValueError, match="batch"):
        generate_batched(runner, prompts(), 8, False, batch=0)
    with pytest.raises(ValueError, match="empty"):
        generate_batched(runner, [torch.tensor([3]), torch.tensor([], dtype=torch.long)], 8, False)
    with pytest.raises(ValueError, match="cache slots"):
        generate_batched(runner, prompts(), 40, False)  # a 70-token prompt + 40 new tokens in 64 slots


def test_shard_key_keeps_old_folders_and_names_the_new_settings():
    cfg = {"target": "t", "shard_size": 32, "shard_new_tokens": 128, "top_k": 32, "code_per_round": 200}
    import hashlib
    old = hashlib.sha256(repr(sorted(cfg.items()) + [("format", 3)]).encode()).hexdigest()[:10]  # the key's formula before
    assert shards.shard_key(cfg) == old == shards.shard_key(cfg | {"generator": "hf", "gen_batch": 8})
    keys = {shards.shard_key(cfg | extra) for extra in ({"generator": "native"}, {"generator": "native", "taps": [3, 20]},
                                                        {"prompt_variety": 1}, {"samples_per_prompt": 4})}
    assert len(keys) == 4 and old not in keys
    assert shards.shard_key(cfg | {"generator": "native", "gen_batch": 4}) == shards.shard_key(cfg | {"generator": "native"})
    with pytest.raises(ValueError, match="generator"):
        shards.check_generator_config(cfg | {"generator": "vllm"})
    with pytest.raises(ValueError, match="taps"):
        shards.check_generator_config(cfg | {"taps": [1, 2]})
    with pytest.raises(ValueError, match="gen_threads"):
        shards.check_generator_config(cfg | {"generator": "native", "gen_threads": 0})
    with pytest.raises(ValueError, match="samples_per_prompt"):
        shards.check_generator_config(cfg | {"samples_per_prompt": 0})
    with pytest.raises(ValueError, match="gen_batch"):
        shards.check_generator_config(cfg | {"generator": "native", "gen_batch": 0})


@pytest.mark.slow
def test_native_shards_build_resume_and_load(smollm, tmp_path):
    """build_shards with generator 'native' on a tiny model with the real tokenizer: a news and a code shard,
    a sidecar record each, a second build that finds them done, load_shards reading them."""
    _, tokenizer = smollm
    tiny = llama(0, vocab=len(tokenizer), layers=1, heads=2, kv_heads=1, hidden=32, window=2048)
    cfg = {"target": "tiny", "shards": 3, "shard_size": 3, "shard_new_tokens": 6, "top_k": 4, "code_per_round": 5,
           "generator": "native", "gen_batch": 2, "prompt_variety": 1, "samples_per_prompt": 2}
    paths = shards.build_shards(tiny, tokenizer, cfg, tmp_path, progress=False)
    assert len(paths) == 3 and all(p.with_suffix(".json").exists() for p in paths)
    sampled = torch.load(paths[2], weights_only=True)  # shard 2: news at T = 1, two samples of its first prompt
    first, second = (sampled["tokens"][a:b] for a, b in zip(sampled["starts"][:2], sampled["starts"][1:3]))
    plen = int(sampled["gen_mask"][: len(first)].int().argmax()) + 1
    assert torch.equal(first[:plen], second[:plen]) and not torch.equal(first, second)
    mtimes = [p.stat().st_mtime_ns for p in paths]
    assert shards.build_shards(tiny, tokenizer, cfg, tmp_path, progress=False) == paths
    assert [p.stat().st_mtime_ns for p in paths] == mtimes  # resumed: nothing rebuilt
    data = shards.load_shards(paths)
    assert len(data["starts"]) <= 3 * 3 + 1 and len(data["tokens"]) == len(data["hidden"]) == len(data["top_p"])
    import json
    record = json.loads(paths[0].with_suffix(".json").read_text())
    assert record["generator"] == "native" and record["target_written_tokens"] > 0 and math.isfinite(record["seconds"])
    hf = cfg | {"generator": "hf", "shards": 1}  # the old path, now with a record too, in its old folder
    del hf["gen_batch"], hf["prompt_variety"]
    (path,) = shards.build_shards(tiny, tokenizer, hf, tmp_path, progress=False)
    assert path.parent.name == f"shards-{shards.shard_key(hf)}" != paths[0].parent.name
    assert json.loads(path.with_suffix(".json").read_text())["generator"] == "hf"


def test_taps_are_stored_row_for_row_and_leave_the_rest_unchanged(target):
    """make_runner(taps=...) sets the runner's hidden_taps: "taps" [N, T, H] holds the tapped layer's output at
    every position, bit for bit what a one-sequence loop with the same taps computes, and every other key is
    what the untapped run stores; without taps there is no "taps" key."""
    ps = prompts()
    plain = batched(target, ps)
    assert "taps" not in plain
    data = generate_batched(make_runner(target, capacity=160, taps=(0,)), ps, 24, False, batch=4, max_rows=16)
    assert data["taps"].dtype == torch.bfloat16 and data["taps"].shape == (len(data["tokens"]), 1, 64)
    assert all(torch.equal(data[k], plain[k]) for k in KEYS)
    for i, p in enumerate(ps):
        loop = make_runner(target, taps=(0,))
        rows = [loop.forward(p) is not None and loop.hidden]
        for t in sequence(data, i)["tokens"][len(p):]:
            loop.forward(t.view(1))
            rows.append(loop.hidden)
        want = torch.cat(rows)[:, :64].reshape(-1, 1, 64)
        s0, s1 = int(data["starts"][i]), int(data["starts"][i + 1])
        assert torch.equal(data["taps"][s0:s1], want), f"sequence {i}"
    with pytest.raises(ValueError):
        make_runner(target, taps=(1,))  # the last layer's output is the final hidden state, not a tap


def test_the_thread_count_changes_no_bit(target):
    """The native pass splits outputs between threads, never a sum: gen_threads is a speed setting only."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = batched(target, prompts(), True)
        torch.set_num_threads(1)
        one = batched(target, prompts(), True)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(one[k], two[k]) for k in KEYS)
