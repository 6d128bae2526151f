"""specrepro: a reproduction of Chen et al. 2023, Accelerating LLM Decoding with Speculative Sampling.

Notation as in the paper: p = draft, q = target. The paper's algorithms are in specrepro.algorithm; the
layers, from the bottom: models and data files < engines (how a target pass runs) < algorithm < drafts <
generate (the entry points below) < stats < tuning < experiments < bench.
"""
from . import drafts
from .algorithm.batch import speculative_generate_batch
from .algorithm.sampling import SamplingConfig, logits_to_probs, sample
from .algorithm.speculative import Generation, rejection_step, stop_at_text
from .algorithm.tree import TreeSpec
from .engines.lean import LeanRunner
from .engines.runners import HFRunner
from .generate import autoregressive_generate, speculative_generate
from .models import ModelLoadError, check_tokenizers, load_model, specrepro_home


def __getattr__(name):
    # sr.tune and sr.Setting load specrepro.tuning.tune on first use, so that `python -m specrepro.tuning.tune` runs a
    # module the package has not already imported (runpy warns otherwise)
    if name in ("Setting", "tune"):
        from .tuning import tune as tuning

        return getattr(tuning, name)
    raise AttributeError(f"module 'specrepro' has no attribute {name!r}")


__all__ = [
    "Generation",
    "HFRunner",
    "LeanRunner",
    "ModelLoadError",
    "SamplingConfig",
    "Setting",
    "TreeSpec",
    "autoregressive_generate",
    "check_tokenizers",
    "drafts",
    "load_model",
    "logits_to_probs",
    "rejection_step",
    "sample",
    "specrepro_home",
    "speculative_generate",
    "speculative_generate_batch",
    "stop_at_text",
    "tune",
]
