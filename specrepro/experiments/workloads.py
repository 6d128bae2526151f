"""What the experiments and the bench run on: prompts (built-in, held-out news, HumanEval) and drafts by spec.

Prompt ids come from specrepro.tasks (the held-out news split and HumanEval, never training data); drafts
from a short spec string shared by the notebooks' parameters and the CLIs' --draft options.
"""
from __future__ import annotations

import re

import torch

from ..drafts.truncated import truncated_model
from ..drafts.spec import make_draft
from ..generate import MAX_LOOKAHEAD
from ..tasks.humaneval import code_prompt, load_humaneval
from ..tasks.news import load_news, summarisation_prompt

NEWS = [
    "The Reserve Bank has left interest rates unchanged for the third month in a row, saying inflation is "
    "easing but remains above its target band. The governor said the board would watch wage growth and "
    "housing prices closely before deciding whether further tightening was needed. Economists had widely "
    "expected the decision, although some had forecast a cut before the end of the year.",
    "Firefighters have contained a bushfire that burned through more than 2,000 hectares of scrub west of "
    "the city overnight. Residents of two small towns were told to evacuate on Tuesday evening as strong "
    "winds pushed the fire towards homes. Authorities say no houses were lost, but several sheds and fences "
    "were destroyed, and one firefighter was treated for smoke inhalation.",
    "A new study has found that children who spend more time outdoors are less likely to become short-"
    "sighted. Researchers followed more than 4,000 primary school students for three years and found that "
    "an extra hour outside each day reduced the risk of myopia by about a third. The authors say schools "
    "should consider moving some lessons outdoors.",
]

CODE = [
    'def merge_sorted(a: list[int], b: list[int]) -> list[int]:\n    """Merge two sorted lists into one '
    'sorted list."""\n    result = []\n    i = j = 0\n',
    "import os\n\n\ndef count_lines(path):\n    \"\"\"Return the number of lines in every .py file under path.\"\"\"\n"
    "    counts = {}\n    for root, dirs, files in os.walk(path):\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n",
]

def builtin_prompts(kind: str, tokenizer=None, n: int | None = None, vocab: int | None = None) -> list[torch.Tensor]:
    """Token ids of the built-in prompts: "news" (a summarisation request, chat-formatted) or "code".

    Without a tokenizer (tiny test models) returns random ids over `vocab` instead.
    """
    texts = {"news": NEWS, "code": CODE}[kind][:n]
    if tokenizer is None:
        g = torch.Generator().manual_seed(0)
        return [torch.randint(2, vocab, (8 + 4 * i,), generator=g) for i in range(len(texts))]
    out = []
    for text in texts:
        if kind == "news" and getattr(tokenizer, "chat_template", None):
            messages = [{"role": "user", "content": f"Summarise this article in one sentence.\n\n{text}"}]
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append(torch.tensor(tokenizer(text).input_ids, dtype=torch.long))
    return out

def task_prompts(kind: str, tokenizer, n: int) -> list[torch.Tensor]:
    """Prompt ids from the evaluation sets: "news-eval" (held-out news, chat-formatted) or "humaneval"."""
    items = news_items(tokenizer, n) if kind == "news-eval" else code_items(tokenizer, n)
    return [item["prompt_ids"] for item in items]

def _encode(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)

def news_items(tokenizer, n: int, source: str = "offline", max_document_tokens: int | None = 384) -> list[dict]:
    """[{id, prompt_ids, reference}] for news summarisation (specrepro.tasks.news)."""
    examples = load_news("eval", source=source, n=n)
    prompts = [summarisation_prompt(e, tokenizer, max_document_tokens=max_document_tokens) for e in examples]
    return [{"id": e.id, "prompt_ids": _encode(tokenizer, p), "reference": e.reference, "source": "tasks.news"}
            for e, p in zip(examples, prompts)]

def code_items(tokenizer, n: int, source: str = "offline") -> list[dict]:
    """[{id, prompt_ids, prompt, problem}] for HumanEval (specrepro.tasks.humaneval): a chat request whose answer
    is begun inside the function where the tokenizer has a chat template (tasks.humaneval.code_prompt)."""
    prompts = [(prob, code_prompt(prob, tokenizer)) for prob in load_humaneval(source=source, n=n)]
    return [{"id": prob.task_id, "prompt_ids": _encode(tokenizer, prompt), "prompt": prompt, "problem": prob,
             "source": "tasks.humaneval"} for prob, prompt in prompts]

def eos_ids(tokenizer) -> list[int]:
    return [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []

def compute_dtype(runner) -> torch.dtype:
    """The dtype a target runner computes in: a LeanRunner's own, else its model's (an HFRunner, a model)."""
    dtype = getattr(runner, "dtype", None)
    if isinstance(dtype, torch.dtype):
        return dtype
    return next(getattr(runner, "model", runner).parameters()).dtype


def load_draft(spec: str, target: torch.nn.Module, dtype: torch.dtype | None = None):
    """truncated:N, a model directory or model:<id>, lookup+<spec>, or a kind of specrepro.drafts.load."""
    return make_draft(spec, target, dtype=dtype, device=next(target.parameters()).device)

def truncated_draft(target: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """The stand-in draft: the target's first n_layers with its final norm and head (modules shared)."""
    return truncated_model(target, n_layers)

def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)


DTYPE_CHOICES = ("auto", "float32", "bfloat16")


def load_target(name_or_path: str, dtype: str = "auto", device="cpu", device_map=None, max_memory=None):
    """(model, tokenizer); dtype "auto" loads float32 weights and leaves the compute dtype to tuned_target.
    device_map / max_memory split a target too big for one device (sr.load_model, accelerate)."""
    from ..models import load_model

    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    kw = {} if device_map is None else {"device_map": device_map, "max_memory": max_memory}
    return load_model(name_or_path, dtype=torch.float32 if dtype == "auto" else getattr(torch, dtype),
                      device=device, **kw)


def tuned_target(model, draft, dtype: str = "auto", threads: int | None = None, **tune_kw):
    """(runner, summary): sr.tune over the dtypes `dtype` allows ("auto": float32 and bfloat16), every linear
    backend and the given thread count; the summary (what won, why, the CPU, v(K) of the winner) goes
    into the notebooks' metadata.
    """
    from ..tuning.tune import tune

    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPE_CHOICES)}, got {dtype!r}")
    setting = tune(model, draft, dtypes=("float32", "bfloat16") if dtype == "auto" else (dtype,),
                   threads=[int(threads)] if threads else None, **tune_kw)
    r = setting.report
    chosen = r["costs"][r["name"]]
    summary = {"setting": r["name"], "why": r["why"], "cpu": r["cpu"], "cpu_flags": r["machine"]["flags"],
               "cached": r["cached"], "one_token_ms": chosen["target_ms"][1], "v": chosen["v"],
               "ranking": r["ranking"], "skipped": r["skipped"]}
    if r.get("native"):  # the native pass's kernels and build flags ($SPECREPRO_NATIVE_CFLAGS)
        summary["native"] = {k: r["native"][k] for k in ("simd", "flags")}
        from ..engines.native import FLAGS

        summary["native_cflags"] = " ".join(f for f in r["native"]["flags"] if f not in FLAGS) or None
    return setting.target, summary


def with_pass_costs(draft, summary: dict, up_to: int = 64):
    """draft, with the tuned setting's measured v(n) (summary["v"] from tuned_target) given to every datastore
    draft in it (a hybrid's parts too: "lookup+datastore" holds it as the fallback, "datastore+<spec>" as the
    first proposer), so its stop rule weighs each proposed token against what verifying it costs on this
    machine. Other drafts are returned unchanged. Sizes past those tune measured (token trees of up to `up_to`
    nodes) get v extended linearly (datastore.extend_pass_costs)."""
    from ..drafts.datastore import DatastoreDraft, extend_pass_costs

    for part in (draft, getattr(draft, "fallback", None), getattr(draft, "lookup", None)):  # a hybrid's either part
        if isinstance(part, DatastoreDraft):
            part.pass_costs = extend_pass_costs(summary["v"], up_to)
    return draft


def parse_ks(text: str) -> list[int]:
    """'1,2,4' or '1-7' or '1,2,...,7'."""
    text = text.replace(" ", "")
    if ",...," in text:
        lo, hi = text.split(",...,")
        return list(range(int(lo.split(",")[0]), int(hi) + 1))
    out = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = part.split("-")
            out += range(int(lo), int(hi) + 1)
        elif part:
            out.append(int(part))
    bad = [k for k in out if not 1 <= k <= MAX_LOOKAHEAD]
    if not out or bad:
        raise ValueError(f"--ks: lookaheads must be integers in 1..{MAX_LOOKAHEAD}, got {text!r}")
    return out
