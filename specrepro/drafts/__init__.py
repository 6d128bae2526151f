"""Draft strategies for speculative_generate, and the trained drafts (train / load)."""
from .base import Draft, ModelDraft, as_draft
from .datastore import Datastore, DatastoreDraft
from .feature import FeatureDraft
from .heads import HeadsDraft
from .hybrid import HybridDraft
from .lookup import LookupDraft
from .truncated import TruncatedDraft, truncated_model
from .small import SmallDraft
from .trainer import KINDS, load, train

__all__ = [
    "Draft", "ModelDraft", "as_draft", "LookupDraft", "Datastore", "DatastoreDraft", "TruncatedDraft", "truncated_model",
    "SmallDraft", "FeatureDraft", "HeadsDraft", "HybridDraft", "KINDS", "train", "load",
]
