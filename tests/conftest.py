import pytest
import torch
from transformers import LlamaForCausalLM

from helpers import tiny_llama

# Tests run on 2 cores next to other work: one thread keeps timings of the suite predictable.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft): different random models over one 5-token vocabulary."""
    return tiny_llama(seed=0), tiny_llama(seed=1)


@pytest.fixture(scope="session")
def smollm():
    """The real offline target (converted once into SPECREPRO_HOME)."""
    import specrepro as sr

    return sr.load_model("smollm2-135m-instruct")


@pytest.fixture(scope="session")
def truncated_draft(smollm):
    """A real draft that agrees often enough to exercise both paths: the target's first 26 layers with its final norm and head (weights copied)."""
    target, _ = smollm
    config = target.config.to_dict()
    config["num_hidden_layers"] = 26
    draft = LlamaForCausalLM(type(target.config).from_dict(config)).eval()
    draft.load_state_dict(target.state_dict(), strict=False)
    return draft


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), keep together what must run in one
    process: the tests of a module that share a module- or class-scoped fixture (it is built once, not once
    per worker) and the cells of one notebook under nbval (one kernel runs them in order). Runs before
    xdist's own hook, which turns the marks into group names; without xdist the marks do nothing."""
    for item in items:
        if item.get_closest_marker("xdist_group"):
            continue
        if type(item).__module__.startswith("nbval"):  # a notebook cell: its notebook is the group
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
            continue
        info = getattr(item, "_fixtureinfo", None)
        defs = info.name2fixturedefs.values() if info is not None else ()
        if any(d[-1].scope in ("module", "class", "package") for d in defs if d):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
