"""README's own-model-pair snippet runs as written, with two tiny local models in place of its hub ids."""
import re
from pathlib import Path

from helpers import word_tokenizer
from specrepro.stats.toy import tiny_llama

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["<unk>", "</s>", "Speculative", "sampling", "is", "fast", "exact", "."]


def snippet() -> str:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"<!-- own-pair -->\n```python\n(.*?)```", text, re.S)
    assert m, "README.md lost its own-pair snippet"
    return m.group(1)


def test_the_own_pair_snippet_runs(tmp_path, capsys):
    code = snippet()
    names = re.search(r'^TARGET, DRAFT = "([^"]+)", "([^"]+)"$', code, re.M)
    assert names, "the snippet names its pair on one line: TARGET, DRAFT = ..."
    dirs = []
    for seed, name in enumerate(("target", "draft")):
        d = tmp_path / name
        tiny_llama(seed, vocab=len(WORDS), layers=2 - seed, window=128).save_pretrained(d)
        word_tokenizer(WORDS).save_pretrained(d)
        dirs.append(str(d))
    code = code.replace(names.group(0), f"TARGET, DRAFT = {dirs[0]!r}, {dirs[1]!r}")
    exec(compile(code, "README.md (own pair)", "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"tau \d\.\d\d; SpS \d+\.\d\d s, ArS \d+\.\d\d s", out), out
