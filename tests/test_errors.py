"""Bad input gets a clear error naming the problem, never a traceback from inside torch."""
import pytest
import torch

import specrepro as sr
from specrepro.algorithm.tree import tree_specs
from helpers import tiny_llama, word_tokenizer


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(0, vocab=7, window=32), tiny_llama(1, vocab=7, window=32)


PROMPT = torch.tensor([0, 3])


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(lookahead=0), ValueError, r"lookahead \(K\) must be an integer in 1\.\.32"),
        (dict(lookahead=-2), ValueError, "lookahead"),
        (dict(lookahead=33), ValueError, "lookahead"),
        (dict(lookahead=2.0), ValueError, "lookahead"),
        (dict(temperature=-1.0), ValueError, "temperature must be >= 0"),
        (dict(top_p=0.0), ValueError, r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.01), ValueError, "top_p"),
        (dict(top_k=0), ValueError, "top_k must be a positive integer"),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be an integer >= 0"),
        (dict(max_new_tokens=31), ValueError, "exceeds the target's context window of 32"),
        (dict(input_ids=torch.tensor([], dtype=torch.long)), ValueError, "empty prompt"),
        (dict(input_ids=torch.zeros(1, 0, dtype=torch.long)), ValueError, "empty prompt"),
        (dict(input_ids=torch.zeros(2, 3, dtype=torch.long)), ValueError, "batch size 1"),
        (dict(input_ids=torch.tensor([0, 7])), ValueError, "outside the vocabulary"),
        (dict(input_ids=torch.tensor([0.0, 1.0])), TypeError, "integer token ids"),
        (dict(input_ids=[0, 1]), TypeError, "LongTensor"),
    ],
)
def test_bad_arguments(pair, kwargs, error, message):
    target, draft = pair
    args = dict(input_ids=PROMPT, max_new_tokens=4, lookahead=2) | kwargs
    with pytest.raises(error, match=message):
        sr.speculative_generate(target, draft, **args)


def test_prompt_past_context_window(pair):
    target, draft = pair
    with pytest.raises(ValueError, match="prompt \\(40 tokens\\).*context window"):
        sr.autoregressive_generate(target, torch.zeros(40, dtype=torch.long), max_new_tokens=1)


def test_draft_with_smaller_window_is_checked(pair):
    target, _ = pair
    short = tiny_llama(1, vocab=7, window=8)
    with pytest.raises(ValueError, match="draft's context window of 8"):
        sr.speculative_generate(target, short, PROMPT, max_new_tokens=10)


def test_vocab_mismatch(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="vocabularies differ \\(9 vs 7 tokens\\)"):
        sr.speculative_generate(target, tiny_llama(1, vocab=9), PROMPT, max_new_tokens=4)


def test_not_a_draft(pair):
    target, _ = pair
    with pytest.raises(TypeError, match="draft must be a Hugging Face causal LM"):
        sr.speculative_generate(target, "small", PROMPT, max_new_tokens=4)
    with pytest.raises(ValueError, match="needs a draft"):
        sr.speculative_generate(target, None, PROMPT, max_new_tokens=4)


def test_zero_new_tokens_returns_nothing(pair):
    target, draft = pair
    assert sr.speculative_generate(target, draft, PROMPT, max_new_tokens=0).tokens.numel() == 0
    assert sr.autoregressive_generate(target, PROMPT, max_new_tokens=0).tokens.numel() == 0


def test_ars_rejects_bad_sampling(pair):
    target, _ = pair
    with pytest.raises(ValueError, match="temperature"):
        sr.autoregressive_generate(target, PROMPT, temperature=-0.5)


def test_mismatched_tokenizers():
    a = word_tokenizer(["<unk>", "</s>", "hello", "world"])
    b = word_tokenizer(["<unk>", "</s>", "world", "hello"])
    sr.check_tokenizers(a, word_tokenizer(["<unk>", "</s>", "hello", "world"]))
    with pytest.raises(ValueError, match="tokenizers differ .*2 with different ids"):
        sr.check_tokenizers(a, b)


# --- every other public entry point: tasks, stats, drafts, sandbox, experiments ---------------------------

def _bad_inputs():
    from specrepro.experiments.records import check_params, run_header
    from specrepro.algorithm.sampling import SamplingConfig
    from specrepro.stats.exact import exact_joint
    from specrepro.tasks.humaneval import load_humaneval, pass_at_k
    from specrepro.tasks.news import load_news
    from specrepro.tasks.sandbox import run_untrusted

    model = tiny_llama(0, vocab=5)
    return [
        ("news split", lambda: load_news(split="bogus"), ValueError, "split must be one of"),
        ("news n < 0", lambda: load_news(n=-1), ValueError, "n must be an integer >= 0"),
        ("news n float", lambda: load_news(n=2.5), ValueError, "n must be an integer >= 0"),
        ("news source", lambda: load_news(source="nowhere"), ValueError, "unknown news source"),
        ("news source type", lambda: load_news(source=3), TypeError, "news source must be"),
        ("humaneval n < 0", lambda: load_humaneval(n=-3), ValueError, "n must be an integer >= 0"),
        ("humaneval source", lambda: load_humaneval(source="bogus"), ValueError, "unknown HumanEval source"),
        ("humaneval source type", lambda: load_humaneval(source=None), TypeError, "HumanEval source must be"),
        ("pass@k c > n", lambda: pass_at_k(3, 4, 1), ValueError, "0 <= c <= n"),
        ("pass@k k < 1", lambda: pass_at_k(3, 1, 0), ValueError, "1 <= k <= n"),
        ("pass@k k > n", lambda: pass_at_k(3, 1, 4), ValueError, "1 <= k <= n"),
        ("pass@k float", lambda: pass_at_k(3, 1.5, 1), ValueError, "must be integers"),
        ("sandbox timeout 0", lambda: run_untrusted("pass", timeout=0), ValueError, "timeout must be"),
        ("sandbox timeout < 0", lambda: run_untrusted("pass", timeout=-1), ValueError, "timeout must be"),
        ("sandbox timeout nan", lambda: run_untrusted("pass", timeout=float("nan")), ValueError, "timeout"),
        ("sandbox timeout inf", lambda: run_untrusted("pass", timeout=float("inf")), ValueError, "timeout"),
        ("sandbox memory", lambda: run_untrusted("pass", memory_mb=0), ValueError, "memory_mb"),
        ("sandbox processes", lambda: run_untrusted("pass", max_processes=0), ValueError, "max_processes"),
        ("sandbox code type", lambda: run_untrusted(b"pass"), TypeError, "code must be a str"),
        ("exact_joint n_tokens 0", lambda: exact_joint(model, PROMPT, 0, SamplingConfig()), ValueError,
         "n_tokens must be an integer >= 1"),
        ("exact_joint n_tokens < 0", lambda: exact_joint(model, PROMPT, -2, SamplingConfig()), ValueError,
         "n_tokens"),
        ("trees as one string", lambda: tree_specs("2x4"), TypeError, "list of tree specs"),
        ("tree of a wrong type", lambda: tree_specs([3]), TypeError, "TreeSpec or a string"),
        ("tree of a wrong shape", lambda: tree_specs(["2by4"]), ValueError, "WIDTHxDEPTH"),
        ("tree width 0", lambda: tree_specs(["0x4"]), ValueError, "width must be an integer >= 1"),
        ("lookup vocab", lambda: sr.drafts.LookupDraft(0), ValueError, "vocab_size must be an integer >= 1"),
        ("lookup vocab type", lambda: sr.drafts.LookupDraft("49152"), ValueError, "vocab_size"),
        ("lookup ngram", lambda: sr.drafts.LookupDraft(10, max_ngram=1, min_ngram=2), ValueError,
         "min_ngram <= max_ngram"),
        ("lookup ngram type", lambda: sr.drafts.LookupDraft(10, max_ngram=2.0), ValueError, "min_ngram"),
        ("lookup window", lambda: sr.drafts.LookupDraft(10, context_window=0), ValueError, "context_window"),
        ("truncated layers", lambda: sr.drafts.TruncatedDraft(model, n_layers=1), ValueError, "n_layers must be"),
        ("notebook parameter", lambda: check_params({"n_sampels": 5}, {"n_samples"}), ValueError,
         r"unknown parameter\(s\) \['n_sampels'\]"),
        ("profile", lambda: run_header("laptop", 0, 1), ValueError, "unknown profile"),
        ("K = 0 in a setting", lambda: _losslessness_with(lookahead=0), ValueError, r"lookahead \(K\)"),
        ("K = 33 in a setting", lambda: _losslessness_with(lookahead=33), ValueError, r"in 1\.\.32"),
    ]


def _losslessness_with(lookahead):
    import tempfile

    from specrepro.experiments.lossless import run_losslessness

    with tempfile.TemporaryDirectory() as tmp:
        run_losslessness([{"name": "x", "sampler": "sps", "lookahead": lookahead}], f"{tmp}/r.jsonl",
                            n_samples=2, chunk=2)


BAD_INPUTS = _bad_inputs()


@pytest.mark.parametrize("call, error, message", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_public_functions_reject_bad_input(call, error, message):
    with pytest.raises(error, match=message):
        call()


@pytest.mark.parametrize("argv, message", [
    (["--profile", "laptop"], "unknown profile 'laptop'"),
    (["--profile", "smoke", "--only", "01_losless"], r"unknown notebook\(s\) \['01_losless'\]"),
    (["--profile", "smoke", "--only", "01_losslessness", "--set", "n_sampels=5"], "--set.*n_sampels"),
    (["--profile", "smoke", "--set", "n_samples"], "--set expects NAME=VALUE"),
])
def test_reproduce_cli_rejects_bad_input(argv, message, tmp_path):
    from specrepro.experiments import reproduce

    with pytest.raises(SystemExit, match=message):
        reproduce.main(argv + ["--output-root", str(tmp_path)])
    assert list(tmp_path.iterdir()) == []  # nothing ran


def test_params_file_typo_is_named_by_the_cli(tmp_path, monkeypatch):
    from specrepro.experiments import reproduce

    (tmp_path / "smoke.yaml").write_text("01_losslessness:\n  n_sampels: 5\n")
    monkeypatch.setattr(reproduce, "PARAMS_DIR", tmp_path)
    with pytest.raises(SystemExit, match=r"params/smoke.yaml, notebook 01_losslessness: unknown.*n_sampels"):
        reproduce.main(["--profile", "smoke", "--only", "01_losslessness", "--output-root", str(tmp_path / "o")])
