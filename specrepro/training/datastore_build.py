"""Writing the datastore draft's text: the target's own greedy continuations of training prompts.

specrepro-drafts datastore build [--news 199] [--code 400] [--news-tokens 64] [--code-tokens 96]
    [--piece 8] [--out runs/datastore/tokens.jsonl] [--threads 2]
specrepro-drafts datastore ship [--build runs/datastore/tokens.jsonl] [--to artifacts/drafts/datastore]
    (the build's options again, for the manifest)
specrepro-drafts datastore info [--path FILE]

Prompts (never HumanEval, never the held-out news articles):
- news: the summarisation request (specrepro.tasks.news.summarisation_prompt, as the evaluation asks it) for
  each article of the news TRAIN split;
- code: module-level public functions of CPython's standard library (training/corpus.stdlib_files), signature
  and docstring, asked as HumanEval's chat prompt asks (specrepro.tasks.humaneval.code_prompt).
The target (LeanRunner, bfloat16, the native pass where it builds, else the default backend) writes greedy
continuations, stopping at EOS. Results are appended to a JSONL file one piece at a time (each piece one
write of whole lines, flushed and fsynced): rerunning the same command skips the prompts already written
and continues, and a torn last line from an interrupted write is dropped.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import platform
import random
import time
from pathlib import Path

import torch

from .corpus import news_texts, stdlib_files

TAIL = 8  # prompt tokens kept before each continuation (what the index sees before the first written token)
MAX_PROMPT_TOKENS = 900


def stdlib_functions(n: int, seed: int = 0, max_doc_chars: int = 600) -> list[tuple[str, str]]:
    """(id, signature + docstring) of up to n public module-level stdlib functions with a docstring, in a
    seeded random order of modules, at most 3 per module (so the prompts mix packages)."""
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = stdlib_files()
    random.Random(seed).shuffle(files)
    out = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (UnicodeDecodeError, SyntaxError, OSError, ValueError):
            continue
        lines = text.splitlines(keepends=True)
        taken = 0
        for node in tree.body:
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.name.startswith("_"):
                continue
            doc = node.body[0] if node.body else None
            if not (isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant)
                    and isinstance(doc.value.value, str)) or len(doc.value.value) > max_doc_chars:
                continue
            if len(node.body) < 2:  # a docstring alone: nothing to continue with
                continue
            module = ".".join(path.relative_to(root).with_suffix("").parts)
            out.append((f"{module}.{node.name}", "".join(lines[node.lineno - 1: doc.end_lineno])))
            taken += 1
            if taken == 3:
                break
        if len(out) >= n:
            break
    return out[:n]


def training_prompts(tokenizer, n_news: int, n_code: int, seed: int = 0) -> list[dict]:
    """[{id, kind, prompt}]: news train summarisation requests and stdlib function prompts, interleaved (so
    that a build stopped early holds both kinds)."""
    from ..tasks.humaneval import HumanEvalProblem, code_prompt
    from ..tasks.news import load_news, summarisation_prompt

    news = [{"id": e.id, "kind": "news", "prompt": summarisation_prompt(e, tokenizer, max_document_tokens=384)}
            for e in load_news("train")[:n_news]]
    code = [{"id": f"stdlib:{name}", "kind": "code",
             "prompt": code_prompt(HumanEvalProblem(name, src, "", "", name.split(".")[-1]), tokenizer)}
            for name, src in stdlib_functions(n_code, seed)]
    out = []
    for i in range(max(len(news), len(code))):
        out += [x[i] for x in (code, news) if i < len(x)]
    return out


def read_records(path: Path) -> list[dict]:
    """The complete records of a build file (a torn last line from an interrupted write is ignored)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def append_records(path: Path, records: list[dict]) -> None:
    """One write of whole lines, flushed to disk before returning."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    with open(path, "a", encoding="utf-8") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def target_runner(model):
    """(runner, description): LeanRunner in bfloat16 with the native pass where it builds, else the default."""
    from ..engines.lean import LeanRunner

    try:
        return LeanRunner(model, dtype=torch.bfloat16, capacity=1024, backend="native"), "lean bfloat16 native"
    except Exception as err:  # noqa: BLE001 - a machine without a compiler or the CPU features
        print(f"native pass unavailable ({type(err).__name__}: {err}); using the lean bfloat16 eager pass")
        return LeanRunner(model, dtype=torch.bfloat16, capacity=1024), "lean bfloat16 eager"


def build(out: Path, n_news: int, n_code: int, news_tokens: int, code_tokens: int, piece: int = 8,
          target: str = "smollm2-135m-instruct", seed: int = 0) -> list[dict]:
    from tqdm.auto import tqdm

    from ..algorithm.sampling import SamplingConfig
    from ..algorithm.speculative import StopRule, sampling_loop
    from ..models import load_model

    model, tokenizer = load_model(target)
    prompts = training_prompts(tokenizer, n_news, n_code, seed)
    done = {r["id"] for r in read_records(out)}
    todo = [p for p in prompts if p["id"] not in done]
    print(f"{len(prompts)} prompts ({sum(p['kind'] == 'news' for p in prompts)} news, "
          f"{sum(p['kind'] == 'code' for p in prompts)} code); {len(done)} already in {out}, {len(todo)} to write")
    if not todo:
        return read_records(out)
    runner, how = target_runner(model)
    greedy = SamplingConfig(0.0)
    stops = StopRule(frozenset({tokenizer.eos_token_id}), None)
    bar = tqdm(total=len(todo), desc=f"target continuations ({how})")
    for i in range(0, len(todo), piece):
        records = []
        for item in todo[i: i + piece]:
            ids = tokenizer(item["prompt"], add_special_tokens=False, return_tensors="pt")["input_ids"][0]
            if ids.shape[0] > MAX_PROMPT_TOKENS:
                records.append({"id": item["id"], "kind": item["kind"], "tail": [], "tokens": [], "skipped": "long"})
                continue
            new = news_tokens if item["kind"] == "news" else code_tokens
            start = time.perf_counter()
            gen = sampling_loop(runner, None, ids, new, 0, greedy, stops)
            records.append({"id": item["id"], "kind": item["kind"], "tail": ids[-TAIL:].tolist(),
                            "tokens": gen.tokens.tolist(), "seconds": round(time.perf_counter() - start, 3)})
            bar.update(1)
        append_records(out, records)
    bar.close()
    return read_records(out)


def ship(build_file: Path, to: Path, settings: dict) -> dict:
    """Write <to>/tokens.jsonl.gz (the build's records, gzip with no timestamp: the same records give the same
    bytes) and <to>/manifest.json (how they were made, and their sizes)."""
    import gzip
    import subprocess

    from ..drafts.datastore import Datastore

    records = read_records(build_file)
    if not records:
        raise ValueError(f"{build_file} holds no records: run specrepro-drafts datastore build first")
    to.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps({k: r[k] for k in ("id", "kind", "tail", "tokens")}, separators=(",", ":")) + "\n"
                    for r in records)
    tokens_file = to / "tokens.jsonl.gz"
    tmp = tokens_file.with_suffix(f".tmp-{os.getpid()}")
    with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="") as f:
        f.write(lines.encode())
    os.replace(tmp, tokens_file)
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                                cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = None
    start = time.perf_counter()
    store = Datastore.from_file(tokens_file)
    per_kind = {kind: {"prompts": sum(r["kind"] == kind for r in records),
                       "written_tokens": sum(len(r["tokens"]) for r in records if r["kind"] == kind),
                       "generation_seconds": round(sum(r.get("seconds", 0) for r in records if r["kind"] == kind), 1)}
                for kind in ("news", "code")}
    manifest = {
        "what": "greedy continuations written by the target on training prompts (never HumanEval, never the "
                "held-out news eval split), for specrepro.drafts.datastore",
        "target": settings["target"], "runner": settings["runner"], "settings": settings,
        "per_kind": per_kind, "sequences": store.n_sequences, "tokens_indexed": store.n_tokens,
        "tail_tokens_per_sequence": TAIL, "skipped_long_prompts": sum(bool(r.get("skipped")) for r in records),
        "file": tokens_file.name, "bytes": tokens_file.stat().st_size,
        "index_seconds_here": round(time.perf_counter() - start, 3),
        "python_stdlib": platform.python_version(), "torch": torch.__version__, "commit": commit,
    }
    (to / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv=None):
    parser = argparse.ArgumentParser(prog="specrepro-drafts datastore", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="make the target write continuations of the training prompts (resumable)")
    b.add_argument("--news", type=int, default=199, help="news train articles")
    b.add_argument("--code", type=int, default=400, help="stdlib function prompts")
    b.add_argument("--news-tokens", type=int, default=64)
    b.add_argument("--code-tokens", type=int, default=96)
    b.add_argument("--piece", type=int, default=8, help="prompts per appended piece")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--threads", type=int, default=None, help="torch threads (default: the usable CPUs)")
    b.add_argument("--out", default="runs/datastore/tokens.jsonl")
    s = sub.add_parser("ship", help="write the shipped token file and its manifest from a build file")
    s.add_argument("--build", default="runs/datastore/tokens.jsonl")
    s.add_argument("--to", default=None, help="default: the repository's artifacts/drafts/datastore")
    for flag, default in (("--news", 199), ("--code", 400), ("--news-tokens", 64), ("--code-tokens", 96),
                          ("--seed", 0)):
        s.add_argument(flag, type=int, default=default, help="as given to build (recorded in the manifest)")
    s.add_argument("--runner", default="lean bfloat16 native", help="as build reported it")
    i = sub.add_parser("info", help="sizes of a token file and its index")
    i.add_argument("--path", default=None, help="default: the shipped token file")
    args = parser.parse_args(argv)
    if args.command == "build":
        for name in ("news", "code", "news_tokens", "code_tokens", "piece"):
            value = getattr(args, name)
            if value < (1 if name == "piece" else 0):
                parser.error(f"--{name.replace('_', '-')} must be >= {1 if name == 'piece' else 0}, got {value}")
        from ..engines.lean import set_threads

        set_threads(args.threads)
        records = build(Path(args.out), args.news, args.code, args.news_tokens, args.code_tokens, args.piece,
                        seed=args.seed)
        print(f"{len(records)} records, {sum(len(r['tokens']) for r in records)} target-written tokens in {args.out}")
        return records
    from ..drafts.datastore import Datastore, shipped_tokens

    if args.command == "ship":
        settings = {"target": "smollm2-135m-instruct", "runner": args.runner, "news_train_articles": args.news,
                    "stdlib_functions": args.code, "news_new_tokens": args.news_tokens,
                    "code_new_tokens": args.code_tokens, "seed": args.seed, "decoding": "greedy, stop at EOS",
                    "news_prompt": "tasks.news.summarisation_prompt(max_document_tokens=384), news train split",
                    "code_prompt": "tasks.humaneval.code_prompt over stdlib signature + docstring "
                                   "(datastore_build.stdlib_functions)"}
        to = Path(args.to) if args.to else shipped_tokens().parent
        manifest = ship(Path(args.build), to, settings)
        print(json.dumps({k: manifest[k] for k in ("sequences", "tokens_indexed", "bytes")}))
        return manifest

    path = Path(args.path) if args.path else shipped_tokens()
    start = time.perf_counter()
    store = Datastore.from_file(path)
    info = {"path": str(path), "bytes": path.stat().st_size, "sequences": store.n_sequences,
            "tokens": store.n_tokens, "index_seconds": round(time.perf_counter() - start, 3),
            "python": platform.python_version()}
    print(json.dumps(info, indent=1))
    return info


if __name__ == "__main__":
    main()
