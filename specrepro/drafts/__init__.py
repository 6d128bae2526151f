"""Draft strategies for speculative_generate, and the trained drafts (train / load)."""
from .base import Draft, ModelDraft, as_draft
from .feature import FeatureDraft
from .heads import HeadsDraft
from .small import SmallDraft
from .trainer import KINDS, load, train

__all__ = ["Draft", "ModelDraft", "as_draft", "SmallDraft", "FeatureDraft", "HeadsDraft", "KINDS", "train", "load"]
