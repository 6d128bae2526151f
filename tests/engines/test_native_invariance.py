"""Batch invariance of the native pass: a token's logits are the same bits whatever else shares its pass (1-17
rows of a chain, or a token tree) and whichever pass wrote the cache entries it reads; so greedy SpS, chain or
tree, equals greedy ArS token for token on a native target. Tiny random Llamas of several head layouts here,
the real target in the slow tests."""
import shutil

import pytest
import torch

import specrepro as sr
from specrepro.engines import native
from test_native import model

REASON = native.unavailable_reason(torch.bfloat16, "cpu") if shutil.which("g++") is None else None
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no native build here: {REASON}")

# (heads, kv heads, hidden): head size 16 and 32 (whole vectors for AVX512 and AVX2), 8 (AVX2's vectors, the
# AVX512 build's plain loops), 16 query heads on one kv head (attention tasks split a token's heads)
LAYOUTS = [(4, 2, 64), (2, 1, 64), (8, 2, 64), (16, 1, 256)]


def native_runner(m, capacity=512, weights="bfloat16"):
    return sr.LeanRunner(m, dtype=torch.bfloat16, backend="native", capacity=capacity, weights=weights)


def one_by_one(runner, ids):
    return torch.cat([runner.forward(ids[i:i + 1]) for i in range(len(ids))])


def check_rows_equal_one_row_passes(m, ids, prefixes, sizes, after=3, weights="bfloat16"):
    """For each prefix length and n: one pass over n tokens gives the logits of n one-token passes, and `after`
    one-token passes later (reading cache entries the n-row pass wrote) do too."""
    # different capacities: the cache grows
    many, single = native_runner(m, capacity=8, weights=weights), native_runner(m, weights=weights)
    for prefix in prefixes:
        # the one-token passes after the prefix, once for all n: the first n of them are the same passes whatever n is
        single.reset()
        single.prefill(ids[:prefix])
        want = one_by_one(single, ids[prefix:prefix + max(sizes) + after])
        for n in sizes:
            many.reset()
            many.prefill(ids[:prefix])
            block = ids[prefix:prefix + n]
            got = many.forward(block)
            rows = [i for i in range(n) if not torch.equal(got[i], want[i])]
            assert not rows, f"prefix {prefix}, {n} rows: rows {rows} differ by {(got - want[:n]).abs().max():.3g}"
            tail = ids[prefix + n:prefix + n + after]
            if after:
                assert torch.equal(one_by_one(many, tail), want[n:n + len(tail)]), f"prefix {prefix}, {n} rows: later"


@pytest.mark.parametrize("heads,kv_heads,hidden", LAYOUTS)
def test_every_row_of_a_pass_equals_its_one_row_pass(heads, kv_heads, hidden):
    m = model(1, heads=heads, kv_heads=kv_heads, hidden=hidden)
    ids = torch.randint(0, 64, (200,), generator=torch.Generator().manual_seed(2))
    check_rows_equal_one_row_passes(m, ids, prefixes=[1, 6, 31, 70, 150], sizes=range(1, 18))


@pytest.mark.parametrize("heads,kv_heads,hidden", LAYOUTS)
def test_int8_every_row_of_a_pass_equals_its_one_row_pass(heads, kv_heads, hidden):
    """The same with int8 weights (each product's input rows quantised alone, per-output sums in one order)."""
    m = model(1, heads=heads, kv_heads=kv_heads, hidden=hidden)
    ids = torch.randint(0, 64, (200,), generator=torch.Generator().manual_seed(2))
    check_rows_equal_one_row_passes(m, ids, prefixes=[1, 31, 150], sizes=range(1, 18), weights="int8")


def test_int8_the_same_rows_at_64_a_pass_and_in_prompt_blocks():
    m = model(3)
    ids = torch.randint(0, 64, (200,), generator=torch.Generator().manual_seed(4))
    check_rows_equal_one_row_passes(m, ids, prefixes=[1, 5], sizes=[native.MAX_ROWS - 1, native.MAX_ROWS], after=0,
                                    weights="int8")
    block, single = native_runner(m, weights="int8"), native_runner(m, weights="int8")
    block.prefill(ids[:150])  # blocks of native.MAX_ROWS
    one_by_one(single, ids[:150])
    assert torch.equal(block.forward(ids[150:160]), single.forward(ids[150:160]))


def test_a_prompt_longer_than_a_native_call_caches_what_one_token_passes_do():
    m = model(3)
    ids = torch.randint(0, 64, (160,), generator=torch.Generator().manual_seed(4))
    block, single = native_runner(m), native_runner(m)
    block.prefill(ids[:150])  # blocks of native.MAX_ROWS
    one_by_one(single, ids[:150])
    assert torch.equal(block.forward(ids[150:]), single.forward(ids[150:]))
    assert torch.equal(block.forward(ids[:150 - native.MAX_ROWS]), single.forward(ids[:150 - native.MAX_ROWS]))


def test_the_same_rows_at_64_a_pass():
    m = model(3)
    ids = torch.randint(0, 64, (200,), generator=torch.Generator().manual_seed(4))
    check_rows_equal_one_row_passes(m, ids, prefixes=[1, 5], sizes=[native.MAX_ROWS - 1, native.MAX_ROWS], after=0)


def tree_pass(runner, root, tokens, parents):
    """A tree pass after runner's cache: the root token, then node i (token tokens[i], parent parents[i], -1 for
    the root) in the next slots. Returns the logits, row 0 the root's, row i + 1 node i's."""
    length, n = runner.length, len(tokens) + 1
    depth = [0]
    for p in parents:
        depth.append(depth[p + 1] + 1)
    mask = torch.zeros(n, length + n, dtype=torch.bool)
    mask[:, :length] = True
    for i in range(n):
        node = i
        while node >= 0:  # the node and its ancestors up to the root
            mask[i, length + node] = True
            node = parents[node - 1] + 1 if node > 0 else -1
    positions = length + torch.tensor(depth)
    return runner.forward_tree(torch.tensor([root] + tokens), positions, mask)


def path_of(node, parents):
    path = []
    while node >= 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


@pytest.mark.parametrize("heads,kv_heads,hidden,weights", [(*layout, "bfloat16") for layout in LAYOUTS]
                         + [(*LAYOUTS[0], "int8"), (*LAYOUTS[3], "int8")])
def test_tree_nodes_equal_one_row_passes_along_their_path(heads, kv_heads, hidden, weights):
    """Each node's logits in a tree pass are those of one-token passes over its path; after compaction to an
    accepted path, later passes read the cache a chain of one-token passes would have written."""
    m = model(5, heads=heads, kv_heads=kv_heads, hidden=hidden)

    def native_runner(m):
        return sr.LeanRunner(m, dtype=torch.bfloat16, backend="native", weights=weights)

    ids = torch.randint(0, 64, (120,), generator=torch.Generator().manual_seed(6))
    # a tree of 11 nodes over 4 levels, siblings interleaved with deeper nodes in slot order
    parents = [-1, -1, 0, -1, 2, 1, 0, 4, 5, 2, 7]
    tokens = [int(t) for t in torch.randint(0, 64, (len(parents),), generator=torch.Generator().manual_seed(7))]
    for prefix in (3, 40, 90):
        tree = native_runner(m)
        tree.prefill(ids[:prefix])
        logits = tree_pass(tree, int(ids[prefix]), tokens, parents)
        for node in [-1] + list(range(len(parents))):
            path = [int(ids[prefix])] + [tokens[i] for i in (path_of(node, parents) if node >= 0 else [])]
            chain = native_runner(m)
            chain.prefill(ids[:prefix])
            want = one_by_one(chain, torch.tensor(path))[-1]
            assert torch.equal(logits[node + 1], want), f"prefix {prefix}, node {node}"
        accepted = path_of(10, parents)
        tree.compact(torch.cat([torch.arange(prefix + 1), prefix + 1 + torch.tensor(accepted)]))
        chain = native_runner(m)
        chain.prefill(ids[:prefix])
        one_by_one(chain, torch.tensor([int(ids[prefix])] + [tokens[i] for i in accepted]))
        later = ids[prefix + 1:prefix + 6]
        assert torch.equal(tree.forward(later), one_by_one(chain, later))


def repetitive_prompt(vocab, n=60, seed=8):
    """Token ids with repeated phrases, so that prompt lookup proposes often."""
    g = torch.Generator().manual_seed(seed)
    phrases = [torch.randint(2, vocab, (int(k),), generator=g) for k in torch.randint(3, 8, (5,), generator=g)]
    order = torch.randint(0, len(phrases), (n,), generator=g)
    return torch.cat([phrases[i] for i in order])[:n]


def check_greedy_sps_equals_ars(target, prompt, vocab, new_tokens, lookahead=4, tree=None, weights="bfloat16"):
    ars = sr.autoregressive_generate(native_runner(target, weights=weights), prompt, max_new_tokens=new_tokens,
                                     temperature=0.0)
    draft = sr.drafts.LookupDraft(vocab)
    sps = sr.speculative_generate(native_runner(target, weights=weights), draft, prompt, max_new_tokens=new_tokens,
                                  lookahead=lookahead,
                                  temperature=0.0, tree=tree)
    assert sum(sps.accepted) > 0  # the draft's tokens were verified in many-row passes and some were kept
    same = (sps.tokens == ars.tokens).long().cumprod(0).sum().item()
    assert torch.equal(sps.tokens, ars.tokens), f"greedy SpS leaves greedy ArS at token {same}"
    return sps


@pytest.mark.parametrize("weights", ["bfloat16", "int8"])
@pytest.mark.parametrize("tree", [None, sr.TreeSpec(width=3, depth=4)], ids=["chain", "tree"])
def test_greedy_sps_with_prompt_lookup_equals_greedy_ars(tree, weights):
    target = model(9, vocab=64, heads=4, kv_heads=2)
    for seed in range(3):
        check_greedy_sps_equals_ars(target, repetitive_prompt(64, seed=seed), 64, 80, tree=tree, weights=weights)


# ---- the real target (bfloat16 SmolLM2-135M-Instruct)

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, then explain how it works.",
    "The city council met on Tuesday to discuss the new budget. The mayor said the budget would fund more "
    "buses, and the council said the budget would fund more parks. Summarise what the council discussed.",
    "List the planets of the solar system in order from the Sun, with one sentence about each planet.",
    "def add(a, b):\n    return a + b\n\n\ndef multiply(a, b):\n",
]


@pytest.mark.slow
def test_real_target_rows_equal_one_row_passes(smollm):
    target, tokenizer = smollm
    ids = torch.tensor(tokenizer(" ".join(PROMPTS * 4))["input_ids"])
    assert len(ids) > 340
    check_rows_equal_one_row_passes(target, ids, prefixes=[1, 9, 64, 130, 300], sizes=range(1, 18), after=2)


@pytest.mark.slow
def test_real_target_int8_rows_equal_one_row_passes(smollm):
    target, tokenizer = smollm
    ids = torch.tensor(tokenizer(" ".join(PROMPTS * 4))["input_ids"])
    check_rows_equal_one_row_passes(target, ids, prefixes=[9, 300], sizes=range(1, 10), after=2, weights="int8")


@pytest.mark.slow
@pytest.mark.parametrize("tree,weights", [(None, "bfloat16"), (sr.TreeSpec(width=3, depth=4), "bfloat16"),
                                          (None, "int8")], ids=["chain", "tree", "chain-int8"])
def test_real_target_greedy_sps_with_prompt_lookup_equals_greedy_ars(smollm, tree, weights):
    target, tokenizer = smollm
    for text in PROMPTS:
        chat = [{"role": "user", "content": text}]
        text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
        prompt = torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"])
        check_greedy_sps_equals_ars(target, prompt, target.config.vocab_size, 160, lookahead=4, tree=tree,
                                    weights=weights)


# ---- the pieces, at float32 (a pass rounds the attention's output to bfloat16 before the o projection, which
# hides most last-bit differences in a tiny model: these see every bit)

@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 2, 16), (8, 2, 8), (16, 1, 32), (2, 2, 40)])
def test_attention_of_a_query_is_the_same_whatever_shares_its_call(heads, kv_heads, d):
    g = torch.Generator().manual_seed(heads * d)
    capacity = 160
    keys, values = torch.randn(kv_heads, capacity, d, generator=g), torch.randn(kv_heads, capacity, d, generator=g)
    q = 3 * torch.randn(20, heads, d, generator=g)  # spread scores: softmax weights far from uniform
    for start in (0, 1, 5, 16, 61, 130):
        for n in (1, 2, 3, 4, 5, 8, 13, 20):
            if start + n > capacity:
                continue
            many = native.attention(q[:n], keys, values, start)
            for t in range(n):
                alone = native.attention(q[t:t + 1], keys, values, start + t)[0]
                assert torch.equal(many[t], alone), f"start {start}, {n} rows: row {t}"


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 2, 8), (2, 2, 40)])
def test_attention_of_a_tree_row_is_that_of_its_visible_keys_in_a_chain(heads, kv_heads, d):
    g = torch.Generator().manual_seed(d)
    start, n = 37, 9
    keys, values = torch.randn(kv_heads, start + n, d, generator=g), torch.randn(kv_heads, start + n, d, generator=g)
    q = 3 * torch.randn(n, heads, d, generator=g)
    mask = torch.zeros(n, start + n, dtype=torch.bool)
    mask[:, :start] = True
    mask[:, start:] = torch.rand(n, n, generator=g) < 0.5
    mask[torch.arange(n), start + torch.arange(n)] = True
    tree = native.attention(q, keys, values, start, mask)
    for t in range(n):
        seen = mask[t].nonzero().flatten()
        chain = native.attention(q[t:t + 1], keys[:, seen].contiguous(), values[:, seen].contiguous(), len(seen) - 1)
        assert torch.equal(tree[t], chain[0]), f"row {t}"
    want = torch.softmax((q.transpose(0, 1).double() @ keys.double().repeat_interleave(heads // kv_heads, 0)
                          .transpose(1, 2)) / d ** 0.5 + torch.where(mask, 0.0, -torch.inf), -1)
    want = (want @ values.double().repeat_interleave(heads // kv_heads, 0)).transpose(0, 1)
    torch.testing.assert_close(tree.double(), want, atol=1e-5, rtol=1e-5)


def test_a_product_row_is_the_same_whatever_shares_its_call():
    g = torch.Generator().manual_seed(11)
    w = torch.randn(200, 96, generator=g)
    packed = native.pack([w])
    x = torch.randn(40, 96, generator=g)
    alone = torch.cat([native.linear(x[i:i + 1], packed) for i in range(40)])
    for rows in (2, 3, 4, 5, 7, 9, 12, 13, 17, 40):
        assert torch.equal(native.linear(x[:rows], packed), alone[:rows]), f"{rows} rows"
