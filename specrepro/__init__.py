"""specrepro: a reproduction of Chen et al. 2023, Accelerating LLM Decoding with Speculative Sampling.

Notation as in the paper: p = draft, q = target.
"""
from . import drafts
from .models import ModelLoadError, check_tokenizers, load_model, specrepro_home
from .sampling import SamplingConfig, logits_to_probs, sample
from .batch import speculative_generate_batch
from .engines.lean import LeanRunner
from .engines.runners import HFRunner
from .tree import TreeSpec
from .speculative import Generation, autoregressive_generate, rejection_step, speculative_generate, stop_at_text


def __getattr__(name):
    # sr.tune and sr.Setting load specrepro.engines.tuning on first use, so that `python -m specrepro.engines.tuning` runs a
    # module the package has not already imported (runpy warns otherwise)
    if name in ("Setting", "tune"):
        from .engines import tuning

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
