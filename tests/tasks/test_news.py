"""News summarisation task: sentence splitting, splits, sources, prompts and ROUGE-2."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import types

import pytest

from specrepro.tasks import news
from specrepro.tasks.news import NewsExample, load_news, mean_rouge2, rouge2, summarisation_prompt
from specrepro.tasks.sentences import split_sentences


@pytest.mark.parametrize("text, expected", [
    ("Mr. Smith visited the U.S. Senate on Jan. 5. He left.",
     ["Mr. Smith visited the U.S. Senate on Jan. 5.", "He left."]),
    ("Growth was 2.5 per cent. Inflation was 3.1.", ["Growth was 2.5 per cent.", "Inflation was 3.1."]),
    ("George W. Bush spoke. Dr. Ahmad did not.", ["George W. Bush spoke.", "Dr. Ahmad did not."]),
    ('"The Taliban is finished." Meanwhile, talks went on.',
     ['"The Taliban is finished."', "Meanwhile, talks went on."]),
    ("He lives in the U.S. The rest is history.", ["He lives in the U.S.", "The rest is history."]),
    ("Is it over? Yes! it is.", ["Is it over?", "Yes! it is."]),
    ("They met at 4 p.m. on Monday. Nothing", ["They met at 4 p.m. on Monday.", "Nothing"]),
    ("", []),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_offline_examples_are_first_sentence_and_rest():
    examples, skipped = news.offline_examples()
    assert len(examples) + skipped == 300 and skipped < 10
    article = news.lee_corpus_path().read_text(encoding="utf-8").splitlines()[0]
    first = next(e for e in examples if e.id == "lee-000")
    assert article.startswith(first.reference)
    assert first.reference.endswith("Hill Top.")
    assert first.document.startswith("A new blaze near Goulburn")
    assert all(len(split_sentences(e.document)) >= news.MIN_DOCUMENT_SENTENCES for e in examples)


def test_splits_are_disjoint_deterministic_and_complete():
    eval_ids = {e.id for e in load_news("eval")}
    train_ids = {e.id for e in load_news("train")}
    assert len(eval_ids) == news.EVAL_SIZE
    assert not eval_ids & train_ids
    assert eval_ids | train_ids == {e.id for e in load_news("all")}
    assert [e.id for e in load_news("eval", n=5)] == [e.id for e in load_news("eval")][:5]
    assert {e.id for e in load_news("eval", seed=1)} != eval_ids


def test_bad_split_or_source_is_rejected():
    with pytest.raises(ValueError):
        load_news("test")
    with pytest.raises(ValueError):
        load_news(source="nonsense")


def test_missing_gensim_names_the_install_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)
    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps gensim"):
        news.lee_corpus_path()


def test_local_jsonl_source(tmp_path):
    records = [{"document": f"Body {i}.", "summary": f"Summary {i}.", "id": str(i)} for i in range(4)]
    records.append({"document": "Body 4.", "reference": "Reference 4."})
    path = tmp_path / "tiny.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    everything = load_news("all", source=str(path))
    assert sorted(e.id for e in everything) == ["0", "1", "2", "3", "tiny-4"]
    assert NewsExample("2", "Body 2.", "Summary 2.") in everything
    assert NewsExample("tiny-4", "Body 4.", "Reference 4.") in everything
    assert not {e.id for e in load_news("eval", source=str(path))} & {
        e.id for e in load_news("train", source=str(path))}


def test_xsum_mapping_with_fake_datasets(monkeypatch):
    calls = []

    def load_dataset(name, split):
        calls.append((name, split))
        return [{"document": "Doc A.", "summary": "Sum A.", "id": "38264402"},
                {"document": "Doc B.", "summary": "Sum B.", "id": "34227252"}]

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    examples = load_news("eval", source="xsum")
    assert calls == [("EdinburghNLP/xsum", "test")]
    assert sorted(examples, key=lambda e: e.id) == [
        NewsExample("34227252", "Doc B.", "Sum B."), NewsExample("38264402", "Doc A.", "Sum A.")]


def test_xsum_without_hub_raises_clear_error(monkeypatch):
    def unreachable(name, split):
        raise ConnectionError("offline")
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=unreachable))
    with pytest.raises(RuntimeError, match="Hugging Face Hub"):
        load_news(source="xsum")
    monkeypatch.setitem(sys.modules, "datasets", None)  # import now raises ImportError
    with pytest.raises(RuntimeError, match="datasets"):
        load_news(source="xsum")


class ChatTokenizer:
    """Stands in for SmolLM2-Instruct's tokenizer: a chat template, whitespace tokens."""

    chat_template = "chatml"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}

    def decode(self, ids):
        return " ".join(ids)

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        assert add_generation_prompt and not tokenize
        (message,) = messages
        return f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n<|im_start|>assistant\n"


def test_summarisation_prompt_plain_and_chat():
    example = NewsExample("x", "one two three four five", "ref")
    plain = summarisation_prompt(example, max_document_tokens=3)
    assert "one sentence" in plain and "one two three" in plain and "four" not in plain
    chat = summarisation_prompt(example, tokenizer=ChatTokenizer(), max_document_tokens=2)
    assert chat.startswith("<|im_start|>user\n") and chat.endswith("<|im_start|>assistant\n")
    assert "one two" in chat and "three" not in chat


def test_rouge2():
    assert rouge2("the cat sat on the mat", "the cat sat on the mat") == pytest.approx(1.0)
    assert rouge2("completely different words", "the cat sat on the mat") == 0.0
    # Stemming: "sitting"/"sits" share the stem "sit", so the bigram "cat sit" matches.
    assert rouge2("the cat sits", "the cat sitting") == pytest.approx(1.0)
    assert mean_rouge2(["a b c", "x y"], ["a b c", "p q"]) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        mean_rouge2(["a"], [])


def test_packaged_file_that_went_missing_names_the_reinstall(monkeypatch, tmp_path):
    class Dist:
        def locate_file(self, relative):
            return tmp_path / relative

    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: Dist())
    with pytest.raises(FileNotFoundError, match="gensim is installed but .* is missing.*--force-reinstall"):
        news.lee_corpus_path()
