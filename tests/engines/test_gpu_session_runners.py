"""What the GPU check relies on, shown on the CPU: the HF runner on a GPU image's older transformers
(`past_key_values=` before 5.24) gives the current path's logits, and the static runner's passes never read
a device value on the host (helpers.HostSyncs records every call that would synchronise a GPU)."""

import warnings

import pytest
import torch
from helpers import HostSyncs, llama, run_chunks

import specrepro as sr
from specrepro.algorithm import tree as tree_module
from specrepro.engines import runners
from specrepro.engines.runners import HFRunner
from specrepro.engines.static import StaticRunner
from specrepro.stats.toy import tiny_llama


def test_the_trap_sees_every_host_read():
    x = torch.tensor([1.0, 0.0, 2.0])
    with HostSyncs() as trap:
        x[0].item(), x.tolist(), bool(x[0]), int(x[0]), float(x[0]), x.nonzero(), torch.nonzero(x)
        torch.where(x > 0), x.masked_select(x > 0), [1, 2, 3][x.long()[1]], x.cpu(), x.to("cpu")
        x.to(x.device), x.to(torch.device("cpu")), x.to(torch.float64)  # a CPU tensor to its own device: no copy
        if x[1] > 0:
            pass
        torch.where(x > 0, x, x)  # three arguments: no sync
        with pytest.raises(NotImplementedError):
            torch.empty(2, device="meta").to(torch.device("cpu"))  # a device tensor copied to the host
    assert trap.calls == ["item", "tolist", "__bool__", "__int__", "__float__", "nonzero", "nonzero",
                          "where(condition)", "masked_select", "__index__", "cpu", "to('cpu')", "__bool__",
                          "to('cpu')"]


def test_static_runner_passes_read_nothing_on_the_host():
    model = llama()
    runner = StaticRunner(model, capacity=64)
    ids = torch.randint(0, 50, (30,), generator=torch.Generator().manual_seed(4))
    runner.forward(ids[:9])  # the prompt (growth, first buffers) is outside the trap
    tree = __import__("helpers").fixed_tree(50)
    with HostSyncs() as trap:
        for start, end in [(9, 10), (10, 15), (12, 13), (13, 17)]:
            runner.rollback(start)
            runner.forward(ids[start:end])
        tree_module.verify(runner, ids[17:18], tree)
        runner._compact_on_device(tree_module.keep_slots(17, [1, 5]))
        runner.forward(ids[20:21])
    assert trap.calls == [], f"host reads in the static runner's passes: {trap.calls}"


# --- the HF runner on transformers < 5.24 -------------------------------------------------------------------

def test_cache_argument_follows_the_version(monkeypatch):
    assert runners.cache_argument("5.17.0") == "past_key_values"
    assert runners.cache_argument("5.24.0") == runners.cache_argument("5.25.1") == "cache"
    monkeypatch.setattr(runners.transformers, "__version__", "5.17.0")
    assert HFRunner(llama()).cache_arg == "past_key_values"
    with pytest.raises(ValueError, match="cache_arg must be"):
        HFRunner(llama(), cache_arg="kv")


@pytest.mark.filterwarnings("ignore:`past_key_values` is deprecated:FutureWarning")
def test_hf_runner_before_5_24_equals_the_current_path(monkeypatch):
    model = llama()
    ids = torch.randint(0, 50, (40,), generator=torch.Generator().manual_seed(6))
    chunks = [(0, 7), (7, 10), (8, 13), (13, 14), (10, 25), (25, 40)]
    current, legacy = HFRunner(model, keep_hidden=True, cache_arg="cache"), HFRunner(model, keep_hidden=True,
                                                                                        cache_arg="past_key_values")
    for (_, _, a, ha), (_, _, b, hb) in zip(run_chunks(current, ids, chunks), run_chunks(legacy, ids, chunks)):
        torch.testing.assert_close(b, a, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(hb, ha, atol=1e-6, rtol=1e-6)
    tree = __import__("helpers").fixed_tree(50)
    for r in (current, legacy):
        r.reset()
        r.prefill(ids[:5])
    torch.testing.assert_close(tree_module.verify(legacy, ids[5:6], tree), tree_module.verify(current, ids[5:6], tree))
    target, draft = tiny_llama(0, layers=3, eos_token_id=None, window=128), tiny_llama(1, eos_token_id=None)
    prompt = torch.tensor([0, 3, 2, 4, 4, 1, 0, 3])
    want = target.generate(prompt.view(1, -1), max_new_tokens=24, min_new_tokens=24, do_sample=False)[0, 8:]
    monkeypatch.setattr(runners.transformers, "__version__", "5.17.0")  # what as_runner builds on such an image
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        gen = sr.speculative_generate(target, draft, prompt, max_new_tokens=24, lookahead=3, temperature=0)
        tree_gen = sr.speculative_generate(target, draft, prompt, max_new_tokens=24, lookahead=3, temperature=0,
                                           tree=sr.TreeSpec(2, 3))
    assert torch.equal(gen.tokens, want) and torch.equal(tree_gen.tokens, want)
