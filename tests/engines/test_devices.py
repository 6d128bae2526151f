"""Devices: a target dispatched by accelerate (split over CPU and disk offload), device checks and clear errors.

What a CPU can check: a tiny Llama loaded through `sr.load_model(..., device_map=..., offload_folder=...)` with
some layers (and the LM head) offloaded to disk gives the same logits as the plain model, greedy SpS equals
greedy ArS and HF generate on it, and its sampled joint passes the chi-square harness of test_lossless
(family-wise alpha 0.01; the deliberately wrong sampler on the same dispatched target must fail at that level).
The CUDA cases at the end run only where a GPU is visible.
"""
import os

import pytest
import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

import specrepro as sr
from helpers import tiny_llama
from specrepro.experiments import wrong
from specrepro.engines.lean import LeanRunner
from specrepro.engines.runners import HFRunner, input_device, is_dispatched, split_reason
from specrepro.algorithm.sampling import SamplingConfig, sample
from specrepro.stats.exact import chisquare_fit, exact_joint, truncate_outcome

VOCAB = 5
PROMPT = torch.tensor([0, 3])
SPLIT = {"model.embed_tokens": "cpu", "model.layers.0": "cpu", "model.layers.1": "disk", "model.layers.2": "disk",
         "model.norm": "cpu", "model.rotary_emb": "cpu", "lm_head": "disk"}
ALPHA = 0.01  # one correct test; the wrong sampler must reject at the same level
N = 1000


def save_tiny(path, seed=0, layers=3):
    """A tiny random Llama and a word-level tokenizer over its 5 ids, saved as a Hugging Face model directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    model = tiny_llama(seed, VOCAB, layers=layers, eos_token_id=None)
    model.save_pretrained(path)
    tok = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(path)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    plain = save_tiny(root / "target")
    split, _ = sr.load_model(root / "target", device_map=SPLIT, offload_folder=root / "offload")
    draft = tiny_llama(1, VOCAB, layers=1, eos_token_id=None)
    return plain, split, draft, root


def test_split_model_is_dispatched_and_offloaded(models):
    plain, split, _, _ = models
    assert is_dispatched(split) and not is_dispatched(plain)
    offloaded = {n.rsplit(".", 1)[0] for n, p in split.named_parameters() if p.device.type == "meta"}
    assert "lm_head" in offloaded and any(n.startswith("model.layers.1") for n in offloaded)
    assert "offloaded" in split_reason(split) and split_reason(plain) is None
    assert input_device(split) == torch.device("cpu")


def test_split_logits_equal_plain(models):
    plain, split, _, _ = models
    ids = torch.tensor([0, 3, 2, 4, 1, 2])
    a, b = HFRunner(plain), HFRunner(split)
    torch.testing.assert_close(a.forward(ids[:4]), b.forward(ids[:4]), rtol=0, atol=0)
    a.rollback(2), b.rollback(2)
    torch.testing.assert_close(a.forward(ids[2:]), b.forward(ids[2:]), rtol=0, atol=0)


def test_embedding_on_disk_runs_on_its_execution_device(models):
    plain, _, _, root = models
    on_disk = dict(SPLIT, **{"model.embed_tokens": "disk"})
    model, _ = sr.load_model(root / "target", device_map=on_disk)  # offload_folder: a temporary one
    assert model.get_input_embeddings().weight.device.type == "meta"
    assert input_device(model) == torch.device("cpu")
    want = sr.autoregressive_generate(plain, PROMPT, max_new_tokens=12, temperature=0).tokens
    assert torch.equal(sr.autoregressive_generate(model, PROMPT, max_new_tokens=12, temperature=0).tokens, want)


def test_auto_map_with_max_memory_offloads_to_disk(models):
    plain, _, _, root = models
    model, _ = sr.load_model(root / "target", device_map="auto", max_memory={"cpu": 4000},
                             offload_folder=root / "offload-auto")
    assert "disk" in set(model.hf_device_map.values())
    want = sr.autoregressive_generate(plain, PROMPT, max_new_tokens=12, temperature=0).tokens
    assert torch.equal(sr.autoregressive_generate(model, PROMPT, max_new_tokens=12, temperature=0).tokens, want)


def test_greedy_sps_equals_ars_and_hf_generate_on_split_target(models):
    plain, split, draft, _ = models
    n = 24
    hf = plain.generate(PROMPT.view(1, -1), max_new_tokens=n, do_sample=False, min_new_tokens=n)[0, len(PROMPT):]
    hf_split = split.generate(PROMPT.view(1, -1), max_new_tokens=n, do_sample=False, min_new_tokens=n)[0, len(PROMPT):]
    ars = sr.autoregressive_generate(split, PROMPT, max_new_tokens=n, temperature=0).tokens
    assert torch.equal(hf_split, hf) and torch.equal(ars, hf)
    for k in (1, 3, 5):
        sps = sr.speculative_generate(split, draft, PROMPT, max_new_tokens=n, lookahead=k, temperature=0)
        assert torch.equal(sps.tokens, hf), k
    # the split model as the draft, too (its runner moves the ids to its embedding's device)
    sps = sr.speculative_generate(plain, split, PROMPT, max_new_tokens=n, lookahead=4, temperature=0)
    assert torch.equal(sps.tokens, hf) and sum(sps.accepted) == n - sps.target_calls  # a perfect draft


def _draw(target, draft, k, seed, n=N, length=3, rules=None):
    g = torch.Generator().manual_seed(seed)
    return [truncate_outcome(sr.speculative_generate(target, draft, PROMPT, max_new_tokens=max(length, k + 1),
                                                     lookahead=k, generator=g, _rules=rules).tokens, length)
            for _ in range(n)]


@pytest.mark.slow  # ~85 s: every forward of the split model reads its disk-offloaded layers back
def test_sampled_joint_on_split_target_is_the_target_joint(models):
    plain, split, draft, _ = models
    expected = exact_joint(plain, PROMPT, 3, SamplingConfig())  # the undispatched model is the reference
    right = chisquare_fit(_draw(split, draft, 2, seed=11), expected)
    assert right.pvalue > ALPHA, right
    bad = chisquare_fit(_draw(split, draft, 2, seed=12, rules=wrong.chain_rules(wrong.resample_from_q)), expected)
    assert bad.pvalue < ALPHA, bad


def test_lean_runner_refuses_a_split_model(models):
    plain, split, _, _ = models
    with pytest.raises(TypeError, match="offloaded.*HF runner"):
        LeanRunner(split)
    LeanRunner(plain)  # the same model resident on one device is fine


def test_tune_runs_a_split_model_on_the_hf_runner(models):
    _, split, _, _ = models
    setting = sr.tune(split, None, threads=[1], cache=False)
    assert isinstance(setting.target, HFRunner) and setting.candidate.backend == "hf"
    gen = sr.autoregressive_generate(setting.target, PROMPT, max_new_tokens=6, temperature=0)
    assert torch.equal(gen.tokens, sr.autoregressive_generate(split, PROMPT, max_new_tokens=6, temperature=0).tokens)


def test_meta_weights_without_hooks_are_a_clear_error():
    with torch.device("meta"):
        empty = LlamaForCausalLM(tiny_llama(0, VOCAB).config)
    with pytest.raises(ValueError, match="meta.*never loaded"):
        HFRunner(empty)
    with pytest.raises(ValueError, match="meta.*never loaded"):
        sr.autoregressive_generate(empty, PROMPT, max_new_tokens=2)


def test_meta_input_ids_are_a_clear_error(tiny_pair):
    target, draft = tiny_pair
    with pytest.raises(ValueError, match="meta"):
        sr.speculative_generate(target, draft, PROMPT.to("meta"), max_new_tokens=2)


def test_bad_devices_and_maps_are_clear_errors(models):
    *_, root = models
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match="GPU|CUDA"):
        sr.load_model(root / "target", device=f"cuda:{gpus}" if gpus else "cuda")
    with pytest.raises(ValueError, match=f"lm_head.*GPU {gpus}.*{gpus} visible"):
        sr.load_model(root / "target", device_map=dict(SPLIT, lm_head=gpus))
    with pytest.raises(ValueError, match="device_map must be one of"):
        sr.load_model(root / "target", device_map="everywhere")
    with pytest.raises(ValueError, match="use a GPU index"):
        sr.load_model(root / "target", device_map=dict(SPLIT, lm_head="tpu"))
    with pytest.raises(ValueError, match="need a device_map"):
        sr.load_model(root / "target", max_memory={"cpu": "1GiB"})
    with pytest.raises(ValueError, match="'meta' holds no weights"):
        sr.load_model(root / "target", device="meta")


# make gpu-check sets SPECREPRO_REQUIRE_CUDA=1: there a missing GPU fails these tests instead of skipping them
cuda = pytest.mark.skipif(not torch.cuda.is_available() and not os.environ.get("SPECREPRO_REQUIRE_CUDA"),
                          reason="needs a CUDA GPU (make gpu-check runs these; listed in the README as unverified)")


@cuda
@pytest.mark.parametrize("runner", ["hf", "lean"])
def test_cpu_generator_drives_a_cuda_target(tiny_pair, runner):
    """A CPU generator with a CUDA model: draws happen on the CPU, so the same seed gives the same tokens as
    on the CPU whenever the two devices compute the same distributions (here: greedy and tiny models)."""
    target, draft = tiny_pair
    probs = torch.softmax(torch.randn(3, VOCAB), -1)
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    assert torch.equal(sample(probs.cuda(), g1).cpu(), sample(probs, g2))
    target.to("cuda"), draft.to("cuda")
    t, d = (LeanRunner(target), LeanRunner(draft)) if runner == "lean" else (target, draft)
    try:
        gen = sr.speculative_generate(t, d, PROMPT, max_new_tokens=8, generator=torch.Generator().manual_seed(0))
        assert len(gen.tokens) == 8
        cpu_draft = draft.to("cpu")  # a draft on another device than the target
        cpu_draft = LeanRunner(cpu_draft) if runner == "lean" else cpu_draft
        gen = sr.speculative_generate(t, cpu_draft, PROMPT, max_new_tokens=8, temperature=0)
        assert torch.equal(gen.tokens, sr.autoregressive_generate(t, PROMPT, max_new_tokens=8, temperature=0).tokens)
    finally:
        target.to("cpu"), draft.to("cpu")


def test_bench_runs_a_split_target_on_the_hf_runner(models):
    """The bench on a split target: our loop on the HF runner (no lean runner can exist), HF generate and
    HF assisted generation with the same draft, all greedy and equal."""
    from specrepro.bench import harness as bench

    plain, split, draft, _ = models
    with pytest.raises(TypeError, match="split|offload"):
        bench.Setup(split, draft, runners=("hf", "lean"))
    result = bench.bench(split, draft, [PROMPT], ks=(2,), max_new_tokens=6, reps=1, modes=("greedy",),
                         runners=("hf",))
    names = {r["name"] for r in result["summary"]}
    assert {"ours_ars/hf/greedy", "ours_sps/hf/greedy/K2", "hf_generate/hf/greedy"} <= names
    assert len({tuple(r["ids"]) for r in result["rows"]}) == 1
    assert set(result["costs"]) == {"hf"} and result["costs"]["hf"]["v"].keys() == {1, 2}
    assert result["machine"]["runners"]["hf"]["weight_bytes"] > 0


@cuda
@pytest.mark.parametrize("runner", ["hf", "lean"])
def test_cuda_greedy_chain_and_tree_equal_plain_greedy(runner):
    """On a GPU, in float32: greedy SpS with a chain and with token trees (the tree's 4-D mask, depth
    positions and KV compaction running on CUDA) equals greedy ArS and HF generate token for token."""
    from specrepro.drafts import ModelDraft
    from specrepro.algorithm.tree import TreeSpec

    target = tiny_llama(0, VOCAB, layers=3, eos_token_id=None).to("cuda")
    draft = tiny_llama(1, VOCAB, layers=1, eos_token_id=None).to("cuda")
    n, prompt = 24, PROMPT.to("cuda")
    hf = target.generate(prompt.view(1, -1), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(PROMPT):]
    t = LeanRunner(target) if runner == "lean" else target
    d = ModelDraft(LeanRunner(draft)) if runner == "lean" else draft
    ars = sr.autoregressive_generate(t, prompt, max_new_tokens=n, temperature=0)
    assert torch.equal(ars.tokens.cpu(), hf.cpu())
    for tree in (None, TreeSpec(2, 3), TreeSpec(3, 4, 10)):
        gen = sr.speculative_generate(t, d, prompt, max_new_tokens=n, lookahead=3, temperature=0, tree=tree)
        assert torch.equal(gen.tokens.cpu(), hf.cpu()), tree


@cuda
def test_cuda_tree_sampled_joint_is_the_target_joint():
    """The tree sampler with a CUDA target and draft (CPU generator) passes test_tree's chi-square harness
    against the exact joint of the same model on the CPU; a wrong rule on the same GPU pair fails it
    (2 tests, each at ALPHA: the right one must pass, the wrong one must reject)."""
    import copy

    from specrepro.drafts import ModelDraft
    from specrepro.algorithm.tree import TreeSpec
    from helpers import EOS, fit_tree as fit

    target, draft = tiny_llama(0), tiny_llama(3)  # test_tree's power pair
    gpu_target = LeanRunner(copy.deepcopy(target).to("cuda"))
    gpu_draft = ModelDraft(LeanRunner(copy.deepcopy(draft).to("cuda")))
    args = (TreeSpec(3, 2), SamplingConfig(1.0), EOS)
    right, _, stats = fit(gpu_target, gpu_draft, *args, seed=600, model=target)
    print(right)
    assert right.pvalue > ALPHA, right
    assert stats["accepted_any"] > 0
    bad, _, _ = fit(gpu_target, gpu_draft, *args, seed=601, model=target,
                    rules=wrong.tree_rules(wrong.tree_siblings_not_removed))
    print(bad)
    assert bad.pvalue < ALPHA, bad


# --- the static-shape runner's captured graphs, and every draft kind, on CUDA ---------------------------------

GRAPHS = ["cuda", "compile"]
CUDA_ALPHA = 0.01 / 2  # the two correct chi-square runs below (static runners; the feature draft's tree)


@cuda
@pytest.mark.parametrize("graphs", GRAPHS)
def test_cuda_graph_runner_matches_eager_lean(graphs):
    """Captured graphs (one per bucket) give the eager LeanRunner's float32 logits over blocks of 1..70
    tokens with rollbacks, trees and compaction, and greedy SpS equals HF generate token for token."""
    from specrepro.engines.static import StaticRunner
    from specrepro.drafts import ModelDraft
    from specrepro.algorithm.tree import TreeSpec

    target = tiny_llama(0, VOCAB, layers=3, eos_token_id=None, window=256).to("cuda")
    ids = torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(0)).cuda()
    lean, static = LeanRunner(target, keep_hidden=True), StaticRunner(target, capacity=64, keep_hidden=True,
                                                                      graphs=graphs)
    for start, end in [(0, 7), (7, 10), (8, 13), (13, 14), (14, 30), (15, 16), (16, 86), (80, 81), (81, 200)]:
        lean.rollback(start), static.rollback(start)
        torch.testing.assert_close(static.forward(ids[start:end]), lean.forward(ids[start:end]), atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(static.hidden, lean.hidden, atol=1e-4, rtol=1e-4)
    assert static.captures > 0 and static.capture_seconds > 0 and static.graphs == graphs
    draft = tiny_llama(1, VOCAB, layers=1, eos_token_id=None).to("cuda")
    n, prompt = 40, PROMPT.to("cuda")
    hf = target.generate(prompt.view(1, -1), max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, len(PROMPT):]
    t = StaticRunner(target, graphs=graphs)
    d = ModelDraft(StaticRunner(draft, graphs=graphs))
    assert torch.equal(sr.autoregressive_generate(t, prompt, max_new_tokens=n, temperature=0).tokens.cpu(), hf.cpu())
    for tree in (None, TreeSpec(2, 3), TreeSpec(4, 6, 40)):
        gen = sr.speculative_generate(t, d, prompt, max_new_tokens=n, lookahead=4, temperature=0, tree=tree)
        assert torch.equal(gen.tokens.cpu(), hf.cpu()), tree


def _cuda_drafts(target):
    """Every draft kind of specrepro.drafts for a CUDA target (untrained where trained ones need artifacts)."""
    from specrepro.drafts import FeatureDraft, HeadsDraft, HybridDraft, LookupDraft, SmallDraft, TruncatedDraft

    small = {"hidden": 16, "layers": 1, "ffn": 32, "head_dim": 8}
    return {
        "lookup": LookupDraft(VOCAB, max_ngram=2),
        "truncated": TruncatedDraft(target, n_layers=1),
        "small": SmallDraft.from_config(target, small),
        "feature": FeatureDraft.init_for(target, {"ffn": 32}, seed=3),
        "feature-reduced-vocab": FeatureDraft.init_for(target, {"ffn": 32}, keep=torch.tensor([0, 1, 3]), seed=4),
        "heads": HeadsDraft.init_for(target, {"heads": 3}, seed=5),
        "model": tiny_llama(1, VOCAB, layers=2, eos_token_id=None).to("cuda"),
        "lookup+feature": HybridDraft(FeatureDraft.init_for(target, {"ffn": 32}, seed=6), LookupDraft(VOCAB, max_ngram=2)),
    }


@cuda
@pytest.mark.parametrize("runner", ["lean", "static"])
def test_cuda_every_draft_kind_greedy_chain_and_tree(runner):
    """Every draft kind with a CUDA target: its state stays on the GPU (no device mix-ups), and greedy SpS
    (chain and tree) equals greedy ArS token for token."""
    from specrepro.engines.static import StaticRunner
    from specrepro.algorithm.tree import TreeSpec

    model = tiny_llama(0, VOCAB, layers=3, eos_token_id=None).to("cuda")
    drafts = _cuda_drafts(model)
    t = StaticRunner(model) if runner == "static" else LeanRunner(model)
    prompt = torch.tensor([0, 3, 2, 0, 3, 4, 0, 3], device="cuda")
    want = sr.autoregressive_generate(t, prompt, max_new_tokens=24, temperature=0).tokens.cpu()
    for name, draft in drafts.items():
        for tree in (None, TreeSpec(2, 3)):
            gen = sr.speculative_generate(t, draft, prompt, max_new_tokens=24, lookahead=3, temperature=0, tree=tree)
            assert torch.equal(gen.tokens.cpu(), want), (name, tree)
            sampled = sr.speculative_generate(t, draft, prompt, max_new_tokens=24, lookahead=3, tree=tree,
                                              generator=torch.Generator().manual_seed(0))
            assert len(sampled.tokens) == 24, (name, tree)
        if hasattr(draft, "device"):
            assert draft.device.type == "cuda", name
    from specrepro.drafts.base import as_draft

    assert isinstance(as_draft(drafts["model"]).runner, StaticRunner)  # model drafts' steps are graph-captured
    assert isinstance(drafts["small"].runner, StaticRunner) and isinstance(drafts["truncated"].runner, StaticRunner)


@cuda
def test_cuda_static_runners_tree_joint_and_feature_draft():
    """Chi-square against the exact joint with CUDA StaticRunner target and draft (graphs captured), and with
    the feature draft on a CUDA target (the kind that crashed on the H200); a wrong tree rule on the same
    GPU pair must be rejected. Family: the 2 correct runs, alpha 0.01 / 2."""
    import copy

    from specrepro.drafts import FeatureDraft, ModelDraft
    from specrepro.engines.static import StaticRunner
    from specrepro.algorithm.tree import TreeSpec

    from helpers import EOS, fit_tree as fit

    target, draft = tiny_llama(0), tiny_llama(3)
    gpu_target = copy.deepcopy(target).to("cuda")
    t = StaticRunner(gpu_target)
    d = ModelDraft(StaticRunner(copy.deepcopy(draft).to("cuda")))
    args = (TreeSpec(3, 2), SamplingConfig(1.0), EOS)
    right, _, stats = fit(t, d, *args, seed=610, model=target)
    print(right)
    assert right.pvalue > CUDA_ALPHA and stats["accepted_any"] > 0, right
    bad, _, _ = fit(t, d, *args, seed=611, model=target, rules=wrong.tree_rules(wrong.tree_siblings_not_removed))
    print(bad)
    assert bad.pvalue < CUDA_ALPHA, bad
    feature = FeatureDraft.init_for(gpu_target, {"ffn": 32}, seed=3)
    right, _, stats = fit(StaticRunner(gpu_target), feature, *args, seed=612, model=target)
    print(right)
    assert right.pvalue > CUDA_ALPHA and stats["accepted_any"] > 0, right
