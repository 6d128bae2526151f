"""The package's layout: layers that import downwards only, and a public API that stays as it was."""
import ast
from pathlib import Path

import pytest

import specrepro as sr

PKG = Path(sr.__file__).parent


def module_name(path: Path) -> str:
    parts = ("specrepro",) + path.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every specrepro module that a module imports, at top level or inside a function."""
    return imports_from_source(path.read_text(), module_name(path), path.name == "__init__.py")


def imports_from_source(source: str, here: str, is_package: bool) -> set[str]:
    package = here if is_package else here.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
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
    import specrepro.tuning.tune  # the room of that name must not hide the function

    assert callable(sr.tune) and sr.tune is specrepro.tuning.tune.tune


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
    for path in sorted([*PKG.rglob("*.py"), *PKG.rglob("*.cpp")]):
        h.update(path.relative_to(PKG).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    assert results.code_digest() == h.hexdigest()[:12]  # every subpackage and the C++ pass, not the experiments folder alone
    assert (records.repo_root() / "notebooks" / "params").is_dir()


# The layers, bottom first: a module may import its own layer and those below it, never one above. The
# package's own __init__ (the `sr.` facade) is the only module outside them.
LAYERS = [
    ("base", ("specrepro.files", "specrepro.packaged", "specrepro.models", "specrepro.tasks")),
    ("engines", ("specrepro.engines",)),
    ("algorithm", ("specrepro.algorithm",)),
    ("drafts", ("specrepro.drafts",)),
    ("generate", ("specrepro.generate",)),
    ("training", ("specrepro.training",)),
    ("stats", ("specrepro.stats",)),
    ("tuning", ("specrepro.tuning",)),
    ("experiments", ("specrepro.experiments",)),
    ("bench", ("specrepro.bench",)),
    ("cli", ("specrepro.cli",)),
]


def layer_of(module: str) -> int | None:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import (top-level or inside a function) from a module to a layer above its own."""
    out = []
    for a, targets in sorted(graph.items()):
        for b in sorted(targets):
            if a == "specrepro" or b == "specrepro":
                continue
            la, lb = layer_of(a), layer_of(b)
            if la is not None and lb is not None and lb > la:
                out.append(f"{a} ({LAYERS[la][0]}) imports {b} ({LAYERS[lb][0]})")
    return out


def test_every_module_sits_in_a_layer():
    assert [m for m in import_graph() if m != "specrepro" and layer_of(m) is None] == []


def test_no_module_imports_a_layer_above_its_own():
    assert upward_imports(import_graph()) == []


def test_the_layer_check_finds_an_upward_import():
    # the tuning loop under engines/ calling Algorithm 2, as it once did, and a lazy import inside a function
    graph = {"specrepro.engines.tuning": {"specrepro.algorithm.speculative", "specrepro.engines.lean"},
             "specrepro.algorithm.speculative": {"specrepro.drafts.base"}}
    assert upward_imports(graph) == [
        "specrepro.algorithm.speculative (algorithm) imports specrepro.drafts.base (drafts)",
        "specrepro.engines.tuning (engines) imports specrepro.algorithm.speculative (algorithm)",
    ]
    body = "def f():\n    from ..algorithm import speculative\n"
    assert "specrepro.algorithm.speculative" in imports_from_source(body, "specrepro.engines.tuning", False)


def test_the_algorithm_room_holds_the_paper():
    from specrepro.algorithm import speculative, tree

    for name in ("sampling_loop", "rejection_step"):
        assert callable(getattr(speculative, name))
    for name in ("accept", "verify", "generate"):
        assert callable(getattr(tree, name))


def test_loading_a_draft_imports_no_training_module(tmp_path):
    """specrepro.drafts loads what specrepro.training makes; building every kind from the table, and loading a
    trained artifact through `load`, must not pull the trainers in (their data pipelines, corpora, CLIs)."""
    import subprocess
    import sys

    code = """
import sys
import torch
from transformers import LlamaConfig, LlamaForCausalLM
import specrepro as sr
from specrepro.drafts.kinds import TABLE
from specrepro.files import write_json
torch.manual_seed(0)
target = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=5,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128))
target.config.name_or_path = "tiny"
for name in ("lookup", "truncated"):
    sr.drafts.load(name, target=target)
row = TABLE["heads"]
cfg = {"kind": "heads", "target": "tiny", "seed": 0} | row.defaults | {"heads": 2}
net = row.build_net(target, cfg, None)
from safetensors.torch import save_file
import pathlib
out = pathlib.Path(sys.argv[1]) / "heads-x"
out.mkdir()
save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(out / "net.safetensors"))
write_json(out / "config.json", cfg)
write_json(out / "complete.json", {})
draft = sr.drafts.load("heads", target=target, root=sys.argv[1])
assert type(draft).__name__ == "HeadsDraft", draft
loaded = sorted(m for m in sys.modules if m.startswith("specrepro.training"))
print("TRAINING", loaded)
"""
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TRAINING []" in out.stdout, out.stdout


def test_every_kind_has_one_row_that_builds_it():
    from specrepro.drafts import kinds

    assert set(kinds.KINDS) | set(kinds.FREE_KINDS) == set(kinds.TABLE)
    for name, row in kinds.TABLE.items():
        assert row.name == name
        if row.trained:
            assert row.build_net and row.wrap and row.defaults, name
        else:
            assert row.make, name
    assert {k for k, row in kinds.TABLE.items() if row.cuttable_head} == {"feature", "heads"}
    with pytest.raises(ValueError, match="unknown draft kind 'nope'"):
        kinds.check_kind("nope")
