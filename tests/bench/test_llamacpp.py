"""llama.cpp as a measured peer, run for real on a tiny GGUF written here with the `gguf` package's writer.

The tiny file holds the weights of a random tiny Llama; llama.cpp must decode it as our runners decode the
same model (logits within float32 round-off, the same greedy tokens), and a file written without the Q/K
permutation GGUF's llama layout needs must be caught. Without llama_cpp these tests skip with one line
saying so; the argument checks run either way. No timing assertions: a benchmark is not a test.
"""
import numpy as np
import pytest
import torch

from helpers import llama
from specrepro.bench import harness as bench
from specrepro.bench import llamacpp
from specrepro.drafts.lookup import LookupDraft
from specrepro.engines.lean import LeanRunner
from specrepro.experiments import workloads

REASON = llamacpp.unavailable_reason()
needs_llamacpp = pytest.mark.skipif(REASON is not None, reason=f"llama.cpp peer not tested: {REASON}")
VOCAB = 64


def tiny(seed=0, layers=2):
    model = llama(seed, vocab=VOCAB, layers=layers, tied=True, window=256, hidden=64, rms_norm_eps=1e-5)
    with torch.no_grad():  # larger weights than HF's init: logit gaps well above float32 round-off
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2)
    return model


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """HF's half-split RoPE rows -> GGUF llama's interleaved pairs (what llama.cpp's HF converter does)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(model, path, permute=True) -> None:
    """The tiny Llama as a float32 llama-architecture GGUF with a 64-token SentencePiece-style vocabulary."""
    import gguf

    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_block_count(c.num_hidden_layers)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_rope_freq_base(float(getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]))
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(c.vocab_size)
    w.add_file_type(0)  # all float32
    tokens = ["<s>", "</s>", "<unk>", "<0x0A>"] + [f"\u2581t{i}" for i in range(c.vocab_size - 4)]
    types = [3, 3, 2, 6] + [1] * (c.vocab_size - 4)  # control, control, unknown, byte, normal...
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * c.vocab_size)
    w.add_token_types(types)
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_unk_token_id(2)

    def t(name, tensor, heads=None):
        a = tensor.detach().float().numpy().copy()
        w.add_tensor(name, _permute(a, heads) if heads and permute else a)

    base = model.model
    t("token_embd.weight", base.embed_tokens.weight)  # tied: llama.cpp uses it as the output too
    t("output_norm.weight", base.norm.weight)
    for i, layer in enumerate(base.layers):
        a, m = layer.self_attn, layer.mlp
        t(f"blk.{i}.attn_norm.weight", layer.input_layernorm.weight)
        t(f"blk.{i}.attn_q.weight", a.q_proj.weight, c.num_attention_heads)
        t(f"blk.{i}.attn_k.weight", a.k_proj.weight, c.num_key_value_heads)
        t(f"blk.{i}.attn_v.weight", a.v_proj.weight)
        t(f"blk.{i}.attn_output.weight", a.o_proj.weight)
        t(f"blk.{i}.ffn_norm.weight", layer.post_attention_layernorm.weight)
        t(f"blk.{i}.ffn_gate.weight", m.gate_proj.weight)
        t(f"blk.{i}.ffn_up.weight", m.up_proj.weight)
        t(f"blk.{i}.ffn_down.weight", m.down_proj.weight)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _prompt():
    return workloads.builtin_prompts("news", None, n=1, vocab=VOCAB)[0]


def _ours_greedy(model, prompt, n):
    runner = LeanRunner(model, dtype=torch.float32)
    logits = runner.forward(prompt)[-1]
    first = logits.clone()
    out = []
    for _ in range(n):
        tok = int(torch.argmax(logits))
        out.append(tok)
        logits = runner.forward(torch.tensor([tok]))[-1]
    return first, out


@needs_llamacpp
def test_peer_decodes_the_same_weights_as_our_runner(tmp_path):
    model = tiny()
    path = tmp_path / "tiny.F32.gguf"
    write_gguf(model, path)
    assert llamacpp.tensor_types(path) == {"F32": 2 + 9 * 2}
    prompt = _prompt()
    peer = llamacpp.LlamaCppPeer(path, threads=1, n_ctx=128)
    assert peer.vocab_size == VOCAB
    first, want = _ours_greedy(model, prompt, 16)
    got = peer.generate(prompt, 16, temperature=0.0)
    assert got["ids"] == want and got["tokens"] == 16 and got["seconds"] >= got["decode_seconds"] > 0
    peer.llm.reset()
    peer.llm.eval([int(t) for t in prompt])
    # llama.cpp keeps its KV cache in F16 by default (what a user gets): keys and values rounded to F16
    torch.testing.assert_close(peer.logits(), first, atol=2e-2, rtol=2e-2)
    # T = 1: our sampler over llama.cpp's logits, reproducible with the same seed
    a = peer.generate(prompt, 12, 1.0, torch.Generator().manual_seed(3))["ids"]
    b = peer.generate(prompt, 12, 1.0, torch.Generator().manual_seed(3))["ids"]
    assert a == b and len(set(a)) > 1
    # a pass over n tokens after the prompt: llama.cpp's v(K), measured as our costs table is shaped
    costs = peer.costs(prompt, [1, 3], reps=2)
    assert set(costs["target_ms"]) == {1, 2, 4} and set(costs["v"]) == {1, 3} and all(v > 0 for v in costs["v"].values())
    # the pass_ms cache trim leaves the peer decoding as before
    assert peer.generate(prompt, 16, temperature=0.0)["ids"] == want


@needs_llamacpp
def test_a_file_without_the_qk_permutation_is_caught(tmp_path):
    """The deliberately wrong variant: HF's Q/K rows as they are, RoPE pairs wrong; the logits must differ."""
    model = tiny()
    path = tmp_path / "wrong.gguf"
    write_gguf(model, path, permute=False)
    prompt = _prompt()
    peer = llamacpp.LlamaCppPeer(path, threads=1, n_ctx=128)
    peer.llm.eval([int(t) for t in prompt])
    first, _ = _ours_greedy(model, prompt, 1)
    assert (peer.logits() - first).abs().max() > 0.2  # 10x the tolerance the right file is held to


@needs_llamacpp
def test_conversions_hold_the_type_and_the_same_weights(tmp_path):
    model = tiny()
    src = tmp_path / "tiny.gguf"
    write_gguf(model, src)
    prompt = _prompt()
    first, _ = _ours_greedy(model, prompt, 1)
    for kind, tol in (("f16", 2e-2), ("bf16", 1e-1)):
        path = llamacpp.convert(src, kind, tmp_path / "conv")
        types = llamacpp.tensor_types(path)
        assert types == {kind.upper(): 2 * 7 + 1, "F32": 2 * 2 + 1}, types  # the matrices and embedding; norms stay F32
        assert llamacpp.convert(src, kind, tmp_path / "conv") == path  # cached
        peer = llamacpp.LlamaCppPeer(path, threads=1, n_ctx=128)
        peer.llm.eval([int(t) for t in prompt])
        torch.testing.assert_close(peer.logits(), first, atol=tol, rtol=tol)
    with pytest.raises(ValueError, match="kind must be one of"):
        llamacpp.convert(src, "q8_0", tmp_path)
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        llamacpp.convert(tmp_path / "missing.gguf", "f16", tmp_path)


@needs_llamacpp
def test_bench_times_the_peer_beside_ours_on_the_same_ids(tmp_path):
    model = tiny()
    path = tmp_path / "tiny.gguf"
    write_gguf(model, path)
    peer = llamacpp.LlamaCppPeer(path, threads=1, n_ctx=128, name="f32")
    prompts = workloads.builtin_prompts("code", None, n=2, vocab=VOCAB)
    result = bench.bench(model, LookupDraft(VOCAB), prompts, ks=(2,), max_new_tokens=8, reps=2, modes=("greedy", "sample"),
                         runners=("lean",), hf=False, peers={"f32": peer})
    rows = {r["name"]: r for r in result["summary"]}
    assert {"llamacpp/f32/greedy", "llamacpp/f32/sample", "ours_ars/lean/greedy", "ours_sps/lean/greedy/K2"} <= set(rows)
    assert rows["ours_ars/lean/greedy"]["speedup_vs_llamacpp"] > 0 and rows["llamacpp/f32/greedy"]["runs"] == 4
    greedy = [r for r in result["rows"] if r["mode"] == "greedy"]
    for p in range(2):  # greedy: llama.cpp, our ArS and our SpS emit the same tokens per prompt
        assert len({tuple(r["ids"]) for r in greedy if r["prompt"] == p}) == 1
    line = next(h for h in result["headline"] if h["mode"] == "greedy")
    assert line["ars_vs_llamacpp_f32"] > 0 and line["sps_vs_llamacpp_f32"] > 0 and line["sps_decode_vs_llamacpp_f32"] > 0
    assert rows["ours_sps/lean/greedy/K2"]["decode_speedup_vs_llamacpp"] > 0
    assert result["costs"]["llamacpp:f32"]["v"][2] > 0
    csv_path, _ = bench.write_results(result, tmp_path / "b")
    assert "speedup_vs_llamacpp" in csv_path.read_text().splitlines()[0]


def test_bad_peer_arguments_are_clear_errors(capsys):
    with pytest.raises(ValueError, match="unknown llama.cpp peer"):
        llamacpp.check_peers(["q4_1", "q8"])
    assert llamacpp.check_peers(["Q4_1", " f16", ""]) == ["q4_1", "f16"]
    with pytest.raises(SystemExit):
        bench.main(["--llamacpp", "q5"])
    assert "unknown llama.cpp peer" in capsys.readouterr().err


@pytest.mark.skipif(REASON is None, reason="llama_cpp is importable here")
def test_without_llamacpp_the_peer_says_how_to_install_it(capsys):
    with pytest.raises(RuntimeError, match="specrepro\\[llamacpp\\]"):
        llamacpp.LlamaCppPeer("x.gguf")
    with pytest.raises(SystemExit):
        bench.main(["--llamacpp", "q4_1"])
    assert "not importable" in capsys.readouterr().err
