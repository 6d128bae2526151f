"""specrepro: a reproduction of Chen et al. 2023, Accelerating LLM Decoding with Speculative Sampling.

Notation as in the paper: p = draft, q = target.
"""
from . import drafts
from .models import ModelLoadError, check_tokenizers, load_model, specrepro_home
from .sampling import SamplingConfig, logits_to_probs, sample
from .batch import speculative_generate_batch
from .lean import LeanRunner
from .runners import HFRunner
from .tree import TreeSpec
from .speculative import Generation, autoregressive_generate, rejection_step, speculative_generate, stop_at_text
from .tuning import Setting, tune

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
