"""What several test modules share: the tiny models, the chi-square harnesses of the chain and tree
losslessness tests, the lean runner's chunked feeding, a fixed token tree, and a word tokenizer.

Test modules import it as `helpers` (pytest puts tests/ on the path through tests/conftest.py).
"""
import torch
from torch.overrides import TorchFunctionMode
from transformers import LlamaConfig, LlamaForCausalLM

import specrepro as sr
from specrepro.algorithm.tree import Tree
from specrepro.drafts import Datastore, DatastoreDraft, FeatureDraft, HeadsDraft, HybridDraft, LookupDraft, ModelDraft, SmallDraft, TruncatedDraft
from specrepro.drafts import as_draft
from specrepro.engines.runners import HFRunner, as_runner
from specrepro.stats.exact import chisquare_fit, exact_joint, truncate_outcome
from specrepro.stats.toy import tiny_llama

EOS = 1  # the default eos_token_id of specrepro.stats.toy.tiny_llama


# --- tiny models and the lean runner's chunked feeding ---------------------------------------------------

# a prompt fed in chunks, rolling back between some of them: (start, end) of each forward
CHUNKS = [(0, 7), (7, 10), (8, 13), (13, 14), (14, 19), (15, 16), (16, 30)]


def llama(seed=0, vocab=50, layers=2, heads=4, kv_heads=2, tied=False, window=128, hidden=32, ffn=None,
          logit_scale=None, **config):
    """A tiny random LlamaForCausalLM, the same weights for the same arguments (torch seeded with `seed`).

    ffn: the MLP width (default 2 * hidden); logit_scale: the LM head multiplied by it (peaked distributions);
    config: any other LlamaConfig field (initializer_range, attention_bias, rms_norm_eps, ...). Token 0 is BOS,
    1 is EOS and padding. (specrepro.stats.toy.tiny_llama is the 5-token model of the losslessness harness.)"""
    torch.manual_seed(seed)
    config = LlamaConfig(**{
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": ffn or 2 * hidden, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "max_position_embeddings": window,
        "rope_theta": 1e4, "tie_word_embeddings": tied, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 1,
        **config,
    })
    model = LlamaForCausalLM(config).eval()
    if logit_scale is not None:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model


def run_chunks(runner, ids, chunks=CHUNKS):
    """(start, end, logits, hidden) of each forward of ids[start:end], fed in `chunks` with rollbacks in between."""
    runner.reset()
    rows = []
    for start, end in chunks:
        runner.rollback(start)
        assert runner.length == start
        logits = runner.forward(ids[start:end])
        assert runner.length == end
        rows.append((start, end, logits, getattr(runner, "hidden", None)))
    return rows


# --- the chain losslessness harness (tests/algorithm/test_lossless.py) ------------------------------

L = 3  # tokens of the joint distribution
PROMPT = torch.tensor([0, 3])
# samples per chain configuration: its power is stated and checked in tests/algorithm/test_lossless.py
N_CHAIN = 1000


def stop_at_outcome(new_tokens):
    """stop_when for the harnesses: the outcome is the first L tokens, so a generation ends once it has
    them (a stop never changes the tokens before it: specrepro.algorithm.speculative.StopRule). Later
    loops could not change the outcome; max_new_tokens still lets the first loop draft its full lookahead."""
    return len(new_tokens) >= L


def chisquare_power(n, w2, cells, alpha):
    """Power of chisquare_fit's test at level `alpha` with `cells` cells (df = cells - 1) against a
    sampler whose outcome distribution pi is at effect size w2 = sum (pi - e)^2 / e from the exact e:
    P(noncentral chi-square(df, n * w2) > the central one's 1 - alpha quantile)."""
    from scipy.stats import chi2, ncx2

    return float(ncx2.sf(chi2.ppf(1 - alpha, cells - 1), cells - 1, n * w2))


# a tiny in-memory datastore over the 5-token vocabulary: several continuations of most suffixes, so that
# the datastore draft's frequency rows branch (EOS = 1 appears as text would end)
TINY_STORE = [[0, 3, 2, 4, 0, 3, 4, 2], [3, 2, 2, 4, 3, 0, 1], [0, 3, 4, 4, 2, 0], [2, 3, 2, 0, 4, 3, 3],
              [4, 0, 3, 2, 4, 1], [3, 3, 0, 2, 2, 3, 4]]

def native_feature(target, cfg, seed):
    """A bfloat16 feature draft (FeatureDraft picks its native step for it where the module builds)."""
    draft = FeatureDraft.init_for(target, cfg, seed=seed)
    draft.net.to(torch.bfloat16)
    draft.net.attach(target, torch.bfloat16)
    return FeatureDraft(draft.net, target)


# every draft strategy, on the same harness: (name, factory(target, draft) -> draft object)
DRAFTS = [
    ("datastore", lambda target, draft: DatastoreDraft(Datastore(TINY_STORE, max_ngram=3), target.config.vocab_size)),
    ("lookup", lambda target, draft: LookupDraft(target.config.vocab_size, max_ngram=2)),
    ("truncated", lambda target, draft: TruncatedDraft(tiny_llama(0, layers=2), n_layers=1)),
    ("small", lambda target, draft: SmallDraft.from_config(target, {"hidden": 16, "layers": 1, "ffn": 32, "head_dim": 8})),
    ("feature", lambda target, draft: FeatureDraft.init_for(target, {"ffn": 32}, seed=3)),
    # a reduced draft vocabulary: p is zero outside tokens {0, 1, 3}, still a proper distribution
    ("feature-reduced-vocab", lambda target, draft: FeatureDraft.init_for(target, {"ffn": 32}, keep=torch.tensor([0, 1, 3]), seed=4)),
    # EAGLE-3's fused features (layer 0's output beside the final hidden state), bfloat16: its steps run in the
    # native pass where the module builds
    ("feature-native-fused", lambda target, draft: native_feature(target, {"ffn": 32, "taps": [0]}, seed=7)),
    ("heads", lambda target, draft: HeadsDraft.init_for(target, {"heads": 3}, seed=5)),
    # adaptive lookahead: the draft stops when unsure of its next token
    ("adaptive", lambda target, draft: ModelDraft(draft, confidence_threshold=0.6)),
    # prompt lookup where the context has a match, the feature draft elsewhere
    ("lookup+feature", lambda target, draft: HybridDraft(FeatureDraft.init_for(target, {"ffn": 32}, seed=6),
                                                         LookupDraft(target.config.vocab_size, max_ngram=2))),
]


def draw_chain(target, draft, k, sampling, eos, seed, n=N_CHAIN, rules=None):
    """n chain SpS generations after PROMPT, truncated to L tokens; and how many loops took the bonus token.
    rules: a deliberately wrong sampler's rules (specrepro.experiments.wrong), or None."""
    g = torch.Generator().manual_seed(seed)
    # wrapped once (a runner and a proposer are reset by every call), not once per sample
    target, draft = as_runner(target), as_draft(draft)
    outcomes, bonus_loops = [], 0
    for _ in range(n):
        gen = sr.speculative_generate(
            target, draft, PROMPT, max_new_tokens=max(L, k + 1), lookahead=k,
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
            eos_token_id=eos, generator=g, stop_when=stop_at_outcome, _rules=rules,
        )
        outcomes.append(truncate_outcome(gen.tokens, L, eos))
        bonus_loops += sum(a == p > 0 for a, p in zip(gen.accepted, gen.proposed))
    return outcomes, bonus_loops


def fit_chain(target, draft, k, sampling, eos, seed, rules=None, model=None):
    """model: the HF model behind `target` when that is a runner (the exact joint needs the model)."""
    outcomes, bonus_loops = draw_chain(target, draft, k, sampling, eos, seed, rules=rules)
    expected = exact_joint(model or target, PROMPT, L, sampling, eos)
    return chisquare_fit(outcomes, expected), outcomes, bonus_loops


# --- the tree losslessness harness and a fixed tree (tests/algorithm/test_tree.py) -------------------------

# samples per tree configuration: its power is stated and checked in tests/algorithm/test_tree.py
N_TREE = 1200


def draw_tree(target, draft, spec, sampling, eos, seed, n=N_TREE, rules=None):
    """n generations; stats count first loops that accepted a full path (the leaf's bonus token) or
    nothing (the final residual), and generations that accepted any node. rules: a deliberately wrong
    rule's (specrepro.experiments.wrong), or None."""
    g = torch.Generator().manual_seed(seed)
    target, draft = as_runner(target), as_draft(draft)
    outcomes, stats = [], {"full_path": 0, "rejected_all": 0, "accepted_any": 0}
    for _ in range(n):
        gen = sr.speculative_generate(
            target, draft, PROMPT, max_new_tokens=max(L, spec.depth + 1), temperature=sampling.temperature,
            top_k=sampling.top_k, top_p=sampling.top_p, eos_token_id=eos, generator=g, tree=spec,
            stop_when=stop_at_outcome, _rules=rules,
        )
        outcomes.append(truncate_outcome(gen.tokens, L, eos))
        stats["full_path"] += gen.accepted[0] == spec.depth
        stats["rejected_all"] += gen.accepted[0] == 0
        stats["accepted_any"] += sum(gen.accepted) > 0
    return outcomes, stats


def fit_tree(target, draft, spec, sampling, eos, seed, n=N_TREE, model=None, rules=None):
    """model: the HF model behind `target` when that is a runner (the exact joint needs the model)."""
    outcomes, stats = draw_tree(target, draft, spec, sampling, eos, seed, n, rules)
    result = chisquare_fit(outcomes, exact_joint(model or target, PROMPT, L, sampling, eos))
    return result, outcomes, stats


def fit_chain_or_tree(target, draft, tree, sampling, seed, k=3):
    """fit_chain with a chain of k tokens (tree None) or fit_tree of `tree` with the target in the lean runner,
    EOS as in PROMPT's harness: (result, outcomes, the chain's bonus loops or the tree's stats)."""
    from specrepro.engines.lean import LeanRunner

    if tree is None:
        return fit_chain(target, draft, k, sampling, EOS, seed)
    return fit_tree(LeanRunner(target), draft, tree, sampling, EOS, seed, model=target)


def fixed_tree(vocab=5):
    """A branching tree over a tiny vocabulary (tokens 0..4 used), node order = level order."""
    tree = Tree(vocab)
    eye = torch.eye(vocab)
    for parent, token in [(-1, 2), (-1, 4), (-1, 0), (0, 3), (0, 1), (1, 2), (3, 4), (5, 0)]:
        tree.add(parent, token, eye[token], 1.0)
    return tree


def check_tree_logits(logits, context, tree, last_logits, tol=1e-4):
    """A tree pass's logits (row 0 the root, row i + 1 node i) against last_logits(sequence) of the plain
    sequence: context followed by the node's path."""
    for node in [-1] + list(range(len(tree))):
        path = tree.path(node) if node >= 0 else []
        seq = torch.cat([context, torch.tensor([tree.tokens[i] for i in path], dtype=torch.long)])
        torch.testing.assert_close(logits[node + 1], last_logits(seq), rtol=tol, atol=tol)


def kv(runner):
    """A runner's cached keys and values (what compaction must leave as a fresh prefill would)."""
    if isinstance(runner, HFRunner):
        return [t for layer in runner.cache.layers for t in (layer.keys, layer.values)]
    return [runner.k_cache[..., : runner.length, :], runner.v_cache[..., : runner.length, :]]


# --- the host-read trap (tests/engines/test_gpu_session_runners.py, tests/drafts/test_draft_devices.py) ------------

# calls that copy a device tensor to the host, i.e. wait for the device
SYNCING = {torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__bool__,
           torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero,
           torch.Tensor.masked_select, torch.masked_select}


class HostSyncs(TorchFunctionMode):
    """Records every call that reads a tensor on the host, which on a GPU waits for the device: .cpu(),
    .numpy(), .item(), .tolist(), bool(), int(), float(), use as an index, nonzero, masked_select,
    one-argument torch.where, and .to() the CPU: of a tensor that is not on the CPU, or with "cpu" written
    out (on a CPU run every tensor is on the CPU already, and the code would copy on a GPU)."""

    COPIES = ("cpu", "numpy", "to('cpu')")  # the calls that copy a whole tensor, not a value read

    def __init__(self):
        super().__init__()
        self.calls = []

    def copies(self):
        """The recorded calls that copy a tensor to the host (a draft may read values on the host, never copy)."""
        return [c for c in self.calls if c in self.COPIES]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNCING:
            self.calls.append(func.__name__)
        elif func is torch.where and len(args) + len(kwargs) == 1:
            self.calls.append("where(condition)")
        elif func is torch.Tensor.to:
            where = kwargs.get("device", args[1] if len(args) > 1 else None)
            if str(where).startswith("cpu") and (args[0].device.type != "cpu" or isinstance(where, str)):
                self.calls.append("to('cpu')")
        return func(*args, **kwargs)


# --- tokenizers ---------------------------------------------------------------------------------------

def word_tokenizer(words):
    """A whitespace word-level tokenizer over `words` (for tokenizer checks without a model)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="</s>")
