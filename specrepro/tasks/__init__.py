"""Evaluation tasks: news summarisation, HumanEval, and a sandbox for model-written code."""

from specrepro.tasks.humaneval import (
    HumanEvalProblem, check_completion, code_prompt, extract_completion, load_humaneval,
    mean_pass_at_k, pass_at_k,
)
from specrepro.tasks.news import NewsExample, load_news, mean_rouge2, rouge2, summarisation_prompt
from specrepro.tasks.sandbox import SandboxInfo, SandboxResult, SandboxWarning, run_untrusted, sandbox_info

__all__ = [
    "HumanEvalProblem", "NewsExample", "SandboxInfo", "SandboxResult", "SandboxWarning", "check_completion",
    "code_prompt", "extract_completion", "load_humaneval", "load_news", "mean_pass_at_k",
    "mean_rouge2", "pass_at_k", "rouge2", "run_untrusted", "sandbox_info", "summarisation_prompt",
]
