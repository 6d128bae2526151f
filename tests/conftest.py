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

