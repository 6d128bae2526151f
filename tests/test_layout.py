"""The package's layout: layers that import downwards only, and a public API that stays as it was."""
import ast
from pathlib import Path

import specrepro as sr

PKG = Path(sr.__file__).parent


def module_name(path: Path) -> str:
    parts = ("specrepro",) + path.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every specrepro module that a module imports, at top level or inside a function."""
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names)  # `from pkg import module`
    return found


def import_graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in PKG.rglob("*.py")}
    return {name: {m for m in imports_of(path) if m in modules and m != name}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), a package's __init__ excluded:
    `from .drafts import x` runs drafts/__init__, which imports its own submodules by design."""
    graph = {k: {m for m in v if m not in PACKAGES} for k, v in graph.items() if k not in PACKAGES}
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


PACKAGES = {module_name(p) for p in PKG.rglob("__init__.py")}


def test_no_module_imports_itself_back():
    assert cycles(import_graph()) == []


def test_the_cycle_finder_finds_a_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_subpackages_say_what_they_hold():
    for init in PKG.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init} has no docstring saying what the subpackage holds"


def test_public_api_unchanged():
    assert sorted(sr.__all__) == sorted([
        "Generation", "HFRunner", "LeanRunner", "ModelLoadError", "SamplingConfig", "Setting", "TreeSpec",
        "autoregressive_generate", "check_tokenizers", "drafts", "load_model", "logits_to_probs",
        "rejection_step", "sample", "specrepro_home", "speculative_generate", "speculative_generate_batch",
        "stop_at_text", "tune"])
    for name in sr.__all__:
        assert getattr(sr, name) is not None


def test_console_scripts_resolve_and_answer_help():
    import importlib
    import tomllib

    scripts = tomllib.loads((PKG.parent / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"specrepro-reproduce", "specrepro-bench", "specrepro-tune", "specrepro-drafts"} <= set(scripts)
    for name, entry in scripts.items():
        module, func = entry.split(":")
        fn = getattr(importlib.import_module(module), func)
        argv = ["train", "--help"] if name == "specrepro-drafts" else ["--help"]
        try:
            rc = fn(argv)
        except SystemExit as stop:  # argparse's --help
            rc = stop.code
        assert rc == 0, name


def test_drafts_script_names_its_commands_when_called_wrong(capsys):
    from specrepro import cli

    assert cli.drafts(["nonsense"]) == 2
    assert "train" in capsys.readouterr().err


def test_code_digest_and_repo_root_see_the_whole_checkout():
    import hashlib

    from specrepro.experiments import records, results

    h = hashlib.sha256()
    for path in sorted(PKG.rglob("*.py")):
        h.update(path.relative_to(PKG).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    assert results.code_digest() == h.hexdigest()[:12]  # every subpackage, not the experiments folder alone
    assert (records.repo_root() / "notebooks" / "params").is_dir()


def test_lower_layers_never_import_the_reproduction_or_the_bench():
    """experiments/ and bench/ sit on top: the algorithm, engines, drafts, tasks and stats work without them."""
    top = ("specrepro.experiments", "specrepro.bench")
    offenders = [(a, b) for a, bs in import_graph().items() for b in bs
                 if b.startswith(top) and not a.startswith(top) and a not in ("specrepro.cli",)]
    assert offenders == []
